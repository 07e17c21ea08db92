"""`POST /v1/score`, a probe of the teacher: each response token's log-prob under the current policy, with the
hint spliced in as the judge does. The response is tokenized from text: this is a measurement, never training
data."""
from __future__ import annotations

from clawr1.chat import ChatRenderer, ChatTemplateError
from clawr1.gateway.errors import GatewayError, PromptLimits, engine_errors
from clawr1.gateway.openai_types import ScoreRequest, completion_id, tool_dicts
from clawr1.gateway.router import EngineRouter


class Scorer:
    def __init__(self, renderer: ChatRenderer, router: EngineRouter, limits: PromptLimits):
        self.renderer, self.router, self.limits = renderer, router, limits

    async def score(self, req: ScoreRequest) -> dict:
        """{"logprobs": one per response token, "tokens", "weight_version", "temperature"}."""
        tools = tool_dicts(req.tools)
        try:
            prompt = self.renderer.encode_messages([m.as_dict() for m in req.messages], tools=tools,
                                                   template_kwargs=req.chat_template_kwargs)
        except ChatTemplateError as e:
            raise GatewayError(400, str(e), code="chat_template_error") from None
        if req.hint:
            try:
                prompt = self.renderer.with_hint(prompt, req.hint)
            except ValueError as e:
                raise GatewayError(400, f"cannot place the hint: {e}") from None
        response = self.renderer.encode_text(req.response) + [self.renderer.turn_end_id]
        self.limits.check(prompt)
        key = f"score-{completion_id()}"
        with engine_errors():
            scored = await self.router.call(key, lambda e: e.score(prompt + response, first_scored=len(prompt),
                                                                   temperature=req.temperature))
        return {"logprobs": scored.prompt_logprobs, "tokens": len(response), "weight_version": scored.weight_version,
                "temperature": req.temperature}

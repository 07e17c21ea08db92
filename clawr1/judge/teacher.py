"""Teacher log-probs: the policy with the hint in its context, scored on the exact sampled response.

The hint is spliced into the recorded prompt ids by token operations: its
rendered tokens go right before the `<|im_end|>` that closes the last user
message. The response ids are appended untouched, so every teacher log-prob
lines up with a token the student actually sampled.
"""
from __future__ import annotations

from clawr1.gateway.chat_template import ChatRenderer
from clawr1.serving.client import EngineClient, Generation


def splice_hint(prompt_ids: list[int], hint_ids: list[int], user_header_ids: list[int], im_end_id: int) -> list[int]:
    """Insert `hint_ids` before the end of the last user message (or of the last message if none)."""
    n = len(user_header_ids)
    starts = [i for i in range(len(prompt_ids) - n + 1) if prompt_ids[i:i + n] == user_header_ids]
    search_from = starts[-1] + n if starts else 0
    ends = [i for i in range(search_from, len(prompt_ids)) if prompt_ids[i] == im_end_id]
    if not ends:
        raise ValueError("the prompt has no closed message to put the hint in")
    at = ends[0] if starts else ends[-1]
    return prompt_ids[:at] + hint_ids + prompt_ids[at:]


class Teacher:
    """Scores responses under hint-enhanced prompts on an engine (the serving policy or a frozen copy)."""

    def __init__(self, engine: EngineClient, renderer: ChatRenderer):
        self.engine = engine
        self.renderer = renderer
        self.user_header_ids = renderer.encode_text("<|im_start|>user\n")

    def teacher_prompt(self, prompt_ids: list[int], hint: str) -> list[int]:
        hint_ids = self.renderer.encode_text("\n" + hint)
        return splice_hint(prompt_ids, hint_ids, self.user_header_ids, self.renderer.im_end_id)

    async def score(self, prompt_ids: list[int], response_ids: list[int], hint: str, top_k: int = 0) -> Generation:
        """The teacher's log-prob of each response token (and its top-k at each position, if asked)."""
        prompt = self.teacher_prompt(prompt_ids, hint)
        result = await self.engine.score(prompt + response_ids, first_scored=len(prompt), top_k=top_k)
        if len(result.prompt_logprobs) != len(response_ids):
            raise RuntimeError(f"teacher returned {len(result.prompt_logprobs)} log-probs for {len(response_ids)} tokens")
        if top_k and len(result.prompt_top_ids) != len(response_ids):
            raise RuntimeError(f"teacher returned top-k for {len(result.prompt_top_ids)} of {len(response_ids)} tokens")
        return result

"""Teacher log-probs: the policy with the hint in its context, scored on the exact sampled response.

The hint is spliced into the recorded prompt ids by token operations: its
rendered tokens go right before the end-of-message token that closes the last
user message. The response ids are appended untouched, so every teacher log-prob
lines up with a token the student actually sampled. The teacher is scored at the
temperature the student sampled at when its engine can (the embedded engine);
otherwise (SGLang: raw logits) at 1, and the sample says which, so the trainer
compares the student at the same temperature.

With `algo.opd_baseline: teacher` the same teacher also scores the response
without the hint (the recorded prompt as it is): what the hint changes is the
difference. A frozen teacher's unhinted scores never change, so they are kept
per (prompt, response, temperature) in a bounded cache.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from clawr1.chat import ChatRenderer
from clawr1.engine_api.client import EngineClient, Generation


@dataclass
class TeacherScores:
    generation: Generation  # .prompt_logprobs: one per response token; .prompt_top_*: top-k rows, if asked
    temperature: float  # what the log-probs were taken at


class Teacher:
    """Scores responses under hint-enhanced prompts on an engine (the serving policy or a frozen copy)."""

    def __init__(self, engine: EngineClient, renderer: ChatRenderer, unhinted_cache_size: int = 0):
        self.engine = engine
        self.renderer = renderer
        self._tempered: Optional[bool] = None  # whether the engine scores at a temperature (asked once)
        self.unhinted_cache: OrderedDict[tuple, list[float]] = OrderedDict()
        self.unhinted_cache_size = unhinted_cache_size  # 0: no cache (a teacher whose weights move)
        self.unhinted_cache_hits = 0

    def teacher_prompt(self, prompt_ids: list[int], hint: str) -> list[int]:
        return self.renderer.with_hint(prompt_ids, hint)

    async def can_temper(self) -> bool:
        if self._tempered is None:
            self._tempered = bool((await self.engine.model_info()).get("input_logprob_temperature"))
        return self._tempered

    async def score(self, prompt_ids: list[int], response_ids: list[int], hint: str, top_k: int = 0,
                    temperature: float = 1.0) -> TeacherScores:
        """The teacher's log-prob of each response token (and its top-k at each position, if asked), at the
        student's sampling `temperature` when the engine can."""
        prompt = self.teacher_prompt(prompt_ids, hint)
        temperature = temperature if await self.can_temper() else 1.0
        result = await self.engine.score(prompt + response_ids, first_scored=len(prompt), top_k=top_k,
                                         temperature=temperature)
        if len(result.prompt_logprobs) != len(response_ids):
            raise RuntimeError(f"teacher returned {len(result.prompt_logprobs)} log-probs for {len(response_ids)} tokens")
        if top_k and len(result.prompt_top_ids) != len(response_ids):
            raise RuntimeError(f"teacher returned top-k for {len(result.prompt_top_ids)} of {len(response_ids)} tokens")
        return TeacherScores(result, temperature)

    async def score_unhinted(self, prompt_ids: list[int], response_ids: list[int], temperature: float) -> list[float]:
        """The teacher's log-prob of each response token under the recorded prompt, without a hint, at the
        temperature `score` used (`TeacherScores.temperature`)."""
        key = (tuple(prompt_ids), tuple(response_ids), temperature)
        if key in self.unhinted_cache:
            self.unhinted_cache.move_to_end(key)
            self.unhinted_cache_hits += 1
            return self.unhinted_cache[key]
        result = await self.engine.score(prompt_ids + response_ids, first_scored=len(prompt_ids), temperature=temperature)
        if len(result.prompt_logprobs) != len(response_ids):
            raise RuntimeError(f"teacher returned {len(result.prompt_logprobs)} log-probs for {len(response_ids)} tokens")
        if self.unhinted_cache_size:
            self.unhinted_cache[key] = result.prompt_logprobs
            if len(self.unhinted_cache) > self.unhinted_cache_size:
                self.unhinted_cache.popitem(last=False)
        return result.prompt_logprobs

"""The tiny model's warm-start data (`model.tiny.warm_start`): the personal env's conversations, and a
small share of the learnable tool-call tasks' solved episodes, so the base model makes well-formed tool
calls some of the time, not reliably: something for RL on envs/toolcall's learnable set to improve."""
from __future__ import annotations

import random

from envs.personal.warmstart import conversations as personal_conversations
from envs.toolcall.learnable import warmstart_conversations as tool_conversations

TOOL_SHARE = 0.15


def conversations(n: int, seed: int) -> list[tuple[list[dict], list[dict] | None]]:
    """`n` (messages, tools) conversations in a seeded shuffle; only the learnable set's train split."""
    n_tool = round(n * TOOL_SHARE)
    mixed = personal_conversations(n - n_tool, seed) + tool_conversations(n_tool, seed)
    random.Random(f"warm-start-mix-{seed}").shuffle(mixed)
    return mixed


def tool_heavy_conversations(n: int, seed: int) -> list[tuple[list[dict], list[dict] | None]]:
    """The same mix with 40% learnable tool-call episodes, for recipes/toolcall's own tiny model (2,700 steps).
    Its calls are well formed, but it rarely copies the question's numbers into them (it writes the calls it
    saw most, like "5 * 1000"): held-out pass@1 about 0.01, which is what RL on the set has to raise."""
    n_tool = round(n * 0.4)
    mixed = personal_conversations(n - n_tool, seed) + tool_conversations(n_tool, seed)
    random.Random(f"warm-start-mix-{seed}").shuffle(mixed)
    return mixed

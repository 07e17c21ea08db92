"""The tiny model's warm-start data (`model.tiny.warm_start`): the personal env's conversations, and a
small share of the learnable tool-call tasks' solved episodes (train split only), so the base model makes
the right call some of the time, not reliably: held-out pass@1 about 0.30 (recipes/toolcall), which RL on
envs/toolcall's learnable set raises."""
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


"""Small addition word problems with units; a fixed split keeps held-out questions unseen."""
from __future__ import annotations

import random

from envs.personal.preferences import UNIT_WORDS, Question

TRAIN_TEMPLATES = (
    "What is {a} {u} plus {b} {u}?",
    "A path is {a} {u} and then {b} {u} more. How far in total?",
    "I have {a} {u} and get {b} {u} more. How much do I have?",
    "Add {a} {u} and {b} {u}.",
    "How much is {a} {u} and {b} {u} together?",
    "A box holds {a} {u} and another holds {b} {u}. What is the total?",
)
HELDOUT_TEMPLATES = (
    "What do {a} {u} and {b} {u} make?",
    "If you combine {a} {u} with {b} {u}, what do you get?",
)
UNITS = tuple(UNIT_WORDS)


def _question(rng: random.Random, templates: tuple[str, ...], lo: int, hi: int) -> Question:
    a, b, unit = rng.randint(lo, hi), rng.randint(lo, hi), rng.choice(UNITS)
    return Question(rng.choice(templates).format(a=a, b=b, u=unit), a, b, unit)


def train_question(rng: random.Random) -> Question:
    """A question for RL training episodes."""
    return _question(rng, TRAIN_TEMPLATES, 1, 30)


def warmstart_question(rng: random.Random) -> Question:
    """A question for the tiny model's supervised warm start: train templates, the full number range."""
    return _question(rng, TRAIN_TEMPLATES, 1, 60)


def heldout_questions(n: int, seed: int = 0) -> list[Question]:
    """Questions never trained on: other templates, numbers outside the RL range."""
    rng = random.Random(10_000 + seed)
    return [_question(rng, HELDOUT_TEMPLATES, 31, 60) for _ in range(n)]

"""PRM votes and hints: prompts, parsing, majority and hint selection. Pure functions, no I/O.

An evaluation vote ends with `\\boxed{1}` (the turn was good), `\\boxed{-1}` (bad)
or `\\boxed{0}` (cannot tell). A hint vote ends with `\\boxed{1}` and a hint
between `[HINT_START]` and `[HINT_END]` when what followed says how the turn
should have been done, else `\\boxed{-1}`. Anything else is an abstention.
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from typing import Optional

_BOXED = re.compile(r"\\boxed\{\s*([+-]?\d+)\s*\}")
_HINT = re.compile(r"\[HINT_START\](.*?)\[HINT_END\]", re.S)

EVAL_SYSTEM = ("You judge one turn of an AI assistant from what happened next. Read the recent conversation, "
               "the assistant's turn, and what followed it. Reply with a short reason, then \\boxed{1} if the turn "
               "was good, \\boxed{-1} if it was bad, or \\boxed{0} if you cannot tell.")
HINT_SYSTEM = ("You read what followed one turn of an AI assistant and decide whether it says how the turn should "
               "have been done. If it does, reply \\boxed{1} and the instruction the assistant should have followed, "
               "in one or two sentences, between [HINT_START] and [HINT_END]. If it does not, reply \\boxed{-1}.")


@dataclass
class Vote:
    score: Optional[int]  # None: abstained (unparsable)
    hint: str = ""


def parse_eval(text: str) -> Vote:
    """The last \\boxed{} value if it is -1, 0 or 1; otherwise an abstention."""
    found = _BOXED.findall(text or "")
    value = int(found[-1]) if found else None
    return Vote(value if value in (-1, 0, 1) else None)


def parse_hint(text: str, min_chars: int = 10) -> Vote:
    """+1 with a non-trivial hint, -1 (no hint), or an abstention when neither parses."""
    vote = parse_eval(text)
    if vote.score == 1:
        hints = [h.strip() for h in _HINT.findall(text or "")]
        hint = hints[-1] if hints else ""
        return Vote(1, hint) if len(hint) >= min_chars else Vote(None)
    return Vote(-1) if vote.score in (-1, 0) else Vote(None)


def majority(votes: list[Vote]) -> Optional[int]:
    """The most common of +1/-1/0 among non-abstaining votes; a tie for the top is 0; no votes: None."""
    counts = Counter(v.score for v in votes if v.score is not None)
    if not counts:
        return None
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        return 0
    return ranked[0][0]


def agreement(votes: list[Vote], decision: Optional[int]) -> float:
    """Share of non-abstaining votes that agree with the decision."""
    cast = [v.score for v in votes if v.score is not None]
    return sum(s == decision for s in cast) / len(cast) if cast and decision is not None else 0.0


def best_hint(votes: list[Vote]) -> str:
    """The most informative accepted hint: the longest one voted +1 (the first on a tie); '' if none."""
    accepted = [v.hint for v in votes if v.score == 1 and v.hint]
    return max(accepted, key=len) if accepted else ""


def render_context(messages: list[dict], response: str, next_role: str, next_text: str, last_k: int) -> str:
    """The judge's view of a turn: the last k messages before it, the turn, and what followed."""
    recent = [m for m in messages if m.get("role") != "system"][-last_k:]
    lines = [f"[{m.get('role')}] {m.get('content') or ''}" for m in recent]
    return ("Recent conversation:\n" + "\n".join(lines) + f"\n\nThe assistant's turn:\n{response}\n\n"
            f"What followed (from the {next_role}):\n{next_text}")

"""Corrections mapped to the options a run's users can ask for (`judge.rules_hint: directive`).

OpenClaw-RL's judge writes the hint in its own words, a concise directive, rather than passing the user's
sentence on. The rules judge does the same with no model: each option it is configured with
(`judge.directives`, filled by the environment's recipes; the judge never imports an environment) has a
directive and patterns. Each clause of a correction (its sentences, split at commas, semicolons and "and", so
that "do not explain, just answer and end with ..." does not read as "do not ... end") asks for the option of
each kind with the most matching patterns (the first listed on a tie); the hint is those options' directives as one request,
"Please <directive>, <directive> and <directive>.". A correction that names no configured option gives none.

The same map draws wrong hints that contradict (`judge.hint_noise_kind: contradict`): each wish a hint names
replaced by another option of its kind, one the user did not ask for.
"""
from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Optional, Sequence

from clawr1.config import DirectiveOption
from clawr1.judge.rules import sentences


_CLAUSE_BREAK = re.compile(r",\s*|;\s*|\s+and\s+")


@dataclass(frozen=True)
class Wish:
    kind: str
    option: str
    directive: str


class DirectiveMap:
    """The configured options, by kind, each with its compiled patterns."""

    def __init__(self, options: Sequence[DirectiveOption]):
        self.by_kind: dict[str, list[tuple[Wish, list[re.Pattern]]]] = {}
        for o in options:
            self.by_kind.setdefault(o.kind, []).append(
                (Wish(o.kind, o.option, o.directive), [re.compile(p, re.I) for p in o.patterns]))

    def wishes(self, text: str) -> list[Wish]:
        """The options `text` asks for, one per kind at most (a later clause overrides an earlier one), in the
        order their kinds are first named."""
        found: dict[str, Wish] = {}
        for clause in (c for s in sentences(text) for c in _CLAUSE_BREAK.split(s) if c.strip()):
            for kind, options in self.by_kind.items():
                counts = [sum(bool(p.search(clause)) for p in patterns) for _, patterns in options]
                best = max(counts)
                if best:
                    found[kind] = options[counts.index(best)][0]
        return list(found.values())

    def hint(self, text: str) -> str:
        """The directive hint for what `text` asks for; "" when it names no configured option."""
        return request(self.wishes(text))

    def contradict(self, hint: str, rng: random.Random) -> Optional[str]:
        """A hint asking, for each wish `hint` names, for another option of the same kind (drawn by `rng`);
        None when it names no configured option, or no kind it names has another option."""
        wrong = []
        for wish in self.wishes(hint):
            others = [w for w, _ in self.by_kind[wish.kind] if w.option != wish.option]
            if others:
                wrong.append(rng.choice(others))
        return request(wrong) or None


def request(wishes: Sequence[Wish]) -> str:
    """'Please a.', 'Please a and b.', 'Please a, b and c.' ("" for none)."""
    parts = [w.directive for w in wishes]
    if not parts:
        return ""
    body = parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]
    return f"Please {body}."

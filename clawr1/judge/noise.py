"""A deliberately imperfect judge, to compare objectives at the accuracies real PRMs have, in both channels:

- scores (judge.score_noise, judge.score_abstain): a score is flipped with probability `noise`, or replaced
  by 0 (an abstention) with probability `abstain`;
- hints (judge.hint_noise, judge.hint_drop): a hint is lost with probability `drop`, or, with probability
  `noise`, replaced by a wrong one. What is wrong (judge.hint_noise_kind):
  - swap: another hint the judge extracted recently that differs from it (whatever this run's users asked for;
    in a one-user run, another of the same user's true wishes, so not always wrong);
  - contradict: each wish the hint names replaced by another option of its kind, one the user did not ask for
    (clawr1/judge/directives.py).
"""
from __future__ import annotations

import random
from collections import deque
from typing import Callable, Optional

Contradict = Callable[[str, random.Random], Optional[str]]  # a hint -> one asking for other options (None: cannot)


def noisy_score(score: Optional[float], noise: float, abstain: float, rng: random.Random) -> Optional[float]:
    """The score a judge of this error rate reports (None, no score, stays None)."""
    if score is None:
        return None
    draw = rng.random()
    if draw < abstain:
        return 0.0
    if draw < abstain + noise:
        return -score
    return score


class HintNoise:
    """Drops or spoils hints at the configured rates. Without `contradict` it swaps in one of the last `memory`
    distinct true hints it met (each remembered from its first sighting); with it, the contradicting hint."""

    def __init__(self, noise: float, drop: float, rng: random.Random, memory: int = 64,
                 contradict: Optional[Contradict] = None):
        self.noise, self.drop, self.rng, self.contradict = noise, drop, rng, contradict
        self.recent: deque[str] = deque(maxlen=memory)

    def apply(self, hint: str) -> tuple[str, str]:
        """(the hint the judge reports, what happened: "kept" | "dropped" | "wrong" | "no_wrong_one")."""
        others = [h for h in self.recent if h != hint]
        if hint not in self.recent:
            self.recent.append(hint)
        draw = self.rng.random()
        if draw < self.drop:
            return "", "dropped"
        if draw < self.drop + self.noise:
            if self.contradict is not None:
                wrong = self.contradict(hint, self.rng)
                return (wrong, "wrong") if wrong else (hint, "no_wrong_one")
            if not others:  # nothing plausible to confuse it with yet: the true hint goes through, counted
                return hint, "no_wrong_one"
            return self.rng.choice(others), "wrong"
        return hint, "kept"

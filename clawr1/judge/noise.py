"""A deliberately imperfect judge, to compare objectives at the accuracies real PRMs have, in both channels:

- scores (judge.score_noise, judge.score_abstain): a score is flipped with probability `noise`, or replaced
  by 0 (an abstention) with probability `abstain`;
- hints (judge.hint_noise, judge.hint_drop): a hint is lost with probability `drop`, or, with probability
  `noise`, replaced by a plausible wrong one: another hint the judge extracted recently that differs from it
  (another preference's directive, another option of the same kind: whatever this run's users asked for).
"""
from __future__ import annotations

import random
from collections import deque
from typing import Optional


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
    """Drops or swaps hints at the configured rates; swaps in one of the last `memory` distinct true hints it met
    (each remembered from its first sighting)."""

    def __init__(self, noise: float, drop: float, rng: random.Random, memory: int = 64):
        self.noise, self.drop, self.rng = noise, drop, rng
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
            if not others:  # nothing plausible to confuse it with yet: the true hint goes through, counted
                return hint, "no_wrong_one"
            return self.rng.choice(others), "wrong"
        return hint, "kept"

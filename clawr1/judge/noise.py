"""A deliberately imperfect judge (judge.score_noise, judge.score_abstain), to compare objectives at the
accuracies real PRMs have: a score is flipped with probability `noise`, or replaced by 0 (an abstention)
with probability `abstain`. Hints are left as the user wrote them."""
from __future__ import annotations

import random
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

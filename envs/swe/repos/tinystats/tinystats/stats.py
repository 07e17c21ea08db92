"""Descriptive statistics of a sequence of numbers."""
from __future__ import annotations

import math
from typing import Sequence


def _require(values: Sequence[float], at_least: int = 1) -> None:
    if len(values) < at_least:
        raise ValueError(f"need at least {at_least} value(s), got {len(values)}")


def mean(values: Sequence[float]) -> float:
    _require(values)
    return sum(values) / len(values)


def median(values: Sequence[float]) -> float:
    """The middle value; the mean of the two middle values for an even count."""
    _require(values)
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def mode(values: Sequence[float]) -> float:
    """The most frequent value; the smallest of them on a tie."""
    _require(values)
    counts: dict[float, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    best = max(counts.values())
    return min(value for value, count in counts.items() if count == best)


def variance(values: Sequence[float], sample: bool = True) -> float:
    """The sample variance (n - 1 in the denominator), or the population variance."""
    _require(values, 2 if sample else 1)
    centre = mean(values)
    squares = sum((value - centre) ** 2 for value in values)
    return squares / (len(values) - 1 if sample else len(values))


def stdev(values: Sequence[float], sample: bool = True) -> float:
    return math.sqrt(variance(values, sample))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 <= q <= 100) with linear interpolation between closest ranks."""
    _require(values)
    if not 0 <= q <= 100:
        raise ValueError(f"q must be within [0, 100], got {q}")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)

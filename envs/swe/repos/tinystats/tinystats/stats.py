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


def quantiles(values: Sequence[float], n: int = 4) -> list[float]:
    """The n - 1 cut points that split the data into `n` equal groups (quartiles by default), as `percentile` does."""
    if n < 2:
        raise ValueError(f"n must be at least 2, got {n}")
    return [percentile(values, 100 * k / n) for k in range(1, n)]


def interquartile_range(values: Sequence[float]) -> float:
    low, _, high = quantiles(values, 4)
    return high - low


def histogram(values: Sequence[float], bins: int, low: float | None = None,
              high: float | None = None) -> list[int]:
    """Counts of the values in `bins` equal-width bins over [low, high] (the data's range by default).

    Each bin holds its lower edge; the last bin holds `high` too. Values outside [low, high] are not counted.
    """
    _require(values)
    if bins < 1:
        raise ValueError(f"bins must be at least 1, got {bins}")
    low = min(values) if low is None else low
    high = max(values) if high is None else high
    if high < low:
        raise ValueError(f"high {high} is below low {low}")
    counts = [0] * bins
    width = (high - low) / bins
    for value in values:
        if low <= value <= high:
            index = bins - 1 if width == 0 else min(int((value - low) / width), bins - 1)
            counts[index] += 1
    return counts


def moving_average(values: Sequence[float], window: int) -> list[float]:
    """The mean of every run of `window` consecutive values (len(values) - window + 1 of them)."""
    if window < 1:
        raise ValueError(f"window must be at least 1, got {window}")
    return [sum(values[i:i + window]) / window for i in range(len(values) - window + 1)]


def covariance(xs: Sequence[float], ys: Sequence[float], sample: bool = True) -> float:
    """The sample covariance (n - 1 in the denominator), or the population covariance."""
    if len(xs) != len(ys):
        raise ValueError(f"xs has {len(xs)} values, ys {len(ys)}")
    _require(xs, 2 if sample else 1)
    x_centre, y_centre = mean(xs), mean(ys)
    products = sum((x - x_centre) * (y - y_centre) for x, y in zip(xs, ys))
    return products / (len(xs) - 1 if sample else len(xs))


def correlation(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson's correlation coefficient, in [-1, 1]; ValueError when either sequence is constant."""
    spread = math.sqrt(covariance(xs, xs) * covariance(ys, ys))
    if spread == 0:
        raise ValueError("correlation is undefined for a constant sequence")
    return covariance(xs, ys) / spread

"""The statistics the benchmarks report: sample standard deviation and a paired bootstrap interval."""
from __future__ import annotations

import random
import statistics


def sample_std(values: list[float]) -> float:
    """Standard deviation with n - 1 in the denominator (0 for a single value)."""
    return statistics.stdev(values) if len(values) > 1 else 0.0


def mean_std(values: list[float]) -> dict:
    """The sweeps' summary of runs: mean, population std (as their earlier results were reported), the values."""
    return {"mean": round(statistics.fmean(values), 4), "std": round(statistics.pstdev(values), 4),
            "runs": [round(v, 4) for v in values]}


def paired_bootstrap(a: list[float], b: list[float], resamples: int = 10_000, level: float = 0.95,
                     seed: int = 0) -> tuple[float, float, float]:
    """Mean of a - b over pairs, and a percentile bootstrap interval of it: pairs (same user, same seed) are
    resampled together, so what the pairs share (a hard user, a lucky seed) cancels."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired bootstrap needs two non-empty lists of equal length, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(diffs, k=len(diffs))) for _ in range(resamples))
    tail = (1 - level) / 2
    return statistics.fmean(diffs), means[int(tail * resamples)], means[min(int((1 - tail) * resamples), resamples - 1)]

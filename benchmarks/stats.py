"""The statistics the benchmarks report: sample standard deviation, paired bootstrap and t-intervals, Holm's
correction (Student's t from its incomplete beta function: the project does not depend on scipy)."""
from __future__ import annotations

import math
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


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction (Lentz's method)."""
    if x <= 0.0 or x >= 1.0:
        return 0.0 if x <= 0.0 else 1.0
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast only below the mean: use the symmetry
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The t with P(T <= t) = p (0 < p < 1), by bisection on t_cdf."""
    lo, hi = -1e3, 1e3
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < p else (lo, mid)
    return (lo + hi) / 2


def paired_t(a: list[float], b: list[float], level: float = 0.95) -> tuple[float, float, float, float]:
    """Mean of a - b over pairs, its t-interval at `level` (sample std, n - 1 degrees of freedom) and the
    two-sided p-value of no difference. Needs two pairs or more; pairs that all differ alike give p 0 or 1."""
    if len(a) != len(b) or len(a) < 2:
        raise ValueError(f"a paired t-interval needs two lists of equal length >= 2, got {len(a)} and {len(b)}")
    diffs = [x - y for x, y in zip(a, b)]
    n, mean, sd = len(diffs), statistics.fmean(diffs), statistics.stdev(diffs)
    if sd == 0.0:
        return mean, mean, mean, 1.0 if mean == 0.0 else 0.0
    se = sd / math.sqrt(n)
    half = t_quantile(0.5 + level / 2, n - 1) * se
    return mean, mean - half, mean + half, 2 * t_cdf(-abs(mean) / se, n - 1)


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given: reject where the adjusted p < alpha keeps the
    chance of any false rejection among all the comparisons below alpha."""
    m = len(p_values)
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(sorted(range(m), key=lambda i: p_values[i])):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted

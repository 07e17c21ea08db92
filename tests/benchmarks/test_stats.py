"""The benchmark's statistics on hand-made numbers."""
from __future__ import annotations

import math
import statistics

import pytest
import torch

from benchmarks.stats import holm, paired_bootstrap, paired_t, sample_std, t_cdf, t_quantile
from tests.numerics import assert_close


def test_sample_std_divides_by_n_minus_one():
    # float64: mean, squares, a sum, a division, a square root, and the literal's rounding
    assert_close(sample_std([1.0, 3.0]), 2 ** 0.5, torch.float64, 6)  # population std would say 1.0
    assert sample_std([0.4]) == 0.0


def test_pairing_cancels_what_the_pairs_share():
    hard_and_easy = [0.1, 0.9, 0.2, 0.8, 0.5, 0.3]  # users differ a lot
    better = [x + 0.05 for x in hard_and_easy]
    mean, lo, hi = paired_bootstrap(better, hard_and_easy)
    # x + 0.05 - x rounds at x's magnitude (up to 0.95), then means of six (a sum of six, a division)
    assert_close([mean, lo, hi], [0.05] * 3, torch.float64, 2 + 7, 0.95)
    # unpaired, the same gap would be lost in the users' spread
    assert statistics.stdev(hard_and_easy) > 0.3


def test_interval_covers_zero_when_neither_side_leads_and_not_when_one_does():
    a = [0.50, 0.62, 0.41, 0.55, 0.47, 0.58, 0.44, 0.60]
    tied = [0.52, 0.60, 0.43, 0.53, 0.49, 0.56, 0.46, 0.58]  # differences alternate in sign
    _, lo, hi = paired_bootstrap(a, tied)
    assert lo < 0 < hi
    ahead = [x - 0.1 + 0.02 * (i % 2) for i, x in enumerate(a)]
    mean, lo, hi = paired_bootstrap(a, ahead)
    assert 0 < lo <= mean <= hi
    assert_close(mean, 0.09, torch.float64, 2 + 9, 0.62)  # differences at the inputs' magnitude, a mean of eight
    assert paired_bootstrap(a, ahead, seed=1)[1] > 0  # not one lucky resampling


def test_pairs_must_match():
    with pytest.raises(ValueError, match="equal length"):
        paired_bootstrap([0.1, 0.2], [0.1])


# The t-distribution's functions: a continued fraction that stops once a step changes it by under 1e-15 (about 5
# float64 eps), after at most a few hundred roundings; 1,000 eps at the value's magnitude bounds both.
T_DEPTH = 1000
EPS = torch.finfo(torch.float64).eps


def test_t_cdf_matches_the_closed_forms_of_one_and_two_degrees_of_freedom():
    for t in (-30.0, -3.0, -0.5, 0.0, 0.7, 2.5, 12.0):
        assert_close(t_cdf(t, 1), 0.5 + math.atan(t) / math.pi, torch.float64, T_DEPTH, 1.0)  # Cauchy
        assert_close(t_cdf(t, 2), 0.5 + t / (2 * math.sqrt(2 + t * t)), torch.float64, T_DEPTH, 1.0)
    assert t_cdf(1.0, 5) > t_cdf(1.0, 1)  # more degrees of freedom: thinner tails


def t2_quantile(p: float) -> float:
    """Student's t with 2 degrees of freedom has a closed-form inverse."""
    return (2 * p - 1) / math.sqrt(2 * p * (1 - p))


def t2_density(t: float) -> float:
    return (2 + t * t) ** -1.5


def quantile_bound(density: float, magnitude: float) -> float:
    """How far an inverse found by bisection may sit from the exact one: the cdf's error divided by the density
    there, plus the rounding of the value itself."""
    return T_DEPTH * EPS / density + 4 * EPS * magnitude


def test_t_quantile_inverts_the_cdf_of_one_and_two_degrees_of_freedom():
    for p in (0.6, 0.9, 0.975, 0.995):
        exact1 = math.tan(math.pi * (p - 0.5))
        assert abs(t_quantile(p, 1) - exact1) <= quantile_bound(1 / (math.pi * (1 + exact1 ** 2)), abs(exact1))
        exact2 = t2_quantile(p)
        assert abs(t_quantile(p, 2) - exact2) <= quantile_bound(t2_density(exact2), exact2)
    assert t_quantile(0.975, 30) < t_quantile(0.975, 3)  # more degrees of freedom: a narrower interval


def test_paired_t_interval_and_p_on_hand_numbers():
    a, b = [1.0, 2.0, 3.0], [0.5, 1.9, 2.0]  # differences 0.5, 0.1, 1.0: 2 degrees of freedom
    mean, lo, hi, p = paired_t(a, b)
    se = statistics.stdev([0.5, 0.1, 1.0]) / math.sqrt(3)
    assert_close(mean, 1.6 / 3, torch.float64, 8)
    half, exact = (hi - lo) / 2, t2_quantile(0.975) * se
    # the quantile's own bound, scaled by se, and a few roundings of the product and the differences
    assert abs(half - exact) <= quantile_bound(t2_density(t2_quantile(0.975)), 1.0) * se + 8 * EPS * exact
    # p from the t-statistic by the cdf's closed form for 2 degrees of freedom
    t = mean / se
    assert_close(p, 1 - t / math.sqrt(2 + t * t), torch.float64, T_DEPTH, 1.0)
    assert lo < 0 < hi and p > 0.05  # a 95% interval that holds 0 and a p above 0.05 agree
    assert paired_t([1.0, 2.0], [0.0, 1.0])[3] == 0.0  # every pair differs alike: no doubt left
    with pytest.raises(ValueError, match="equal length >= 2"):
        paired_t([1.0], [0.0])


def test_holm_multiplies_the_smallest_p_by_all_and_keeps_the_order():
    # one product each, and the literals' rounding
    assert_close(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02], torch.float64, 3)
    assert holm([0.5, 0.9]) == [1.0, 1.0] and holm([]) == []  # capped at 1, never below an earlier step

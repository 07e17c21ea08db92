"""The benchmark's statistics on hand-made numbers."""
from __future__ import annotations

import statistics

import pytest
import torch

from benchmarks.stats import paired_bootstrap, sample_std
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

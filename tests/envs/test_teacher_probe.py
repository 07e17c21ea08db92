"""The teacher probe's math on hand-built cases."""
import torch

from envs.personal.teacher_probe import auc, uptake
from tests.numerics import assert_close

PROFILE = {"format": "tags", "closing": "none"}


def test_auc_by_hand():
    assert auc([3, 2, 1, 0], [True, True, False, False]) == 1.0
    assert auc([0, 1, 2, 3], [True, True, False, False]) == 0.0  # inverted
    assert auc([1, 1], [True, False]) == 0.5  # a tie counts half
    # wins over pairs: a sum of halves and ones (exact), one float64 division
    assert_close(auc([2, 0, 1], [True, False, True]), 1.0, torch.float64, 1)
    assert_close(auc([2, 1, 0, 3], [True, False, True, False]), 0.25, torch.float64, 1)  # 2>1 wins; 2<3, 0<1, 0<3 lose
    assert auc([1, 2], [True, True]) is None  # one class only


def test_uptake_is_the_hinted_rate_minus_the_plain_rate():
    plain = ["7 km", "<ans>7 km</ans> Hope this helps!", "7 km", "7 km"]  # tags 1/4, no closing 3/4
    hinted = ["<ans>7 km</ans>", "<ans>7 km</ans>", "<ans>7 km</ans> Hope this helps!", "7 km"]  # tags 3/4, closing 3/4
    out = uptake(plain, hinted, PROFILE)
    # rates of four (one float64 division each) and their difference, at magnitude 1
    assert_close([out["uptake_format"], out["hinted_format"], out["uptake_closing"]], [0.5, 0.75, 0.0],
                 torch.float64, 3, 1.0)

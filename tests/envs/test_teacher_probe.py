"""The teacher probe's math on hand-built cases."""
import pytest

from envs.personal.teacher_probe import auc, uptake

PROFILE = {"format": "tags", "closing": "none"}


def test_auc_by_hand():
    assert auc([3, 2, 1, 0], [True, True, False, False]) == 1.0
    assert auc([0, 1, 2, 3], [True, True, False, False]) == 0.0  # inverted
    assert auc([1, 1], [True, False]) == 0.5  # a tie counts half
    assert auc([2, 0, 1], [True, False, True]) == pytest.approx(1.0)
    assert auc([2, 1, 0, 3], [True, False, True, False]) == pytest.approx(0.25)  # pairs: 2>1 wins; 2<3, 0<1, 0<3 lose
    assert auc([1, 2], [True, True]) is None  # one class only


def test_uptake_is_the_hinted_rate_minus_the_plain_rate():
    plain = ["7 km", "<ans>7 km</ans> Hope this helps!", "7 km", "7 km"]  # tags 1/4, no closing 3/4
    hinted = ["<ans>7 km</ans>", "<ans>7 km</ans>", "<ans>7 km</ans> Hope this helps!", "7 km"]  # tags 3/4, closing 3/4
    out = uptake(plain, hinted, PROFILE)
    assert out["uptake_format"] == pytest.approx(0.5) and out["hinted_format"] == pytest.approx(0.75)
    assert out["uptake_closing"] == pytest.approx(0.0)

"""The float comparison helper accepts fp32 rounding in another order and refuses real defects."""
from __future__ import annotations

import math

import pytest
import torch

from tests.numerics import assert_as_exact_as, assert_close

TERMS, ROWS = 10_000, 8


def pairwise_sum(x: torch.Tensor) -> torch.Tensor:
    """Sums the last dimension in pairs, level by level, in x's dtype: ceil(log2 n) roundings along any path."""
    while x.shape[-1] > 1:
        if x.shape[-1] % 2:
            x = torch.cat([x, torch.zeros_like(x[..., :1])], dim=-1)
        x = x[..., 0::2] + x[..., 1::2]
    return x[..., 0]


@pytest.fixture(scope="module")
def terms() -> torch.Tensor:
    # terms in [1, 2): each is far above the bound below, so dropping any one of them is a visible defect
    return 1.0 + torch.rand(ROWS, TERMS, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def sums(terms) -> dict:
    order = torch.randperm(TERMS, generator=torch.Generator().manual_seed(1))
    return {"honest": pairwise_sum(terms), "reordered": pairwise_sum(terms[:, order]),
            "exact": terms.double().sum(dim=-1)}


# Higham's bound for a pairwise sum: ceil(log2 n) roundings per side, at the magnitude sum|x| of the terms
DEPTH = 2 * math.ceil(math.log2(TERMS))


def magnitude(terms) -> float:
    return float(terms.abs().sum(dim=-1).max())


def test_a_reordered_fp32_sum_of_10000_terms_is_accepted(terms, sums):
    assert not torch.equal(sums["reordered"], sums["honest"])  # the order changed the rounding
    assert_close(sums["reordered"], sums["honest"], torch.float32, DEPTH, magnitude(terms))
    assert_as_exact_as(sums["reordered"], sums["exact"], sums["honest"])


def defects(terms, sums) -> dict:
    order = torch.randperm(TERMS, generator=torch.Generator().manual_seed(1))
    swapped = sums["reordered"].clone()
    swapped[[2, 5]] = swapped[[5, 2]]
    return {"a dropped term": pairwise_sum(terms[:, order][:, 1:]),
            "a scale off by 1e-4": sums["reordered"] * (1 + 1e-4),
            "a swapped row": swapped}


@pytest.mark.parametrize("defect", ["a dropped term", "a scale off by 1e-4", "a swapped row"])
def test_a_real_defect_is_refused_by_both_comparisons(terms, sums, defect):
    wrong = defects(terms, sums)[defect]
    with pytest.raises(AssertionError):
        assert_close(wrong, sums["honest"], torch.float32, DEPTH, magnitude(terms))
    with pytest.raises(AssertionError):
        assert_as_exact_as(wrong, sums["exact"], sums["honest"])


def test_the_bound_is_the_stated_one_not_a_fitted_one():
    """The atol is depth * eps * magnitude: one eps more than allowed fails, the allowed gap passes."""
    eps = torch.finfo(torch.float32).eps
    expected = torch.tensor([4.0, -2.0])
    assert_close(expected + torch.tensor([3 * eps * 4.0, 0.0]), expected, torch.float32, depth=3)
    with pytest.raises(AssertionError):
        assert_close(expected + torch.tensor([0.0, 4 * eps * 4.0]), expected, torch.float32, depth=3)
    with pytest.raises(AssertionError):
        assert_close(torch.tensor([float("nan"), -2.0]), expected, torch.float32, depth=3)

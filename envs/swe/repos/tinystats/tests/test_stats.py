import math

import pytest

from tinystats import mean, median, mode, percentile, stdev, variance


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


def test_median_odd():
    assert median([3, 1, 2]) == 2


def test_mode_tie_takes_smallest():
    assert mode([3, 3, 1, 1, 2]) == 1


def test_population_variance():
    assert variance([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == 4.0


def test_stdev_population():
    assert stdev([2, 4, 4, 4, 5, 5, 7, 9], sample=False) == 2.0


def test_percentile_bounds():
    assert percentile([5, 1, 3], 0) == 1 and percentile([5, 1, 3], 100) == 5
    with pytest.raises(ValueError):
        percentile([1], 101)


def test_stdev_is_sqrt_of_variance():
    values = [1.5, 2.5, 10.0]
    assert math.isclose(stdev(values) ** 2, variance(values))

import math

import pytest

from tinystats import (correlation, covariance, histogram, interquartile_range, mean, median, mode, moving_average,
                       percentile, quantiles, stdev, variance)


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


def test_quartiles_and_deciles():
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert quantiles(values) == [3, 5, 7]
    assert quantiles([10, 20], n=2) == [15]
    assert len(quantiles(values, n=10)) == 9
    with pytest.raises(ValueError):
        quantiles(values, n=1)


def test_interquartile_range():
    assert interquartile_range([1, 2, 3, 4, 5, 6, 7, 8, 9]) == 4
    assert interquartile_range([7]) == 0


def test_histogram_over_the_data_range():
    assert histogram([1, 2, 2, 3, 4, 5], bins=4) == [1, 2, 1, 2]
    assert sum(histogram([0.1 * i for i in range(50)], bins=7)) == 50


def test_histogram_with_explicit_edges():
    assert histogram([0, 5, 9.99, 10, 11, -1], bins=2, low=0, high=10) == [1, 3]
    assert histogram([3, 3, 3], bins=3) == [0, 0, 3]
    with pytest.raises(ValueError):
        histogram([1, 2], bins=0)
    with pytest.raises(ValueError):
        histogram([1, 2], bins=2, low=5, high=1)


def test_moving_average():
    assert moving_average([1, 2, 3, 4, 5], 3) == [2, 3, 4]
    assert moving_average([4, 8], 1) == [4, 8]
    assert moving_average([1, 2], 3) == []
    with pytest.raises(ValueError):
        moving_average([1, 2], 0)


def test_covariance():
    xs, ys = [1, 2, 3, 4], [2, 4, 6, 8]
    assert math.isclose(covariance(xs, ys), 10 / 3)
    assert math.isclose(covariance(xs, ys, sample=False), 2.5)
    with pytest.raises(ValueError):
        covariance([1, 2], [1, 2, 3])


def test_correlation():
    xs = [1, 2, 3, 4, 5]
    assert math.isclose(correlation(xs, [2 * x + 1 for x in xs]), 1.0)
    assert math.isclose(correlation(xs, [-x for x in xs]), -1.0)
    assert math.isclose(correlation([1, 2, 3], [1, 3, 2]), 0.5)
    with pytest.raises(ValueError, match="constant"):
        correlation(xs, [3] * 5)

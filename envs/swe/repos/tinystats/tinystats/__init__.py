"""tinystats: descriptive statistics and small dense matrices in pure Python."""
from tinystats.matrix import add, determinant, identity, inverse, matmul, power, scale, solve, transpose
from tinystats.stats import (correlation, covariance, histogram, interquartile_range, mean, median, mode,
                             moving_average, percentile, quantiles, stdev, variance)

__all__ = ["add", "correlation", "covariance", "determinant", "histogram", "identity", "interquartile_range",
           "inverse", "matmul", "mean", "median", "mode", "moving_average", "percentile", "power", "quantiles",
           "scale", "solve", "stdev", "transpose", "variance"]

"""tinystats: descriptive statistics and small dense matrices in pure Python."""
from tinystats.matrix import identity, matmul, transpose
from tinystats.stats import mean, median, mode, percentile, stdev, variance

__all__ = ["identity", "matmul", "mean", "median", "mode", "percentile", "stdev", "transpose", "variance"]

import pytest

from tinystats import identity, matmul, transpose
from tinystats.matrix import shape, trace


def test_identity():
    assert identity(2) == [[1.0, 0.0], [0.0, 1.0]]


def test_transpose_square():
    assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]


def test_matmul_by_identity():
    m = [[1, 2], [3, 4]]
    assert matmul(m, identity(2)) == m


def test_matmul_shape_mismatch():
    with pytest.raises(ValueError):
        matmul([[1, 2]], [[1, 2]])


def test_ragged():
    with pytest.raises(ValueError):
        shape([[1, 2], [3]])


def test_trace():
    assert trace([[1, 2], [3, 4]]) == 5

import math

import pytest

from tinystats import add, determinant, identity, inverse, matmul, power, scale, solve, transpose
from tinystats.matrix import is_symmetric, minor, shape, trace


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


def test_add_and_scale():
    assert add([[1, 2], [3, 4]], [[10, 20], [30, 40]]) == [[11, 22], [33, 44]]
    assert scale([[1, -2]], 3) == [[3, -6]]
    with pytest.raises(ValueError):
        add([[1, 2]], [[1], [2]])


def test_is_symmetric():
    assert is_symmetric([[1, 7], [7, 2]])
    assert not is_symmetric([[1, 7], [0, 2]])
    assert not is_symmetric([[1, 2, 3]])


def test_power():
    fibonacci = [[1, 1], [1, 0]]
    assert power(fibonacci, 10) == [[89, 55], [55, 34]]
    assert power(fibonacci, 0) == identity(2)
    with pytest.raises(ValueError):
        power(fibonacci, -1)


def test_minor():
    assert minor([[1, 2, 3], [4, 5, 6], [7, 8, 9]], 1, 0) == [[2, 3], [8, 9]]


def test_determinant_small_matrices():
    assert determinant([[5]]) == 5
    assert determinant([[1, 2], [3, 4]]) == -2
    assert determinant([[2, 0, 1], [1, 3, 2], [1, 1, 2]]) == 6
    assert determinant([[1, 2, 3], [4, 5, 6], [7, 8, 9]]) == 0
    assert determinant(identity(4)) == 1


def test_determinant_needs_a_square_matrix():
    with pytest.raises(ValueError, match="square"):
        determinant([[1, 2, 3], [4, 5, 6]])


def test_inverse():
    m = [[4, 7], [2, 6]]
    assert inverse(m) == [[0.6, -0.7], [-0.2, 0.4]]
    m3 = [[2, 0, 1], [1, 3, 2], [1, 1, 2]]
    product = matmul(m3, inverse(m3))
    assert all(math.isclose(product[i][j], 1.0 if i == j else 0.0, abs_tol=1e-12) for i in range(3) for j in range(3))
    with pytest.raises(ValueError, match="singular"):
        inverse([[1, 2], [2, 4]])


def test_solve():
    assert solve([[2, 1], [1, 3]], [3, 5]) == [0.8, 1.4]
    x = solve([[2, 0, 1], [1, 3, 2], [1, 1, 2]], [5, 13, 9])
    assert all(math.isclose(value, expected) for value, expected in zip(x, [1, 2, 3]))
    with pytest.raises(ValueError):
        solve([[1, 2], [3, 4]], [1])

"""Dense matrices as lists of rows."""
from __future__ import annotations

Matrix = list[list[float]]


def shape(m: Matrix) -> tuple[int, int]:
    rows = len(m)
    cols = len(m[0]) if rows else 0
    if any(len(row) != cols for row in m):
        raise ValueError("ragged matrix: rows differ in length")
    return rows, cols


def identity(n: int) -> Matrix:
    return [[1.0 if i == j else 0.0 for j in range(n)] for i in range(n)]


def transpose(m: Matrix) -> Matrix:
    rows, cols = shape(m)
    return [[m[i][j] for i in range(rows)] for j in range(cols)]


def matmul(a: Matrix, b: Matrix) -> Matrix:
    """The product a @ b."""
    a_rows, a_cols = shape(a)
    b_rows, b_cols = shape(b)
    if a_cols != b_rows:
        raise ValueError(f"cannot multiply {a_rows}x{a_cols} by {b_rows}x{b_cols}")
    return [[sum(a[i][k] * b[k][j] for k in range(a_cols)) for j in range(b_cols)] for i in range(a_rows)]


def trace(m: Matrix) -> float:
    rows, cols = shape(m)
    if rows != cols:
        raise ValueError(f"trace needs a square matrix, got {rows}x{cols}")
    return sum(m[i][i] for i in range(rows))


def _square_size(m: Matrix, operation: str) -> int:
    rows, cols = shape(m)
    if rows != cols:
        raise ValueError(f"{operation} needs a square matrix, got {rows}x{cols}")
    return rows


def add(a: Matrix, b: Matrix) -> Matrix:
    if shape(a) != shape(b):
        raise ValueError(f"cannot add {shape(a)} and {shape(b)} matrices")
    return [[x + y for x, y in zip(row_a, row_b)] for row_a, row_b in zip(a, b)]


def scale(m: Matrix, factor: float) -> Matrix:
    return [[factor * x for x in row] for row in m]


def is_symmetric(m: Matrix) -> bool:
    rows, cols = shape(m)
    return rows == cols and all(m[i][j] == m[j][i] for i in range(rows) for j in range(i))


def power(m: Matrix, exponent: int) -> Matrix:
    """m multiplied by itself `exponent` times (the identity for 0)."""
    n = _square_size(m, "power")
    if exponent < 0:
        raise ValueError(f"exponent must be non-negative, got {exponent}")
    result = identity(n)
    for _ in range(exponent):
        result = matmul(result, m)
    return result


def minor(m: Matrix, row: int, col: int) -> Matrix:
    """m without one row and one column."""
    return [r[:col] + r[col + 1:] for i, r in enumerate(m) if i != row]


def determinant(m: Matrix) -> float:
    """The determinant by cofactor expansion along the first row: exact for integers, meant for small matrices."""
    n = _square_size(m, "determinant")
    if n == 0:
        return 1
    if n == 1:
        return m[0][0]
    if n == 2:
        return m[0][0] * m[1][1] - m[0][1] * m[1][0]
    return sum((-1) ** j * m[0][j] * determinant(minor(m, 0, j)) for j in range(n))


def inverse(m: Matrix) -> Matrix:
    """The inverse as the adjugate over the determinant; ValueError for a singular matrix."""
    n = _square_size(m, "inverse")
    det = determinant(m)
    if det == 0:
        raise ValueError("singular matrix: the determinant is 0")
    return [[(-1) ** (i + j) * determinant(minor(m, j, i)) / det for j in range(n)] for i in range(n)]


def solve(a: Matrix, b: list[float]) -> list[float]:
    """x such that a x = b, by Cramer's rule; ValueError for a singular matrix."""
    n = _square_size(a, "solve")
    if len(b) != n:
        raise ValueError(f"b has {len(b)} values, the matrix {n} rows")
    det = determinant(a)
    if det == 0:
        raise ValueError("singular matrix: the determinant is 0")
    return [determinant([row[:j] + [b[i]] + row[j + 1:] for i, row in enumerate(a)]) / det for j in range(n)]

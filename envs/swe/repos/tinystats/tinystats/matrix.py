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

"""Matrices as lists of rows."""


def transpose(rows):
    return [list(col) for col in zip(*rows)]


def matmul(a, b):
    n = len(a)
    m = len(b)
    p = len(b[0])
    out = [[0] * p for _ in range(n)]
    for i in range(n):
        for j in range(p):
            for k in range(m):
                out[i][j] += a[i][k] * b[k][j]
    return out


def identity(n):
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]


def trace(rows):
    return sum(rows[i][i] for i in range(len(rows)))

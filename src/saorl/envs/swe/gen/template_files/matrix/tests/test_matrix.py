from PKG.matrix import identity, matmul, trace, transpose


def test_transpose():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_matmul():
    assert matmul([[1, 2], [3, 4]], [[5, 6], [7, 8]]) == [[19, 22], [43, 50]]
    assert matmul([[1, 2, 3]], [[1], [2], [3]]) == [[14]]


def test_identity():
    assert identity(2) == [[1, 0], [0, 1]]
    assert matmul(identity(3), [[1, 2], [3, 4], [5, 6]]) == [[1, 2], [3, 4], [5, 6]]


def test_trace():
    assert trace([[1, 2], [3, 4]]) == 5
    assert trace([[1, 0, 0], [0, 2, 0], [0, 0, 3]]) == 6

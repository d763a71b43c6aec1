from PKG.intervals import contains, merge, total_length


def test_merge_overlapping():
    assert merge([(1, 3), (2, 6), (8, 10)]) == [(1, 6), (8, 10)]


def test_merge_touching():
    assert merge([(1, 2), (2, 4)]) == [(1, 4)]


def test_merge_nested_and_unsorted():
    assert merge([(5, 6), (1, 10), (2, 3)]) == [(1, 10)]


def test_total_length():
    assert total_length([(0, 2), (1, 5), (10, 11)]) == 6


def test_contains():
    assert contains([(0, 5)], 0)
    assert contains([(0, 5)], 4)
    assert not contains([(0, 5)], 5)
    assert not contains([(0, 5), (7, 9)], 6)

import pytest

from PKG.search import binary_search, chunks, lower_bound


def test_binary_search_found():
    items = [1, 3, 5, 7, 9, 11]
    assert [binary_search(items, x) for x in items] == [0, 1, 2, 3, 4, 5]


def test_binary_search_missing():
    assert binary_search([1, 3, 5], 4) == -1
    assert binary_search([], 1) == -1
    assert binary_search([1, 3, 5], 6) == -1


def test_lower_bound():
    items = [1, 2, 2, 2, 5]
    assert lower_bound(items, 2) == 1
    assert lower_bound(items, 3) == 4
    assert lower_bound(items, 0) == 0
    assert lower_bound(items, 9) == 5


def test_chunks():
    assert chunks([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
    assert chunks([], 3) == []


def test_chunks_bad_size():
    with pytest.raises(ValueError):
        chunks([1], 0)

import pytest

from PKG.stats import clamp, mean, median, variance


def test_mean():
    assert mean([1, 2, 3, 4]) == 2.5
    assert mean([5]) == 5


def test_mean_empty():
    with pytest.raises(ValueError):
        mean([])


def test_median_odd():
    assert median([3, 1, 2]) == 2
    assert median([7]) == 7


def test_median_even():
    assert median([4, 1, 3, 2]) == 2.5


def test_median_empty():
    with pytest.raises(ValueError):
        median([])


def test_variance():
    assert variance([1, 2, 3, 4]) == 1.25
    assert variance([2, 2, 2]) == 0


def test_clamp():
    assert clamp(5, 0, 10) == 5
    assert clamp(-1, 0, 10) == 0
    assert clamp(11, 0, 10) == 10
    assert clamp(10, 0, 10) == 10
    assert clamp(0, 0, 10) == 0

import pytest

from PKG.roman import from_roman, to_roman


def test_to_roman():
    assert to_roman(1994) == "MCMXCIV"
    assert to_roman(4) == "IV"
    assert to_roman(3999) == "MMMCMXCIX"
    assert to_roman(1) == "I"


def test_to_roman_range():
    with pytest.raises(ValueError):
        to_roman(0)
    with pytest.raises(ValueError):
        to_roman(4000)


def test_from_roman():
    assert from_roman("MCMXCIV") == 1994
    assert from_roman("XLII") == 42
    assert from_roman("III") == 3


def test_round_trip():
    assert all(from_roman(to_roman(n)) == n for n in range(1, 300))

import pytest

from PKG.inventory import Inventory


def test_add_and_count():
    inv = Inventory()
    inv.add("apple", 3)
    inv.add("apple")
    assert inv.count("apple") == 4
    assert inv.count("pear") == 0


def test_add_rejects_non_positive():
    with pytest.raises(ValueError):
        Inventory().add("apple", 0)


def test_remove_some():
    inv = Inventory()
    inv.add("apple", 5)
    inv.remove("apple", 2)
    assert inv.count("apple") == 3


def test_remove_all_forgets_item():
    inv = Inventory()
    inv.add("apple", 2)
    inv.remove("apple", 2)
    assert "apple" not in inv.items


def test_remove_too_many():
    inv = Inventory()
    inv.add("apple", 1)
    with pytest.raises(KeyError):
        inv.remove("apple", 2)


def test_total():
    inv = Inventory()
    inv.add("apple", 2)
    inv.add("pear", 3)
    assert inv.total() == 5

"""More template modules for generated tasks (see `templates.py`): classes, dates, search."""

from __future__ import annotations

from saorl.envs.swe.templates import Template

INVENTORY = Template(
    "inventory",
    '''"""A stock of named items."""


class Inventory:
    def __init__(self):
        self.items = {}

    def add(self, name, quantity=1):
        if quantity <= 0:
            raise ValueError("quantity must be positive")
        self.items[name] = self.items.get(name, 0) + quantity

    def remove(self, name, quantity=1):
        have = self.items.get(name, 0)
        if quantity > have:
            raise KeyError(name)
        if quantity == have:
            del self.items[name]
        else:
            self.items[name] = have - quantity

    def count(self, name):
        return self.items.get(name, 0)

    def total(self):
        return sum(self.items.values())
''',
    """import pytest

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
""",
)

DATES = Template(
    "dates",
    '''"""Calendar arithmetic (Gregorian)."""

DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    if month == 2 and is_leap(year):
        return 29
    return DAYS[month - 1]


def day_of_year(year, month, day):
    total = day
    for m in range(1, month):
        total += days_in_month(year, m)
    return total
''',
    """from PKG.dates import day_of_year, days_in_month, is_leap


def test_is_leap():
    assert is_leap(2024)
    assert is_leap(2000)
    assert not is_leap(1900)
    assert not is_leap(2023)


def test_days_in_month():
    assert days_in_month(2023, 1) == 31
    assert days_in_month(2023, 2) == 28
    assert days_in_month(2024, 2) == 29
    assert days_in_month(2023, 4) == 30
    assert days_in_month(2023, 12) == 31


def test_day_of_year():
    assert day_of_year(2023, 1, 1) == 1
    assert day_of_year(2023, 3, 1) == 60
    assert day_of_year(2024, 3, 1) == 61
    assert day_of_year(2023, 12, 31) == 365
""",
)

SEARCH = Template(
    "search",
    '''"""Searching sorted lists, and chunking."""


def binary_search(items, target):
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == target:
            return mid
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1


def lower_bound(items, target):
    lo, hi = 0, len(items)
    while lo < hi:
        mid = (lo + hi) // 2
        if items[mid] < target:
            lo = mid + 1
        else:
            hi = mid
    return lo


def chunks(items, size):
    if size < 1:
        raise ValueError("size must be >= 1")
    return [items[i : i + size] for i in range(0, len(items), size)]
''',
    """import pytest

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
""",
)

ACCOUNT = Template(
    "account",
    '''"""A bank account with a transaction history."""


class Account:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount
        self.history.append(("deposit", amount))

    def withdraw(self, amount):
        if amount > self.balance:
            raise ValueError("insufficient funds")
        self.balance -= amount
        self.history.append(("withdraw", amount))

    def transfer(self, other, amount):
        self.withdraw(amount)
        other.deposit(amount)
''',
    """import pytest

from PKG.account import Account


def test_deposit():
    acc = Account("ann", 10)
    acc.deposit(5)
    assert acc.balance == 15
    assert acc.history == [("deposit", 5)]


def test_deposit_rejects_zero():
    with pytest.raises(ValueError):
        Account("ann").deposit(0)


def test_withdraw():
    acc = Account("ann", 10)
    acc.withdraw(10)
    assert acc.balance == 0
    assert acc.history == [("withdraw", 10)]


def test_withdraw_overdraft():
    with pytest.raises(ValueError):
        Account("ann", 3).withdraw(4)


def test_transfer():
    a, b = Account("ann", 10), Account("bob")
    a.transfer(b, 4)
    assert (a.balance, b.balance) == (6, 4)
""",
)

MATRIX = Template(
    "matrix",
    '''"""Matrices as lists of rows."""


def transpose(rows):
    return [list(col) for col in zip(*rows)]


def matmul(a, b):
    n, m, p = len(a), len(b), len(b[0])
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
''',
    """from PKG.matrix import identity, matmul, trace, transpose


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
""",
)

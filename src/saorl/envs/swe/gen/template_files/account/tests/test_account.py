import pytest

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
    a = Account("ann", 10)
    b = Account("bob")
    a.transfer(b, 4)
    assert (a.balance, b.balance) == (6, 4)

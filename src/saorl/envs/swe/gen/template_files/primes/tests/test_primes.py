from PKG.primes import gcd, is_prime, lcm, primes_below


def test_is_prime_small():
    assert [n for n in range(10) if is_prime(n)] == [2, 3, 5, 7]


def test_is_prime_squares():
    assert not is_prime(49)
    assert not is_prime(25)
    assert is_prime(97)


def test_primes_below():
    assert primes_below(20) == [2, 3, 5, 7, 11, 13, 17, 19]
    assert primes_below(2) == []


def test_gcd():
    assert gcd(12, 18) == 6
    assert gcd(7, 0) == 7
    assert gcd(-4, 6) == 2


def test_lcm():
    assert lcm(4, 6) == 12
    assert lcm(0, 5) == 0
    assert lcm(3, 5) == 15

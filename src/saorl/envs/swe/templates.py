"""Correct little Python modules with their pytest tests: the raw material of generated tasks.

(Five here, five more in `templates_more.py`; `all_templates()` lists them in a fixed order.)

Each template is a module (`PKG` stands for the package name chosen per task) and a test file
that covers every function, so most single-point mutations of a function body make a test fail.
Mutations only touch function bodies; module-level tables stay intact. The generator validates
every task, so an equivalent mutant (no test fails) is simply skipped.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Template:
    name: str  # module name: PKG/<name>.py, tests/test_<name>.py
    source: str
    tests: str


STATS = Template(
    "stats",
    '''"""Descriptive statistics of lists of numbers."""


def mean(values):
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / len(values)


def median(values):
    ordered = sorted(values)
    n = len(ordered)
    if n == 0:
        raise ValueError("median of an empty list")
    mid = n // 2
    if n % 2 == 1:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2


def variance(values):
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)


def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value
''',
    """import pytest

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
""",
)

TEXT = Template(
    "text",
    '''"""Small text utilities."""


def word_count(text):
    count = 0
    in_word = False
    for ch in text:
        if ch.isspace():
            in_word = False
        elif not in_word:
            in_word = True
            count += 1
    return count


def is_palindrome(text):
    letters = [c.lower() for c in text if c.isalnum()]
    i, j = 0, len(letters) - 1
    while i < j:
        if letters[i] != letters[j]:
            return False
        i += 1
        j -= 1
    return True


def truncate(text, width, suffix="..."):
    if len(text) <= width:
        return text
    return text[: width - len(suffix)] + suffix


def title_case(text):
    return " ".join(word[:1].upper() + word[1:].lower() for word in text.split(" "))
''',
    """from PKG.text import is_palindrome, title_case, truncate, word_count


def test_word_count():
    assert word_count("the quick  brown fox") == 4
    assert word_count("  leading and trailing  ") == 3
    assert word_count("") == 0


def test_palindrome_true():
    assert is_palindrome("A man, a plan, a canal: Panama")
    assert is_palindrome("abba")


def test_palindrome_false():
    assert not is_palindrome("abca")
    assert not is_palindrome("ab")


def test_truncate_short():
    assert truncate("hello", 5) == "hello"


def test_truncate_long():
    assert truncate("hello world", 8) == "hello..."
    assert len(truncate("abcdefghij", 6)) == 6


def test_title_case():
    assert title_case("hello wORLD") == "Hello World"
    assert title_case("a") == "A"
""",
)

INTERVALS = Template(
    "intervals",
    '''"""Half-open integer intervals [start, end)."""


def merge(intervals):
    result = []
    for start, end in sorted(intervals):
        if result and start <= result[-1][1]:
            result[-1] = (result[-1][0], max(result[-1][1], end))
        else:
            result.append((start, end))
    return result


def total_length(intervals):
    return sum(end - start for start, end in merge(intervals))


def contains(intervals, point):
    for start, end in intervals:
        if start <= point < end:
            return True
    return False
''',
    """from PKG.intervals import contains, merge, total_length


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
""",
)

PRIMES = Template(
    "primes",
    '''"""Primes and divisibility."""


def is_prime(n):
    if n < 2:
        return False
    d = 2
    while d * d <= n:
        if n % d == 0:
            return False
        d += 1
    return True


def primes_below(limit):
    return [n for n in range(2, limit) if is_prime(n)]


def gcd(a, b):
    while b:
        a, b = b, a % b
    return abs(a)


def lcm(a, b):
    if a == 0 or b == 0:
        return 0
    return abs(a * b) // gcd(a, b)
''',
    """from PKG.primes import gcd, is_prime, lcm, primes_below


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
""",
)

ROMAN = Template(
    "roman",
    '''"""Roman numerals."""

NUMERALS = [
    (1000, "M"), (900, "CM"), (500, "D"), (400, "CD"), (100, "C"), (90, "XC"),
    (50, "L"), (40, "XL"), (10, "X"), (9, "IX"), (5, "V"), (4, "IV"), (1, "I"),
]


def to_roman(number):
    if not 0 < number < 4000:
        raise ValueError("out of range")
    out = []
    for value, numeral in NUMERALS:
        while number >= value:
            out.append(numeral)
            number -= value
    return "".join(out)


def from_roman(text):
    values = {numeral: value for value, numeral in NUMERALS if len(numeral) == 1}
    total = 0
    for i, ch in enumerate(text):
        value = values[ch]
        if i + 1 < len(text) and values[text[i + 1]] > value:
            total -= value
        else:
            total += value
    return total
''',
    """import pytest

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
""",
)


def all_templates() -> tuple[Template, ...]:
    """Every template, in a fixed order (task generation depends on it)."""
    from saorl.envs.swe.templates_more import ACCOUNT, DATES, INVENTORY, MATRIX, SEARCH

    return (STATS, TEXT, INTERVALS, PRIMES, ROMAN, INVENTORY, DATES, SEARCH, ACCOUNT, MATRIX)


PACKAGES = ("toolbox", "mathkit", "corelib", "utilpack", "datalib", "helpers")

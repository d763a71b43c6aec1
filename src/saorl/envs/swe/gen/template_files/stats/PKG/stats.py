"""Descriptive statistics of lists of numbers."""


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

"""Half-open integer intervals [start, end)."""


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

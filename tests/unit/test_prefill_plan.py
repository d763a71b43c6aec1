"""`plan_prefill`: how the HF engine groups rows to prefill into forwards."""

from __future__ import annotations

import itertools
import random

from saorl.engines.prefill_plan import forward_cost, plan_prefill


def _cost(lengths: list[int], groups: list[list[int]]) -> float:
    return sum(forward_cost(len(g), max(lengths[i] for i in g)) for g in groups)


def _check_shape(lengths: list[int], groups: list[list[int]]) -> None:
    """Every row once; longest first within and across groups (slots follow this order)."""
    flat = [i for g in groups for i in g]
    assert sorted(flat) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths, reverse=True)
    assert all(g for g in groups)


def test_short_rows_share_a_forward_and_a_long_row_gets_its_own():
    assert plan_prefill([]) == []
    assert plan_prefill([7]) == [[0]]
    same = [9, 9, 10, 8, 9, 11]  # joining prompts: one forward
    assert len(plan_prefill(same)) == 1
    lengths = [9, 832, 14, 40, 9, 25]
    groups = plan_prefill(lengths)
    _check_shape(lengths, groups)
    assert groups[0] == [1] and len(groups) == 2


def test_the_plan_is_the_cheapest_contiguous_split_of_the_sorted_rows():
    rng = random.Random(0)
    for _ in range(30):
        lengths = [min(1024, int(8 * 2.718 ** (2.4 * rng.gauss(0, 1)))) + 1 for _ in range(7)]
        groups = plan_prefill(lengths)
        _check_shape(lengths, groups)
        order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        # Brute force over every way to cut the sorted rows into contiguous groups.
        best = min(
            _cost(lengths, [order[a:b] for a, b in itertools.pairwise((0, *cuts, len(order)))])
            for k in range(len(order))
            for cuts in itertools.combinations(range(1, len(order)), k)
        )
        assert abs(_cost(lengths, groups) - best) < 1e-9
        # Never worse than one padded forward or one forward per row.
        assert _cost(lengths, groups) <= _cost(lengths, [order]) + 1e-9
        assert _cost(lengths, groups) <= _cost(lengths, [[i] for i in order]) + 1e-9

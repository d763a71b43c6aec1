"""How the HF engine splits a prefill into forwards (see `saorl.engines.hf`).

A prefill runs the rows that have no key/value cache yet: requests that joined, and after a
weight update every running row, whose keys/values the old weights computed. A forward pads
its rows to the longest, and a padded position costs what a real one does, attention included
(causal attention over `T` positions is quadratic in `T`). After a weight update the running
rows range from a few tokens to the context limit, and one forward over all of them would
spend most of its time on padding: measured on the generation-bound benchmark's mix (63 rows
of 9 to 832 tokens), several times a grouped prefill (`docs/performance.md`). A forward per
row wastes nothing on padding but pays a forward's fixed cost per row, which dominates for
short rows (joining prompts).

`plan_prefill` sorts the rows by length and cuts them into contiguous groups, one forward each,
minimising a model of the cost of a forward of `n` rows padded to width `T`, in row-positions:

    cost(n, T) = FORWARD_COST + n * T * (1 + T / ATTENTION_WIDTH)

`FORWARD_COST` is a forward's fixed cost (dispatch, the head over the last positions),
`n * T` the per-position work (projections, MLP), `n * T^2 / ATTENTION_WIDTH` the causal
attention. The constants come from profiling the benchmark's 32-unit model on one CPU thread
(a forward ~1 ms, ~3 us per position, attention equal to the rest at ~400 positions); on
other hardware the results stay exact, only the grouping is less well tuned. The plan is
dynamic programming over the sorted lengths (O(rows^2), rows <= `max_concurrent`). Grouping
changes only how rows are padded, not what they compute: every row's logits and keys/values
are those of its own tokens (float differences ~1e-6).
"""

from __future__ import annotations

FORWARD_COST = 300.0  # a forward's fixed cost, in row-positions
ATTENTION_WIDTH = 400.0  # causal attention costs n * T^2 / this row-positions


def forward_cost(n: int, width: int) -> float:
    """Modelled cost of one forward of `n` rows padded to `width` positions."""
    return FORWARD_COST + n * width * (1.0 + width / ATTENTION_WIDTH)


def plan_prefill(lengths: list[int]) -> list[list[int]]:
    """Indices into `lengths`, grouped into forwards: longest group first, each group's rows
    in descending length, every index exactly once."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    n = len(order)
    # best[j] = cheapest cost of the first j rows (longest first); cut[j] = where its last
    # group starts. A group order[i:j] is padded to its first (longest) row, lengths[order[i]].
    best = [0.0] + [float("inf")] * n
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        for i in range(j):
            cost = best[i] + forward_cost(j - i, lengths[order[i]])
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups: list[list[int]] = []
    j = n
    while j:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]

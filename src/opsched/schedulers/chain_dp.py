"""The backend finder of PartitionTuner: the Viterbi-style dynamic program that places one
chain of operators on units, with fusion and switch costs.

For a chain ``n_0 .. n_{m-1}``, ``best[j][u]`` is the least time to run its first ``j`` nodes
with node ``j-1`` on unit ``u``. The last step is a group ``n_i .. n_{j-1}`` on ``u``: one node,
or a chain that ``u`` fuses (priced as fused) of up to ``max_fuse`` nodes; it follows the best
state at ``i`` on any unit ``u'``, plus the copy of ``n_{i-1}``'s output when ``u' != u``:

    best[j][u] = min over i < j, u' of  best[i][u'] + switch(i, u', u) + group(i, j, u)

with ``best[0][.]`` the empty start (the group then pays for bringing the chain's inputs to
``u``, which ``group`` includes) and the answer ``min over u of best[m][u] + exit(u)``. Unlike
the paper's recurrence, which keeps one fused pair and subtracts a node already counted, the
state here is exact: the result equals the brute-force minimum over every placement and every
grouping of the chain (``tests/test_hetero.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["ChainPlacement", "place_chain"]


@dataclass(frozen=True)
class ChainPlacement:
    cost: float
    units: tuple[str, ...]                # per node
    groups: tuple[tuple[int, int], ...]   # fused groups, [start, end) node positions


def place_chain(m: int, units: Sequence[str], group: Callable[[int, int, str], float],
                switch: Callable[[int, str, str], float], exit_cost: Callable[[str], float] = lambda u: 0.0,
                max_fuse: int = 3) -> ChainPlacement:
    """The least-cost placement of a chain of ``m`` nodes. ``group(i, j, u)``: nodes ``i..j-1``
    run on ``u`` as one group (infinite where ``u`` cannot run or fuse them), including the
    copies of inputs that come from outside the chain; ``switch(i, a, b)``: moving the value
    that node ``i`` reads from node ``i-1`` from ``a`` to ``b``; ``exit_cost(u)``: what the last
    node's output costs to take from ``u`` onward."""
    if m == 0:
        return ChainPlacement(0.0, (), ())
    best = [[math.inf] * len(units) for _ in range(m + 1)]
    back: list[list[tuple[int, int] | None]] = [[None] * len(units) for _ in range(m + 1)]
    for j in range(1, m + 1):
        for b, u in enumerate(units):
            for i in range(max(0, j - max_fuse), j):
                g = group(i, j, u)
                if not math.isfinite(g):
                    continue
                if i == 0:
                    if g < best[j][b]:
                        best[j][b], back[j][b] = g, (0, -1)
                    continue
                for a, v in enumerate(units):
                    c = best[i][a] + (switch(i, v, u) if a != b else 0.0) + g
                    if c < best[j][b]:
                        best[j][b], back[j][b] = c, (i, a)
    final = [best[m][b] + exit_cost(u) for b, u in enumerate(units)]
    b = min(range(len(units)), key=lambda k: final[k])
    if not math.isfinite(final[b]):
        raise ValueError("no unit runs every node of the chain in any placement")
    cost, placed, groups, j = final[b], [""] * m, [], m
    while j > 0:
        step = back[j][b]
        assert step is not None
        i, a = step
        for k in range(i, j):
            placed[k] = units[b]
        groups.append((i, j))
        j, b = i, a
    return ChainPlacement(cost, tuple(placed), tuple(reversed(groups)))

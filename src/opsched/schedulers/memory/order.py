"""Algorithm 3 of GraphTurbo: the order of sub-graph instances, depth-first (last in, first out).

Every instance whose producers are done is *ready*; a breadth-first order takes the ready one
added first, so all instances of a sub-graph run before any of the next (``a1 .. a8 b1 .. b4
...``) and every intermediate goes out to DRAM and back. The depth-first order takes the one
added *last*: as soon as the instances a consumer reads are done, the consumer runs, while they
are still in the cache. On the paper's Fig. 7 (a chain of sub-graphs of 8, 4, 2 and 1 instances)
it gives ``a8 a7 b4 a6 a5 b3 c2 a4 a3 b2 a2 a1 b1 c1 d1``.

Both take a DAG as, per unit, the units it reads (``preds``); units are indices, and the initially
ready ones, and each unit's consumers, are considered in index order.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["depth_first", "breadth_first"]


def _order(preds: Sequence[Sequence[int]], last_in_first_out: bool) -> list[int]:
    """Kahn's algorithm over ``preds``, taking the newest ready unit or the oldest."""
    succs: list[list[int]] = [[] for _ in preds]
    indegree = [0] * len(preds)
    for u, ps in enumerate(preds):
        for p in dict.fromkeys(ps):
            succs[p].append(u)
            indegree[u] += 1
    ready = deque(u for u in range(len(preds)) if indegree[u] == 0)
    take = ready.pop if last_in_first_out else ready.popleft
    order = []
    while ready:
        u = take()
        order.append(u)
        for s in succs[u]:
            indegree[s] -= 1
            if indegree[s] == 0:
                ready.append(s)
    if len(order) != len(preds):
        raise ValueError(f"the instance graph has a cycle: {len(preds) - len(order)} units never become ready")
    return order


def depth_first(preds: Sequence[Sequence[int]]) -> list[int]:
    """Algorithm 3: repeatedly run the most recently readied unit."""
    return _order(preds, last_in_first_out=True)


def breadth_first(preds: Sequence[Sequence[int]]) -> list[int]:
    """The layer-by-layer order: the unit readied first runs first."""
    return _order(preds, last_in_first_out=False)

"""Kahn's algorithm over named items, shared by the graph and lane-schedule checkers and the ONNX reader;
bitmasks of sets of indexed items, shared by the schedulers."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Hashable, Mapping, Sequence, Set
from typing import TypeVar

__all__ = ["kahn", "ancestor_masks", "bits", "topological_order"]

H = TypeVar("H", bound=Hashable)


def topological_order(deps: Mapping[H, Set[H]], rank: Callable[[H], int] | None = None) -> tuple[list[H], list[H]]:
    """Kahn's algorithm: (an order of the items that can be ordered, the items that wait
    (transitively) on a cycle). ``deps`` maps each item to the items it waits for, all keys.
    With ``rank``, the ready item of the lowest rank always comes next (a file's node order kept
    wherever the dependencies allow it); without, the last one to become ready."""
    indeg = {v: len(d) for v, d in deps.items()}
    users: dict[H, list[H]] = {v: [] for v in deps}
    for v, d in deps.items():
        for u in d:
            users[u].append(v)
    ready: list[H] = []
    ranked: list[tuple[int, int, H]] = []  # (rank, arrival, item): the arrival breaks ties, never the item
    arrivals = itertools.count()

    def push(v: H) -> None:
        if rank is None:
            ready.append(v)
        else:
            heapq.heappush(ranked, (rank(v), next(arrivals), v))

    for v, waiting in indeg.items():
        if waiting == 0:
            push(v)
    order: list[H] = []
    while ready or ranked:
        v = ready.pop() if rank is None else heapq.heappop(ranked)[2]
        order.append(v)
        for w in users[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                push(w)
    return order, [v for v, d in indeg.items() if d > 0]


def kahn(deps: Mapping[str, Set[str]]) -> list[str]:
    """Names that wait (transitively) on a cycle: empty iff ``deps`` (name -> the names it waits
    for, all keys of ``deps``) can be ordered."""
    return topological_order(deps)[1]


def bits(mask: int) -> list[int]:
    """Indices of the set bits of ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out


def ancestor_masks(preds: Sequence[Sequence[int]]) -> list[int]:
    """Bitmasks of each node's ancestors in a DAG given as predecessor lists in topological order."""
    anc = [0] * len(preds)
    for i, ps in enumerate(preds):
        for p in ps:
            anc[i] |= anc[p] | (1 << p)
    return anc

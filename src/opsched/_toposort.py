"""Kahn's algorithm over named items, shared by the graph and lane-schedule checkers."""

from __future__ import annotations

from collections.abc import Mapping, Set

__all__ = ["kahn", "bits"]


def kahn(deps: Mapping[str, Set[str]]) -> list[str]:
    """Names that wait (transitively) on a cycle: empty iff ``deps`` (name -> the names it waits
    for, all keys of ``deps``) can be ordered."""
    indeg = {v: len(d) for v, d in deps.items()}
    users: dict[str, list[str]] = {v: [] for v in deps}
    for v, d in deps.items():
        for u in d:
            users[u].append(v)
    ready = [v for v, d in indeg.items() if d == 0]
    while ready:
        v = ready.pop()
        for w in users[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                ready.append(w)
    return [v for v, d in indeg.items() if d > 0]


def bits(mask: int) -> list[int]:
    """Indices of the set bits of ``mask``, lowest first."""
    out = []
    while mask:
        low = mask & -mask
        out.append(low.bit_length() - 1)
        mask ^= low
    return out

"""Automatic block partitioning: where the scheduler may cut the graph without losing anything.

A *cut* is a unit through which every path from the graph inputs to the graph outputs passes
(an Inception module's output concat). Nothing can run concurrently across a cut, so blocks
between consecutive cuts are scheduled independently with no loss. A block larger than
``max_part_size`` units is split at every position of the topological order where the fewest
values are live across the boundary (NASNet's cell outputs: two tensors), as long as that
leaves parts of at least a quarter of the cap; a part still too large is split again the same
way, and past that into equal chunks. Parts then align with repeated cells (IOS needed NASNet
cut by hand), and identical cells can be solved once.
"""

from __future__ import annotations

from opsched.schedulers.units import UnitGraph

__all__ = ["cut_units", "partition"]


def cut_units(ug: UnitGraph) -> list[int]:
    """Indices of the units every input-to-output path passes through, in order."""
    g = ug.graph
    n = len(ug)
    reads_input = [any(v in {i.name for i in g.inputs} for name in names for v in g.node(name).inputs)
                   for names in ug.units]
    outputs = set(g.outputs)
    is_output = [any(v in outputs for v in names) for names in ug.units]
    anc = [0] * n
    for u in range(n):
        for p in ug.preds[u]:
            anc[u] |= anc[p] | (1 << p)
    cuts = []
    reach = -1  # the furthest unit read by any unit before u
    last_input = max((u for u in range(n) if reads_input[u]), default=-1)
    first_output = min((u for u in range(n) if is_output[u]), default=n)
    for u in range(n):
        if reach <= u and anc[u].bit_count() == u and u >= last_input and u <= first_output:
            cuts.append(u)
        reach = max(reach, max(ug.succs[u], default=-1))
    return cuts


def _crossing(ug: UnitGraph) -> list[int]:
    """crossing[q]: how many units at positions <= q are read by units after q."""
    n = len(ug)
    last_use = [max(s, default=u) for u, s in enumerate(ug.succs)]
    delta = [0] * (n + 1)
    for u in range(n):
        if last_use[u] > u:
            delta[u] += 1
            delta[last_use[u]] -= 1
    out, running = [], 0
    for q in range(n):
        running += delta[q]
        out.append(running)
    return out


def partition(ug: UnitGraph, max_part_size: int = 50) -> list[list[int]]:
    """Parts (lists of unit indices, in order) covering every unit once."""
    if max_part_size < 1:
        raise ValueError(f"max_part_size must be positive, got {max_part_size}")
    n = len(ug)
    bounds = sorted(set(cut_units(ug)) | {n - 1}) if n else []
    crossing = _crossing(ug)
    parts: list[list[int]] = []
    start = 0
    for end in bounds:  # block = units start..end inclusive (a cut closes its block)
        parts += _split(start, end, max_part_size, crossing)
        start = end + 1
    return [p for p in parts if p]


def _split(lo: int, hi: int, cap: int, crossing: list[int]) -> list[list[int]]:
    """Split units lo..hi (inclusive) into parts of at most ``cap`` units."""
    if hi - lo + 1 <= cap:
        return [list(range(lo, hi + 1))]
    least = max(1, cap // 4)
    inner = range(lo + least - 1, hi - least + 1)  # a split after q leaves >= least units each side
    if inner:
        narrowest = min(crossing[q] for q in inner)
        cuts, last = [], lo - 1
        for q in inner:
            if crossing[q] == narrowest and q - last >= least and hi - q >= least:
                cuts.append(q)
                last = q
        if cuts:
            out, a = [], lo
            for q in cuts + [hi]:
                out += _split(a, q, cap, crossing) if q - a + 1 > cap else [list(range(a, q + 1))]
                a = q + 1
            return out
    return [list(range(a, min(a + cap, hi + 1))) for a in range(lo, hi + 1, cap)]

"""Automatic block partitioning: where the scheduler may cut the graph without losing anything.

A *cut* is a unit through which every path from the graph inputs to the graph outputs passes
(an Inception module's output concat). Nothing can run concurrently across a cut, so blocks
between consecutive cuts are scheduled independently with no loss. A block larger than
``max_part_size`` units is split at every position of the topological order where the fewest
values are live across the boundary (NASNet's cell outputs: two tensors), as long as that
leaves parts of at least a quarter of the cap; a part still too large is split again the same
way, and past that into equal chunks. Parts then align with repeated cells (IOS needed NASNet
cut by hand), and identical cells can be solved once.

Size is not what makes a part hard, though: the IOS DP's states are the part's down-sets (its
sets of units closed under predecessors), a chain of 50 units has 51 and 32 units in a dozen
short branches (a detector's box decoding) have 66,130. :func:`state_count` counts them without
listing them (:func:`down_sets`, milliseconds), and :func:`split_to_fit` splits a part that has
more than ``max_states`` into as few pieces as have at most that many each, cut where few values
cross: the DP stays exact within each, and what is lost is the concurrency across the cuts. So a
search's size is known, and the same on every machine, before it starts, where a time budget
(``budget_s``) cuts it short at a point that depends on the machine's speed and leaves the
unsolved parts to a heuristic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from opsched._toposort import ancestor_masks
from opsched.schedulers.units import UnitGraph

__all__ = ["ascending_down_sets", "cut_units", "down_sets", "partition", "split_to_fit", "state_count"]


def cut_units(ug: UnitGraph) -> list[int]:
    """Indices of the units every input-to-output path passes through, in order."""
    g = ug.graph
    n = len(ug)
    reads_input = [any(v in {i.name for i in g.inputs} for name in names for v in g.node(name).inputs)
                   for names in ug.units]
    outputs = set(g.outputs)
    is_output = [any(v in outputs for v in names) for names in ug.units]
    anc = ancestor_masks(ug.preds)
    cuts = []
    reach = -1  # the furthest unit read by any unit before u
    last_input = max((u for u in range(n) if reads_input[u]), default=-1)
    first_output = min((u for u in range(n) if is_output[u]), default=n)
    for u in range(n):
        if reach <= u and anc[u].bit_count() == u and u >= last_input and u <= first_output:
            cuts.append(u)
        reach = max(reach, max(ug.succs[u], default=-1))
    return cuts


def down_sets(anc: Sequence[int], cap: int | None = None) -> int:
    """The sets of a DAG's nodes closed under predecessors (the empty set and the whole included),
    the DAG given by each node's ancestors as a bitmask (:func:`opsched._toposort.ancestor_masks`),
    nodes in topological order. Past ``cap``, ``cap + 1``.

    The last node v of a set is maximal in it, so the set's down-sets are those without v (the
    down-sets of the rest) and those with v, which hold its ancestors (the down-sets of the rest
    without v's ancestors, each joined by them and v): ``count(S) = count(S - v) + count(S - v -
    ancestors(v))``, memoized by set. The sets met are few (165 for the box decoding's 66,130
    down-sets), so they are counted without being listed."""
    full = (1 << len(anc)) - 1
    counts = {0: 1}
    stack = [full]
    while stack:  # iterative: a DAG may be deeper than Python's recursion limit
        mask = stack[-1]
        if mask in counts:
            stack.pop()
            continue
        top = mask.bit_length() - 1
        without = mask & ~(1 << top)
        subsets = (without, without & ~anc[top])
        missing = [m for m in subsets if m not in counts]
        if missing:
            stack += missing
            continue
        stack.pop()
        total = counts[subsets[0]] + counts[subsets[1]]
        counts[mask] = total if cap is None else min(total, cap + 1)
    return counts[full]


def state_count(ug: UnitGraph, part: Sequence[int], cap: int | None = None) -> int:
    """The IOS DP's states on ``part``: the down-sets of its units (:func:`down_sets`)."""
    return down_sets(ug.local_masks(part)[1], cap)


def ascending_down_sets(pred: Sequence[int], check: Callable[[], None] = lambda: None) -> list[int]:
    """Every down-set of a DAG as a bitmask, in increasing order, so each after all its subsets
    (a proper subset is a smaller number); the DAG given by each node's direct predecessors as a
    bitmask, nodes in topological order. ``check`` is called every 4,096 sets (a search's budget).

    Each set is listed once, from its parent: the set without its last node, which is maximal in
    it, so the parent is a down-set too. A set's children add a node after its last whose
    predecessors it holds."""
    n = len(pred)
    out = []
    stack = [(0, 0)]  # (down-set, first node that may join it)
    while stack:
        state, low = stack.pop()
        out.append(state)
        if not len(out) % 4096:
            check()
        outside = ~state
        stack += [(state | 1 << u, u + 1) for u in range(low, n) if not pred[u] & outside]
    out.sort()
    return out


def partition(ug: UnitGraph, max_part_size: int = 50) -> list[list[int]]:
    """Parts (lists of unit indices, in order) covering every unit once."""
    if max_part_size < 1:
        raise ValueError(f"max_part_size must be positive, got {max_part_size}")
    n = len(ug)
    bounds = sorted(set(cut_units(ug)) | {n - 1}) if n else []
    crossing = ug.crossing
    parts: list[list[int]] = []
    start = 0
    for end in bounds:  # block = units start..end inclusive (a cut closes its block)
        parts += _split(start, end, max_part_size, crossing)
        start = end + 1
    return [p for p in parts if p]


def split_to_fit(ug: UnitGraph, part: list[int], max_states: int) -> list[list[int]]:
    """``part`` (a range of units, as :func:`partition` gives) in pieces of at most ``max_states``
    down-sets each, as few as it takes: each piece is the longest run of the part's remaining
    units that fits (found by bisection: a run's down-sets grow with it), cut back to where the
    fewest values are live across the boundary within that run's later half."""
    if max_states < 2:
        raise ValueError(f"max_states must be at least 2 (a single unit's down-sets), got {max_states}")
    crossing = ug.crossing

    def fits(lo: int, hi: int) -> bool:
        return state_count(ug, range(lo, hi + 1), max_states) <= max_states

    pieces, lo, hi = [], part[0], part[-1]
    while not fits(lo, hi):
        a, b = lo, hi - 1  # the run lo..a fits (one unit always does); lo..b+1 does not
        while a < b:
            mid = (a + b + 1) // 2
            a, b = (mid, b) if fits(lo, mid) else (a, mid - 1)
        cut = min(range(lo + (a - lo) // 2, a + 1), key=lambda q: (crossing[q], -q))
        pieces.append(list(range(lo, cut + 1)))
        lo = cut + 1
    return [*pieces, list(range(lo, hi + 1))]


def _split(lo: int, hi: int, cap: int, crossing: Sequence[int]) -> list[list[int]]:
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

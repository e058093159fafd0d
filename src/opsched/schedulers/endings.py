"""Enumerating the possible last stages ("endings") of a set of operators.

For a set S of not-yet-scheduled units (a down-set of the DAG: closed under predecessors), an
ending S' is a non-empty subset with no edge from S' into S - S', i.e. closed under successors
within S. Its parallel groups are the weakly connected components of the subgraph S' induces:
components have no edges between them, so they can run at once, and each is run in
topological order on one lane. This is the correct form of IOS's rule: IOS builds groups from
the descendant closures of chosen roots and so never generates endings whose roots share
descendants (IOS issue #10), and its later fix can put one node in two groups.

Pruning (IOS's P(r, s)): at most ``max_group_size`` units per component, at most
``max_groups`` components.

The enumeration builds the groups first and the endings from them. A *group* is a weakly
connected set of at most r units closed under successors within S. Two disjoint groups have no
edge between them (an edge leaving a group ends in it, as the group is closed), so every set of
at most s pairwise disjoint groups is an ending whose components are exactly those groups, and
every ending is one such set: the endings are the combinations of disjoint groups, each found
once. The groups are grown from descendant closures: D(v), v and its descendants within S, is
a group when it has at most r units, and a group g grows into g | D(w) for each direct
predecessor w of g whose closure keeps the union within r units (connected through w, closed
as both sides are). Every group G is reached: start from the closure of any of its units,
which lies in G; while the set grown so far, g, is short of G, some edge of the connected G
joins g to the rest of G, and it cannot leave g (g is closed), so it enters g from a unit w of
G, whose closure lies in G (G is closed): g | D(w) is a larger group within G.

The work follows the endings found (each step of the combination yields one), where deciding
unit by unit whether it is in the ending spends most of its steps on branches that end with
too many components. The IOS searches of ``benchmarks/wide_parts.py`` (box decoding, Phi, Mamba,
GPT-J, GPT-NeoX, RT-DETR and RandWire-large; the same estimates) ran 3.1-8.1x faster so under
the CPU2 preset's 2 lanes and 1.1-2.2x under H100's 8, where a stage of many groups makes the
endings themselves many.
"""

from __future__ import annotations

from collections.abc import Sequence

from opsched._toposort import bits

__all__ = ["parallel_endings", "parallel_groups", "disjoint_unions", "predecessor_masks", "Ending"]

Ending = tuple[int, tuple[int, ...]]  # (mask of the ending, masks of its groups)


def predecessor_masks(succ: Sequence[int]) -> list[int]:
    """Each unit's direct predecessors, as a bitmask, from its direct successors'."""
    pred = [0] * len(succ)
    for u, after in enumerate(succ):
        for v in bits(after):
            pred[v] |= 1 << u
    return pred


def parallel_endings(state: int, succ: Sequence[int], pred: Sequence[int], max_group_size: int,
                     max_groups: int) -> list[Ending]:
    """All endings of ``state`` under P(max_group_size, max_groups).

    Units are indexed in topological order (every successor of unit u has an index above u's);
    ``succ[u]``/``pred[u]`` are bitmasks of unit u's direct successors and predecessors.
    """
    groups = parallel_groups(state, succ, pred, max_group_size)
    return [(g, (g,)) for g in groups] + disjoint_unions(groups, max_groups)


def disjoint_unions(groups: Sequence[int], max_groups: int) -> list[Ending]:
    """The endings of two to ``max_groups`` pairwise disjoint ``groups``: (their union, the groups
    in the order given), each once."""
    out: list[Ending] = []
    count = len(groups)
    if max_groups < 2:
        return out
    # (first candidate index, union, groups so far): each extended by a later disjoint group
    partial: list[tuple[int, int, tuple[int, ...]]] = [(i + 1, g, (g,)) for i, g in enumerate(groups)]
    while partial:
        start, used, comps = partial.pop()
        more = len(comps) + 1 < max_groups
        for j in range(start, count):
            g = groups[j]
            if not g & used:
                ending = (used | g, (*comps, g))
                out.append(ending)
                if more:
                    partial.append((j + 1, *ending))
    return out


def parallel_groups(state: int, succ: Sequence[int], pred: Sequence[int], r: int) -> list[int]:
    """The successor-closed, weakly connected sets of at most ``r`` units of ``state``."""
    closure: dict[int, tuple[int, int]] = {}  # unit v -> (D(v), its units' direct predecessors), where D(v) fits
    for v in range(state.bit_length() - 1, -1, -1):  # successors before their predecessors
        if not (state >> v) & 1:
            continue
        mask, above = 1 << v, pred[v]
        for w in bits(succ[v] & state):
            below = closure.get(w)
            if below is None:  # a successor's closure is too large already
                break
            mask |= below[0]
            above |= below[1]
        else:
            if mask.bit_count() <= r:
                closure[v] = (mask, above)
    grown = list(closure.values())
    seen = {g for g, _ in grown}
    for g, above in grown:  # grows as it is read: each new group is grown in turn
        if g.bit_count() == r:
            continue
        for w in bits(above & state & ~g):
            joined = closure.get(w)
            if joined is None:
                continue
            union = g | joined[0]
            if union.bit_count() <= r and union not in seen:
                seen.add(union)
                grown.append((union, above | joined[1]))
    return [g for g, _ in grown]

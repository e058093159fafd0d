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

Enumeration visits S in reverse topological order, deciding for each unit "in" (allowed
only if all its successors in S are in) or "out" (which excludes all its ancestors, since an
ending containing one must contain its descendants). Components are maintained as bitmasks,
merged as units join them.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["parallel_endings", "Ending"]

Ending = tuple[int, tuple[int, ...]]  # (mask of the ending, masks of its groups)


def parallel_endings(state: int, succ: Sequence[int], anc: Sequence[int], order: Sequence[int],
                     max_group_size: int, max_groups: int) -> list[Ending]:
    """All endings of ``state`` under P(max_group_size, max_groups).

    ``succ[u]``/``anc[u]`` are bitmasks of unit u's direct successors and all its ancestors;
    ``order`` lists unit indices in decreasing topological order.
    """
    nodes = [u for u in order if (state >> u) & 1]
    out: list[Ending] = []
    r, s = max_group_size, max_groups
    n = len(nodes)

    def rec(i: int, chosen: int, blocked: int, comps: tuple[int, ...]) -> None:
        while i < n and (blocked >> nodes[i]) & 1:
            i += 1
        if i == n:
            if chosen and len(comps) <= s:
                out.append((chosen, comps))
            return
        v = nodes[i]
        bit = 1 << v
        sv = succ[v] & state
        if not sv & ~chosen:  # every successor of v in the state is in the ending
            merged, rest = bit, []
            for c in comps:
                if c & sv:
                    merged |= c
                else:
                    rest.append(c)
            if merged.bit_count() <= r:
                rec(i + 1, chosen | bit, blocked, (*rest, merged))
        rec(i + 1, chosen, blocked | anc[v], comps)

    rec(0, 0, 0, ())
    return out

"""Schedule units: the indivisible things a scheduler places.

A unit is a maximal chain of nodes joined by edges ``u -> v`` where ``v`` is ``u``'s only
reader, ``u`` is ``v``'s only producer, and at least one of the two is *light* (anything but a
dense convolution or a linear layer). So ReLU -> depthwise -> pointwise (RandWire's and
NASNet's separable convolution, one "ReluSepConv" in IOS) is one unit, while a chain of dense
convolutions (an Inception branch) stays a chain of units that can be split across stages and
whose head can be merged with its siblings. Contracting such edges never creates a cycle, and
units ordered by their first node are in topological order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from opsched.ir import Graph, Node

__all__ = ["UnitGraph", "is_heavy"]


def is_heavy(node: Node) -> bool:
    return node.op == "linear" or (node.op == "conv2d" and node.attr("groups", 1) == 1)


@dataclass(frozen=True, eq=False)
class UnitGraph:
    """Units (tuples of node names, in order) with their DAG; unit indices are topological."""

    graph: Graph
    units: tuple[tuple[str, ...], ...]

    @classmethod
    def build(cls, graph: Graph, contract: bool = True, split_heavy: bool = True) -> UnitGraph:
        """``contract``: join chains into units (else one node per unit); ``split_heavy``: keep
        two heavy operators apart (without it, units are the maximal chains between forks and
        joins: PartitionTuner's branches)."""
        n = len(graph.nodes)
        outputs = set(graph.outputs)
        nxt = [-1] * n  # node index -> the next node of its unit
        has_prev = [False] * n
        if contract:
            for i, node in enumerate(graph.nodes):
                succs = graph.succs[i]
                if len(succs) != 1 or node.name in outputs:
                    continue
                j = succs[0]
                if graph.preds[j] != (i,) or len(graph.nodes[j].inputs) != len(set(graph.nodes[j].inputs)):
                    continue
                if split_heavy and is_heavy(node) and is_heavy(graph.nodes[j]):
                    continue
                nxt[i], has_prev[j] = j, True
        units = []
        for i in range(n):
            if has_prev[i]:
                continue
            chain = [i]
            while nxt[chain[-1]] >= 0:
                chain.append(nxt[chain[-1]])
            units.append(tuple(graph.nodes[k].name for k in chain))
        return cls(graph, tuple(units))

    @cached_property
    def unit_of(self) -> dict[str, int]:
        return {v: u for u, names in enumerate(self.units) for v in names}

    @cached_property
    def preds(self) -> tuple[tuple[int, ...], ...]:
        g, unit_of = self.graph, self.unit_of
        out = []
        for u, names in enumerate(self.units):
            ps: dict[int, None] = {}
            for v in names:
                for p in g.preds[g.index[v]]:
                    pu = unit_of[g.nodes[p].name]
                    if pu != u:
                        ps[pu] = None
            out.append(tuple(ps))
        return tuple(out)

    @cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.units]
        for u, ps in enumerate(self.preds):
            for p in ps:
                out[p].append(u)
        return tuple(tuple(s) for s in out)

    def __len__(self) -> int:
        return len(self.units)

"""Schedule units: the indivisible things a scheduler places.

A unit is a maximal chain of nodes joined by edges ``u -> v`` where ``v`` is ``u``'s only
reader, ``u`` is ``v``'s only producer, and at least one of the two is *light* (anything but a
dense convolution or a linear layer). So ReLU -> depthwise -> pointwise (RandWire's and
NASNet's separable convolution, one "ReluSepConv" in IOS) is one unit, while a chain of dense
convolutions (an Inception branch) stays a chain of units that can be split across stages and
whose head can be merged with its siblings. Contracting such edges never creates a cycle, and
units in the order of their chains' first nodes are in topological order.

A node that reads nothing (a constant: an ONNX initializer operand of an add or a mul, a
quantized model's scales; a quantized weight's DequantizeLinear; an ``arange``) with one reader
joins its reader's unit, and is no producer to the chain rule (so a matrix product, its bias add
and the activation after it are one unit, as they are when imported from PyTorch). On its own
it would be a unit with no predecessors that any stage could take, doubling the states of its
part: an ONNX BERT's layer has a dozen, a dynamically quantized one (``onnxruntime.quantization``)
more, whose DP priced 2 of its 7 parts in its 60 s budget; with them absorbed, all 7 in 0.02 s
(analytic cost model, this machine); a statically quantized (QDQ) SqueezeNet has 53, one per
weight. With its reader, a weight's DequantizeLinear also stays in its reader's ONNX Runtime
segment, where ORT fuses the pair into an integer kernel. A unit is then its chain with each
absorbed node right before its reader (where a lane runs it, and what the memory bound of
:mod:`opsched.schedulers.ios_memory` counts); units are ordered by their chain's head, which is
still topological (an absorbed node has no predecessors, so every edge into a unit enters its
chain).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from opsched._toposort import ancestor_masks
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
        # a node that reads nothing (a constant, a weight's DequantizeLinear), read once, goes with
        # its reader and does not count as the reader's producer in the chain rule (module docstring)
        absorbed = {i for i, node in enumerate(graph.nodes) if contract and not node.inputs
                    and len(graph.succs[i]) == 1 and node.name not in outputs}
        nxt = [-1] * n  # node index -> the next node of its chain
        has_prev = [False] * n
        if contract:
            for i, node in enumerate(graph.nodes):
                succs = graph.succs[i]
                if i in absorbed or len(succs) != 1 or node.name in outputs:
                    continue
                j = succs[0]
                if tuple(p for p in graph.preds[j] if p not in absorbed) != (i,) \
                        or len(graph.nodes[j].inputs) != len(set(graph.nodes[j].inputs)):
                    continue
                if split_heavy and is_heavy(node) and is_heavy(graph.nodes[j]):
                    continue
                nxt[i], has_prev[j] = j, True
        reads: dict[int, list[int]] = {}
        for i in sorted(absorbed):
            reads.setdefault(graph.succs[i][0], []).append(i)
        units = []
        for i in range(n):
            if has_prev[i] or i in absorbed:
                continue
            chain = [i]
            while nxt[chain[-1]] >= 0:
                chain.append(nxt[chain[-1]])
            # each absorbed node right before its reader, as a lane will run them (:mod:`.ios_memory`)
            units.append(tuple(graph.nodes[m].name for k in chain for m in (*reads.get(k, ()), k)))
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

    @cached_property
    def crossing(self) -> tuple[int, ...]:
        """Per position q: how many units at positions <= q are read by units after q."""
        n = len(self)
        delta = [0] * (n + 1)
        for u, s in enumerate(self.succs):
            last = max(s, default=u)
            if last > u:
                delta[u] += 1
                delta[last] -= 1
        out, running = [], 0
        for q in range(n):
            running += delta[q]
            out.append(running)
        return tuple(out)

    @cached_property
    def reader_units(self) -> dict[str, tuple[int, ...]]:
        """Value (graph input or node) -> the units whose nodes read it, ascending, each once."""
        unit_of = self.unit_of
        return {v: tuple(sorted({unit_of[r] for r in rs})) for v, rs in self.graph.readers.items()}

    @cached_property
    def live_before(self) -> tuple[tuple[str, ...], ...]:
        """Per position q (0 to ``len(self)``): the values given (graph inputs) or computed by
        units before q that a unit at q or after reads, in the order they are defined. Found in
        one sweep, so a search over many parts asks each its values at no cost of the graph's
        size (a part's cuts: :class:`~opsched.schedulers.ios_part.PartCuts`)."""
        index, unit_of = self.graph.index, self.unit_of
        out: list[list[str]] = [[] for _ in range(len(self) + 1)]
        for v, us in self.reader_units.items():
            made = unit_of[v] if v in index else -1
            for q in range(made + 1, (us[-1] if us else made) + 1):
                out[q].append(v)
        return tuple(tuple(vs) for vs in out)

    def local_masks(self, part: Sequence[int]) -> tuple[list[int], list[int]]:
        """Bitmasks over ``part`` (units in topological order; bit i is ``part[i]``): each unit's
        direct successors and all its ancestors within the part."""
        local = {u: i for i, u in enumerate(part)}
        succ = [sum(1 << local[v] for v in self.succs[u] if v in local) for u in part]
        return succ, ancestor_masks([[local[p] for p in self.preds[u] if p in local] for u in part])

    def __len__(self) -> int:
        return len(self.units)

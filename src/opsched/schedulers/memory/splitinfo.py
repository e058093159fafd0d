"""Algorithm 1 of GraphTurbo, SplitInfo: the smallest number of instances a sub-graph splits into
along the batch so that one instance's live activations fit a level of the memory hierarchy.

An instance's *peak* is the most bytes of activations alive at once while it runs its nodes in
topological order: what it reads from outside the sub-graph (alive until its last reader in the
sub-graph), and each value it computes (alive from its node until its last reader inside, or to
the end where read outside). Values that lead with the batch shrink with the factor; operands
broadcast along the batch do not. Weights are not counted: they stream through, and the traffic
simulator charges each instance for reading them.

The candidates are the divisors of the batch, smallest first (GraphTurbo scans 1, 2, 4, 8, 9, ...
the sizes that divide the dimension); the first whose instance peak fits is taken. A sub-graph with
a node that cannot split (:func:`~opsched.transforms.split_instances.split_refusal`) has factor 1
only. Splits along the spatial extent, with convolution halos, are not made here: every instance
of an opsched plan is a batch slice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from opsched.ir import Graph
from opsched.schedule import graph_batch
from opsched.transforms.split_instances import split_refusal

__all__ = ["SplitInfo", "instance_peak", "split_info", "divisors", "read_outside"]


@dataclass(frozen=True, slots=True)
class SplitInfo:
    """A sub-graph's split: ``factor`` instances whose live activations peak at ``peak`` bytes
    each; ``fits`` whether that is within the capacity asked for (else the factor is the
    largest possible and it still does not fit)."""

    factor: int
    peak: int
    fits: bool


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def instance_peak(graph: Graph, nodes: Iterable[str], factor: int = 1) -> int:
    """Peak bytes of live activations of one of ``factor`` batch instances of ``nodes``."""
    members = sorted(set(nodes), key=graph.index.__getitem__)
    inside = set(members)
    batch = graph_batch(graph)
    types = graph.types

    def size(v: str) -> int:
        t = types[v]
        return t.nbytes // factor if t.rank and t.shape[0] == batch else t.nbytes

    last: dict[str, int] = {}
    for k, v in enumerate(members):
        for u in graph.node(v).inputs:
            last[u] = k
    exported = read_outside(graph, inside)
    live = sum(size(u) for u in last if u not in inside)  # read from outside: alive from the start
    peak = live
    for k, v in enumerate(members):
        live += size(v)
        peak = max(peak, live)
        for u in dict.fromkeys(graph.node(v).inputs):
            if last[u] == k and u not in exported:
                live -= size(u)
        if v not in last and v not in exported:
            live -= size(v)  # read by no one inside and no one outside: dead at once
    return peak


def read_outside(graph: Graph, inside: set[str]) -> set[str]:
    """The values of ``inside`` that a node outside it reads, or that are graph outputs."""
    index, nodes = graph.index, graph.nodes
    return {v for v in inside if v in graph.outputs or any(nodes[s].name not in inside for s in graph.succs[index[v]])}


def split_info(graph: Graph, nodes: Iterable[str], capacity: int, max_factor: int | None = None) -> SplitInfo:
    """Algorithm 1: the smallest factor (a divisor of the batch, at most ``max_factor``) whose
    instance peak fits ``capacity``; the largest allowed, marked not fitting, where none does."""
    members = tuple(nodes)
    batch = graph_batch(graph)
    splittable = all(split_refusal(graph, graph.node(v), batch) is None for v in members)
    candidates = [f for f in divisors(batch) if max_factor is None or f <= max_factor] if splittable else [1]
    for f in candidates:
        peak = instance_peak(graph, members, f)
        if peak <= capacity:
            return SplitInfo(f, peak, True)
    return SplitInfo(candidates[-1], instance_peak(graph, members, candidates[-1]), False)

"""Algorithm 1 of GraphTurbo, SplitInfo: the smallest number of instances a sub-graph splits into
along the batch so that one instance's live activations fit a level of the memory hierarchy.

An instance's *peak* is the most bytes of activations alive at once while it runs its nodes in
topological order: what it reads from outside the sub-graph (alive until its last reader in the
sub-graph), and each value it computes (alive from its node until its last reader inside, or to
the end where read outside). Values that lead with the batch shrink with the factor; operands
broadcast along the batch do not. Weights are not counted: they stream through, and the traffic
simulator charges each instance for reading them.

The candidates are the divisors of the batch, smallest first (GraphTurbo scans 1, 2, 4, 8, 9, ...
the sizes that divide the dimension); the first whose instance peak fits is taken. Where the batch
offers no split (at batch 1, or a node that cannot split along it), the rows are tried: 2, 3, 4,
... bands of the height, each instance computing its band with the halos its windows need
(:mod:`opsched.transforms.halos`), its peak that of its nodes in the rewritten sub-graph
(explicit padding at the edges included). A sub-graph with a node that cannot split along an axis
(:func:`~opsched.transforms.split_instances.split_refusal`,
:func:`~opsched.transforms.halos.row_refusal`) has no candidate along it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from opsched.errors import InvalidScheduleError
from opsched.ir import Graph
from opsched.schedule import graph_batch
from opsched.transforms.halos import ROW_AXIS, RowPlan, row_plan, row_refusal
from opsched.transforms.split_instances import Split, split_graph, split_refusal

#: The most bands of rows tried for one sub-graph.
MAX_ROW_FACTOR = 32

__all__ = ["SplitInfo", "instance_peak", "split_info", "divisors", "read_outside"]


@dataclass(frozen=True, slots=True)
class SplitInfo:
    """A sub-graph's split: ``factor`` instances along ``axis`` (0: the batch, 2: the rows) whose
    live activations peak at ``peak`` bytes each; ``fits`` whether that is within the capacity
    asked for (else the factor is the largest along the batch and it still does not fit);
    ``recompute`` the FLOPs of the instances over the sub-graph's (above 1 for halos)."""

    factor: int
    peak: int
    fits: bool
    axis: int = 0
    recompute: float = 1.0


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def instance_peak(graph: Graph, nodes: Iterable[str], factor: int = 1, rows: RowPlan | None = None) -> int:
    """Peak bytes of live activations of one of ``factor`` batch instances of ``nodes``; with
    ``rows``, of the largest of its instances along the rows."""
    if rows is not None:
        plan = rows
        return max(_peak(graph, nodes, functools.partial(_band_bytes, graph, plan, i=i)) for i in range(plan.factor))
    batch = graph_batch(graph)
    types = graph.types

    def size(v: str) -> int:
        t = types[v]
        return t.nbytes // factor if t.rank and t.shape[0] == batch else t.nbytes
    return _peak(graph, nodes, size)


def _band_bytes(graph: Graph, rows: RowPlan, v: str, *, i: int) -> int:
    """The bytes of ``v`` instance ``i`` of a row split holds: the rows it computes or reads."""
    t = graph.types[v]
    band = rows.computes.get(v) or rows.outside.get(v)
    if band is None:  # broadcast along the rows: read whole
        return t.nbytes
    a, b = band[i]
    return t.nbytes * (b - a) // t.shape[ROW_AXIS]


def _peak(graph: Graph, nodes: Iterable[str], size: Callable[[str], int]) -> int:
    members = sorted(set(nodes), key=graph.index.__getitem__)
    inside = set(members)
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
    """Algorithm 1: the smallest factor along the batch (a divisor of it, at most ``max_factor``)
    whose instance peak fits ``capacity``; where the batch cannot split, the fewest bands of rows
    whose instances fit; the largest factor along the batch, marked not fitting, where none does.
    (A batch that does not fit is not cut into bands of rows instead: at batch 8 on a 2-core CPU
    with 2 MiB L2 that took 14 to 19 bands, and SqueezeNet and ResNet-18 ran about 10% slower
    than with those sub-graphs left whole.)"""
    members = tuple(nodes)
    batch = graph_batch(graph)
    splittable = all(split_refusal(graph, graph.node(v), batch) is None for v in members)
    candidates = [f for f in divisors(batch) if max_factor is None or f <= max_factor] if splittable else [1]
    for f in candidates:
        peak = instance_peak(graph, members, f)
        if peak <= capacity:
            return SplitInfo(f, peak, True)
    if candidates == [1]:  # no split along the batch: try the rows
        along_rows = _row_split(graph, members, capacity, max_factor)
        if along_rows is not None:
            return along_rows
    return SplitInfo(candidates[-1], instance_peak(graph, members, candidates[-1]), False)


def _row_split(graph: Graph, members: tuple[str, ...], capacity: int, max_factor: int | None) -> SplitInfo | None:
    """The fewest bands of rows whose instances fit, or ``None``."""
    if any(row_refusal(graph, graph.node(v)) is not None for v in members):
        return None
    for f in range(2, min(MAX_ROW_FACTOR, max_factor or MAX_ROW_FACTOR) + 1):
        try:
            plan = row_plan(graph, members, f)
        except InvalidScheduleError:  # fewer rows than bands, or a band with none of a node's rows
            return None
        if instance_peak(graph, members, rows=plan) <= capacity:  # a lower bound: the bands alone
            peak = _row_instance_peak(graph, members, f)
            if peak <= capacity:
                return SplitInfo(f, peak, True, ROW_AXIS, plan.recompute(graph))
    return None


def _row_instance_peak(graph: Graph, members: tuple[str, ...], factor: int) -> int:
    """The largest instance peak of the sub-graph rewritten with ``factor`` bands of rows: its
    explicit padding and slices of other instances' rows counted too (as copies)."""
    split = split_graph(graph.subgraph(members), [Split(members, factor, ROW_AXIS)])
    owned: dict[int, list[str]] = {}
    for name, (_, i) in split.owner.items():
        owned.setdefault(i, []).append(name)
    return max(instance_peak(split.graph, names) for names in owned.values())

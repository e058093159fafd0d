"""What cutting one-lane segments costs a stage schedule (:class:`opsched.cost.SegmentCut`).

A plan runs consecutive one-group stages as one segment and a stage of several groups as a
phase of its own (:mod:`opsched.runtime.plan`), so each such stage ends the segment before it
and starts another after it. Where a backend charges for that (ONNX Runtime: a call, and
converting every value that crosses the cut out of its blocked layout and back), a schedule
costs its stages' prices plus, per stage of several groups, ``resume_ms``, ``leave_ms`` of each
value live before the stage and ``enter_ms`` of each value live after it
(:func:`opsched.ir.analysis.live_values`). Two such stages in a row are charged as if a
segment stood between them: an upper bound, as their lanes already convert what they read and
write.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

from opsched.cost.base import SegmentCut
from opsched.ir import Graph
from opsched.schedule import Stage

__all__ = ["cut_latency"]


def cut_latency(graph: Graph, stages: Iterable[Stage], cut: SegmentCut | None, done: Iterable[str] = ()) -> float:
    """The cut costs of running ``stages`` in order after the nodes ``done``."""
    stages = list(stages)
    if cut is None or not any(_cuts(stage) for stage in stages):
        return 0.0
    live = _Live(graph, set(done), cut.leave_ms.keys() | cut.enter_ms.keys())
    total = 0.0
    for stage in stages:
        if _cuts(stage):
            total += cut.resume_ms + live.cost(cut.leave_ms)
            live.run(stage.nodes)
            total += live.cost(cut.enter_ms)
        else:
            live.run(stage.nodes)
    return total


def _cuts(stage: Stage) -> bool:
    return stage.strategy == "parallel" and len(stage.groups) > 1


class _Live:
    """The values live as nodes run (:func:`opsched.ir.analysis.live_values`, of the values
    ``priced`` alone, kept up to date node by node): a value is live once it is given or
    computed, until every node that reads it has run. Each update costs the nodes run and their
    inputs, not the graph (the search prices thousands of schedules of parts of one graph: with
    the live values found afresh at each cut, TimesFM 2.5's 27,365 nodes took 931 s of them)."""

    def __init__(self, graph: Graph, done: set[str], priced: Collection[str]) -> None:
        self.graph, self.done = graph, done
        readers = graph.readers
        self.waiting = {v: sum(r not in done for r in readers[v]) for v in priced if v in readers}
        self.live = {v for v, n in self.waiting.items() if n and (v in done or v not in graph.index)}

    def run(self, nodes: Iterable[str]) -> None:
        for name in nodes:
            self.done.add(name)
            if self.waiting.get(name):
                self.live.add(name)
            for v in dict.fromkeys(self.graph.node(name).inputs):
                if v in self.waiting:
                    self.waiting[v] -= 1
                    if not self.waiting[v]:
                        self.live.discard(v)

    def cost(self, costs: Mapping[str, float]) -> float:
        return sum(costs.get(v, 0.0) for v in self.live)

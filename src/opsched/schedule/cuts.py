"""What cutting one-lane segments costs a stage schedule (:class:`opsched.cost.SegmentCut`).

A plan runs consecutive one-group stages as one segment and a stage of several groups as a
phase of its own (:mod:`opsched.runtime.plan`), so each such stage ends the segment before it
and starts another after it. Where a backend charges for that (ONNX Runtime: a call, and
converting every value that crosses the cut out of its blocked layout and back), a schedule
costs its stages' prices plus, per stage of several groups, ``resume_ms``, ``leave_ms`` of each
value live before the stage and ``enter_ms`` of each value live after it. A value is *live*
at a point when it has been computed (or is a graph input) and some node after the point
reads it. Two such stages in a row are charged as if a segment stood between them: an upper
bound, as their lanes already convert what they read and write.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from opsched.cost.base import SegmentCut
from opsched.ir import Graph
from opsched.schedule.types import Stage

__all__ = ["live_values", "cut_latency"]


def live_values(graph: Graph, done: set[str]) -> list[str]:
    """Values computed in ``done`` or given (graph inputs) that a node not in ``done`` reads, in
    the order they are defined."""
    wanted = {v for n in graph.nodes if n.name not in done for v in n.inputs}
    return [v for v in (*(i.name for i in graph.inputs), *(n.name for n in graph.nodes))
            if v in wanted and (v in done or v not in graph.index)]


def cut_latency(graph: Graph, stages: Iterable[Stage], cut: SegmentCut | None, done: Iterable[str] = ()) -> float:
    """The cut costs of running ``stages`` in order after the nodes ``done``."""
    if cut is None:
        return 0.0
    finished = set(done)
    total = 0.0
    for stage in stages:
        if stage.strategy == "parallel" and len(stage.groups) > 1:
            total += cut.resume_ms + _sum(cut.leave_ms, live_values(graph, finished))
            finished.update(stage.nodes)
            total += _sum(cut.enter_ms, live_values(graph, finished))
        else:
            finished.update(stage.nodes)
    return total


def _sum(costs: Mapping[str, float], values: Sequence[str]) -> float:
    return sum(costs.get(v, 0.0) for v in values)

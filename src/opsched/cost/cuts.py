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

from collections.abc import Iterable, Mapping, Sequence

from opsched.cost.base import SegmentCut
from opsched.ir import Graph
from opsched.ir.analysis import live_values
from opsched.schedule import Stage

__all__ = ["cut_latency"]


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

"""The resource model behind any cost model: durations priced by it, demands borrowed from the
analytic preset of its device (:mod:`opsched.cost.resources`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from opsched.cost.analytic import AnalyticCostModel
from opsched.cost.base import CostModel
from opsched.cost.coster import StageCoster
from opsched.cost.devices import device_spec, preset_for
from opsched.cost.resources import OpDemand, ResourceModel
from opsched.ir import Graph
from opsched.schedule import Stage

__all__ = ["resources_for"]


def resources_for(graph: Graph, cost: CostModel, demands: str | None = None,
                  merges: Iterable[Sequence[str]] = ()) -> ResourceModel:
    """The resource model behind ``cost``: its own if it is analytic; otherwise durations priced
    by ``cost`` (each operator, and each of ``merges``, as a stage of its own; structurally equal
    ones are priced once) with the demands of the analytic preset ``demands`` (default: the cost
    model's device if it is a preset or names a GPU preset, else this machine's CPU), and, if
    ``cost`` charges segment cuts, each operator's fork cost: the cut's resume and the
    conversions of the values it reads and writes (at least these cross the cut)."""
    merges = [tuple(m) for m in merges]
    if isinstance(cost, AnalyticCostModel) and demands is None:
        return cost.resources(graph, merges)
    spec = device_spec(demands) if demands is not None else preset_for(cost.device)
    shape = AnalyticCostModel(spec).resources(graph, merges)
    coster = StageCoster(graph, cost)
    stages = {n.name: Stage(((n.name,),)) for n in graph.nodes}
    stages.update({"+".join(m): Stage(tuple((v,) for v in m), "merge") for m in merges})
    ops: dict[str, OpDemand] = {}
    cut = coster.segment_cut
    for key, stage in stages.items():
        alone = shape[key]
        duration = coster.latency(stage) if alone.duration_ms > 0 else 0.0
        fork = 0.0
        if cut is not None:
            members = [graph.node(v) for v in stage.nodes]
            reads = {x for n in members for x in n.inputs} - {n.name for n in members}
            fork = (cut.resume_ms + sum(cut.leave_ms.get(v, 0.0) for v in reads)
                    + sum(cut.enter_ms.get(n.name, 0.0) for n in members))
        ops[key] = OpDemand(max(duration, 0.0), alone.demand, fork)
    return ResourceModel(ops, shape.overlap, shape.barrier_ms, cost.device, shape.oversubscribe)

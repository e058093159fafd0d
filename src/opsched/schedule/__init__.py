"""Schedules and schedulers.

Every scheduler is a function ``(graph, cost, **options) -> Schedule`` registered by name::

    from opsched.schedule import schedule
    sched = schedule(graph, "ios", AnalyticCostModel("V100"), max_group_size=3, max_groups=8)
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from typing import Any

from opsched.cost.base import CostModel
from opsched.cost.resources import resources_for
from opsched.errors import ScheduleError
from opsched.ir import Graph
from opsched.schedule.coster import StageCoster
from opsched.schedule.cuts import cut_latency
from opsched.schedule.est import choose_merges, est_lanes
from opsched.schedule.greedy import greedy_stages
from opsched.schedule.ios import SearchStats, ios_stages
from opsched.schedule.sequential import sequential_stages
from opsched.schedule.streams import nimble_lanes, opara_lanes
from opsched.schedule.types import Schedule, Stage, graph_batch
from opsched.schedule.units import UnitGraph

__all__ = ["SCHEDULERS", "Schedule", "Stage", "estimate", "register_scheduler", "schedule", "scheduler_names",
           "scheduler_options"]

Scheduler = Callable[..., Schedule]
SCHEDULERS: dict[str, Scheduler] = {}


def register_scheduler(name: str) -> Callable[[Scheduler], Scheduler]:
    def deco(fn: Scheduler) -> Scheduler:
        SCHEDULERS[name] = fn
        return fn
    return deco


def scheduler_names() -> list[str]:
    return list(SCHEDULERS)


def _scheduler(name: str) -> Scheduler:
    try:
        return SCHEDULERS[name]
    except KeyError:
        raise ScheduleError(f"no scheduler {name!r}; available: {', '.join(SCHEDULERS)}") from None


def scheduler_options(name: str) -> list[str]:
    """The options scheduler ``name`` takes."""
    return [p for p in inspect.signature(_scheduler(name)).parameters if p not in ("graph", "cost")]


def schedule(graph: Graph, scheduler: str, cost: CostModel, **options: Any) -> Schedule:
    """Run scheduler ``scheduler`` on ``graph``; the result is validated before it is returned."""
    graph.verify()
    fn, accepted = _scheduler(scheduler), scheduler_options(scheduler)
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ScheduleError(f"scheduler {scheduler!r} has no option(s) {unknown}; it takes {accepted}")
    return fn(graph, cost, **options).validate(graph)


def estimate(graph: Graph, stages: list[Stage], cost: CostModel | StageCoster) -> float:
    """The cost model's latency of a stage list: the sum of its stages (the IOS model), plus, where
    the model charges for them, the segments its stages of several groups cut (:mod:`.cuts`)."""
    coster = cost if isinstance(cost, StageCoster) else StageCoster(graph, cost)
    return sum(coster.latency(s) for s in stages) + cut_latency(graph, stages, coster.segment_cut)


def _lanes(graph: Graph, cost: CostModel, lanes: list[list[str]], name: str) -> Schedule:
    return Schedule(graph_hash=graph.structural_hash(), lanes=tuple(tuple(lane) for lane in lanes),
                    graph_name=graph.name, batch=graph_batch(graph), device=cost.device, scheduler=name,
                    stats={"lanes": len(lanes)})


def _make(graph: Graph, cost: CostModel, stages: list[Stage], name: str, options: dict[str, Any],
          stats: dict[str, Any] | None = None, coster: StageCoster | None = None) -> Schedule:
    return Schedule(graph_hash=graph.structural_hash(), stages=tuple(stages), graph_name=graph.name,
                    batch=graph_batch(graph), device=cost.device, scheduler=name, options=options,
                    estimated_ms=estimate(graph, stages, coster or cost), stats=stats or {})


@register_scheduler("sequential")
def sequential_scheduler(graph: Graph, cost: CostModel) -> Schedule:
    """One unit per stage, in topological order."""
    return _make(graph, cost, sequential_stages(graph), "sequential", {})


@register_scheduler("greedy")
def greedy_scheduler(graph: Graph, cost: CostModel, max_streams: int = 10) -> Schedule:
    """IOS's wavefront: every ready unit at once, at most ``max_streams`` per stage."""
    return _make(graph, cost, greedy_stages(graph, max_streams), "greedy", {"max_streams": max_streams})


@register_scheduler("ios")
def ios_scheduler(graph: Graph, cost: CostModel, max_group_size: int = 3, max_groups: int = 8, max_part_size: int = 50,
        strategies: tuple[str, ...] = ("parallel", "merge"), budget_s: float | None = None,
        max_stage_costs: int | None = None,
        progress: Callable[[int, int, str], None] | None = None) -> Schedule:
    """The IOS dynamic program; see :mod:`opsched.schedule.ios`."""
    coster = StageCoster(graph, cost)
    stages, stats = ios_stages(graph, cost, max_group_size=max_group_size, max_groups=max_groups,
                               max_part_size=max_part_size, strategies=tuple(strategies), budget_s=budget_s,
                               max_stage_costs=max_stage_costs, coster=coster, progress=progress)
    options = {"max_group_size": max_group_size, "max_groups": max_groups, "max_part_size": max_part_size,
               "strategies": list(strategies), "budget_s": budget_s, "max_stage_costs": max_stage_costs}
    return _make(graph, cost, stages, "ios", options, stats.as_dict(), coster)


@register_scheduler("est")
def est_scheduler(graph: Graph, cost: CostModel, max_lanes: int | None = 8, merge: bool = True,
                  demands: str | None = None) -> Schedule:
    """Early-start-time-first list scheduling on lanes; see :mod:`opsched.schedule.est`."""
    began = time.perf_counter()
    merges = choose_merges(graph, StageCoster(graph, cost)) if merge else []
    resources = resources_for(graph, cost, demands, merges)
    priced = time.perf_counter()
    plan = est_lanes(graph, resources, max_lanes, merges)
    done = time.perf_counter()
    lane_of = {v: k for k, lane in enumerate(plan.lanes) for v in lane}
    cross = sum(1 for v, k in lane_of.items() for u in graph.node(v).inputs if lane_of.get(u, k) != k)
    return Schedule(graph_hash=graph.structural_hash(), lanes=plan.lanes, waits=plan.waits, merges=plan.merges,
                    graph_name=graph.name, batch=graph_batch(graph), device=cost.device, scheduler="est",
                    options={"max_lanes": max_lanes, "merge": merge, "demands": demands},
                    estimated_ms=plan.makespan_ms,
                    stats={"lanes": len(plan.lanes), "merges": len(merges), "events": cross, "waits": len(plan.waits),
                           "pricing_seconds": priced - began, "seconds": done - priced})


@register_scheduler("nimble")
def nimble_scheduler(graph: Graph, cost: CostModel) -> Schedule:
    """Nimble's lanes: a minimum chain decomposition; see :mod:`opsched.schedule.streams`."""
    return _lanes(graph, cost, nimble_lanes(graph), "nimble")


@register_scheduler("opara")
def opara_scheduler(graph: Graph, cost: CostModel) -> Schedule:
    """Opara's lanes: each node inherits a producer's lane once; see :mod:`opsched.schedule.streams`."""
    return _lanes(graph, cost, opara_lanes(graph), "opara")


__all__ += ["SearchStats", "UnitGraph"]

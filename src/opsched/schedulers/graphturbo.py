"""``graphturbo``: memory-hierarchy-aware scheduling of sub-graph instances (GraphTurbo, OSDI 2023).

Where inter-operator concurrency stops paying (large batches), the time goes to moving
activations that outgrow the caches through DRAM, layer after layer. This scheduler groups the
graph into sub-graphs (Algorithm 2) whose batch instances fit a core's cache (Algorithm 1) and,
by default, cost less than the whole sub-graph in the estimate (on a GPU, the paper's rule of
splitting whatever fits ran 0.52-0.85x of the single-stream graph at batch 64-128, H200),
orders the instances depth-first so that what an instance writes is read while it is still
cached (Algorithm 3), and binds instances to cores, one lane each, contiguous batch slices per
core (Algorithm 4). The schedule's ``splits`` carry the grouping; its lanes name the instance
nodes (``conv@3``), so it lowers and runs on every backend like any other schedule, and its
estimate is the traffic simulator's (:mod:`opsched.schedulers.memory.traffic`).

At batch 1 a sub-graph whose activations outgrow the cache splits into bands of rows instead,
each instance recomputing the halo rows its convolutions and pools need.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from opsched.cost import CostModel, MeasuredCostModel
from opsched.cost.hierarchy import Hierarchy, hierarchy, hierarchy_for
from opsched.cost.measured import Calibrations
from opsched.errors import ScheduleError
from opsched.ir import Graph
from opsched.schedule import Schedule
from opsched.schedulers.memory import (
    Group,
    SplitInfo,
    bind,
    breadth_first,
    depth_first,
    group_nodes,
    instance_dag,
    simulate,
    split_pays,
)
from opsched.schedulers.registry import Progress, SchedulerSpec, laned, option, positive, register

__all__ = ["GraphTurboOptions", "graphturbo_groups"]

ORDERS = ("depth-first", "breadth-first")
SPLIT_WHEN = ("pays", "fits")


@dataclass(frozen=True)
class GraphTurboOptions:
    hierarchy: str = option("", "memory hierarchy preset (cpu, cpu-measured, H100, H200, A100, V100); '': the cost "
                                "model's device, its CPU bandwidths measured where the cost model measures")
    max_lanes: int | None = option(None, "cores to bind instances to, one lane each; None: the hierarchy's cores")
    order: str = option("depth-first", "instance order: depth-first (GraphTurbo) or breadth-first (layer by layer)")
    grouping: bool = option(True, "merge nodes into sub-graphs (off: every node its own sub-graph)")
    split: bool = option(True, "split sub-graphs into batch instances that fit the cache (off: factor 1)")
    split_when: str = option("pays", "which sub-graphs split: 'pays' where the cost estimate prices the instances "
                                     "below the whole sub-graph (a GPU's SMs left idle by a slice of the batch "
                                     "count), 'fits' every one whose instances fit (the paper)")
    max_factor: int | None = option(None, "most instances per sub-graph; None: up to the batch")

    def __post_init__(self) -> None:
        positive("graphturbo", "max_lanes", self.max_lanes, allow_none=True)
        positive("graphturbo", "max_factor", self.max_factor, allow_none=True)
        if self.split_when not in SPLIT_WHEN:
            raise ScheduleError(f"option split_when of scheduler 'graphturbo' must be one of {SPLIT_WHEN}, "
                                f"got {self.split_when!r}")
        if self.order not in ORDERS:
            raise ScheduleError(f"option order of scheduler 'graphturbo' must be one of {ORDERS}, got {self.order!r}")


def graphturbo_groups(graph: Graph, options: GraphTurboOptions, device: str,
                      calibrations: Calibrations | None = None,
                      progress: Progress | None = None) -> tuple[list[Group], Hierarchy]:
    """The sub-graphs with their factors, and the hierarchy they were made for (``device``'s,
    measured through ``calibrations`` where given, unless the options name one)."""
    h = (hierarchy(options.hierarchy) if options.hierarchy
         else hierarchy_for(device, calibrations=calibrations, progress=progress))
    if options.max_lanes is not None:
        h = dataclasses.replace(h, cores=options.max_lanes)
    found = group_nodes(graph, h, max_factor=options.max_factor, max_rounds=64 if options.grouping else 0)

    def split(nodes: tuple[str, ...], info: SplitInfo) -> bool:
        return options.split and info.fits and (options.split_when == "fits" or split_pays(graph, nodes, info, h))

    return [Group(nodes, info.factor, info.axis) if split(nodes, info) else Group(nodes) for nodes, info in found], h


def _graphturbo(graph: Graph, cost: CostModel, options: GraphTurboOptions, progress: Progress | None) -> Schedule:
    calibrations = cost if isinstance(cost, MeasuredCostModel) else None
    groups, h = graphturbo_groups(graph, options, cost.device, calibrations, progress)
    dag = instance_dag(graph, groups)
    order = (depth_first if options.order == "depth-first" else breadth_first)(dag.preds)
    binding = bind(dag, order, h.cores)
    traffic = simulate(dag, order, binding, h)
    split = [g for g in groups if g.factor > 1]
    stats = {"groups": len(groups), "split groups": len(split), "instances": len(dag.units),
             "factors": sorted({g.factor for g in split}), "row splits": sum(1 for g in split if g.axis),
             "hierarchy": h.name,
             "simulated MiB": {k: round(v / 2**20, 1) for k, v in traffic.bytes.items()}}
    return laned(graph, cost, binding.lanes(dag, order, h.cores), "graphturbo", options,
                 estimated_ms=traffic.latency_ms, stats=stats, splits=dag.splits)


def summarize(stats: Any) -> str:
    if "groups" not in stats:
        return ""
    factors = ", ".join(map(str, stats.get("factors", []))) or "none"
    rows = f", {stats['row splits']} along the rows" if stats.get("row splits") else ""
    return (f"{stats['groups']} sub-graphs, {stats['split groups']} split (factors {factors}{rows}) into "
            f"{stats['instances']} units for {stats['hierarchy']}")


def _defaults(device_type: str, cores: int) -> dict[str, Any]:
    return {"max_lanes": cores} if device_type == "cpu" else {"max_lanes": 1}


register(SchedulerSpec("graphturbo", _graphturbo, GraphTurboOptions,
                       "GraphTurbo's sub-graph instances: split to fit the cache, depth-first, bound to cores",
                       _defaults, summarize))

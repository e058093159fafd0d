"""Per-layer profiled placement, PartitionTuner's second baseline (MOSAIC-like): every operator
goes to the unit where its own profiled time is least, as if operators ran independently:
neither fusion nor the copies a switch of unit needs are priced. Each unit runs its nodes in
topological order."""

from __future__ import annotations

from opsched.cost import CostModel
from opsched.cost.unit_costs import UnitCosts
from opsched.ir import Graph
from opsched.schedule import Schedule
from opsched.schedulers.placement import PlacementOptions, placed_schedule, unit_costs
from opsched.schedulers.registry import Progress, SchedulerSpec, register

__all__ = ["profiled_placement"]


def profiled_placement(graph: Graph, costs: UnitCosts) -> dict[str, str]:
    """Each node on its fastest unit; ties go to the default unit, then in the platform's order."""
    platform = costs.platform
    names = sorted(platform.names, key=lambda u: u != platform.default)
    return {n.name: min(names, key=lambda u: costs.exec_ms(n.name, u)) for n in graph.nodes}


def _profiled(graph: Graph, cost: CostModel, options: PlacementOptions, progress: Progress | None) -> Schedule:
    _, costs = unit_costs(graph, cost, options)
    return placed_schedule(graph, costs, profiled_placement(graph, costs), [n.name for n in graph.nodes],
                           "profiled", options)


register(SchedulerSpec("profiled", _profiled, PlacementOptions,
                       "per-layer profiled placement: each op to its fastest unit, copies ignored "
                       "(placement baseline)"))

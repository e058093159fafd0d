"""Static type-based placement, PartitionTuner's first baseline: every operator goes to the
first unit other than the default that supports its kind, the rest to the default unit; an
operator that the unit of its producer fuses with it follows it there. Each unit runs its
nodes in topological order. No profile is read."""

from __future__ import annotations

from opsched.cost import CostModel
from opsched.cost.unit_costs import UnitCosts
from opsched.ir import Graph
from opsched.schedule import Schedule
from opsched.schedulers.placement import PlacementOptions, placed_schedule, unit_costs
from opsched.schedulers.registry import Progress, SchedulerSpec, register

__all__ = ["type_based_placement"]


def type_based_placement(graph: Graph, costs: UnitCosts) -> dict[str, str]:
    platform = costs.platform
    others = [u.name for u in platform.units if u.name != platform.default]
    unit_of: dict[str, str] = {}
    for node in graph.nodes:
        producers = [u for u in node.inputs if u in graph.index]
        if len(producers) == 1 and costs.fusable((producers[0], node.name), unit_of[producers[0]]):
            unit_of[node.name] = unit_of[producers[0]]
            continue
        unit_of[node.name] = next((u for u in others if costs.runs(node.name, u)), platform.default)
    return unit_of


def _type_based(graph: Graph, cost: CostModel, options: PlacementOptions, progress: Progress | None) -> Schedule:
    _, costs = unit_costs(graph, cost, options)
    return placed_schedule(graph, costs, type_based_placement(graph, costs), [n.name for n in graph.nodes],
                           "type-based", options)


register(SchedulerSpec("type-based", _type_based, PlacementOptions,
                       "static type-based placement: each op to the first unit that supports it (placement baseline)"))

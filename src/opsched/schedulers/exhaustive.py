"""The exhaustive optimum over placements, for small graphs: every assignment of operators to
units that can run them, each unit running its nodes in topological order, replayed by the unit
simulator; the least makespan wins. Operators only one unit runs are fixed there, and those that
cost nothing (views, constants) follow their first producer. The optimum is over placements with
that order, the order PartitionTuner and the other baselines use; list schedulers that also
choose the order (HEFT, PEFT) can come out below it."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from opsched.cost import CostModel
from opsched.cost.unit_costs import UnitCosts
from opsched.cost.units import costs_nothing
from opsched.errors import ScheduleError
from opsched.ir import Graph
from opsched.schedule import Schedule
from opsched.schedulers.placement import PlacementOptions, placed_schedule, placement_makespan, unit_costs
from opsched.schedulers.registry import Progress, SchedulerSpec, option, positive, register

__all__ = ["ExhaustiveOptions", "exhaustive_placement"]


@dataclass(frozen=True)
class ExhaustiveOptions(PlacementOptions):
    max_placements: int = option(1 << 16, "refuse graphs with more placements than this to try")

    def __post_init__(self) -> None:
        positive("exhaustive", "max_placements", self.max_placements)


def exhaustive_placement(graph: Graph, costs: UnitCosts, max_placements: int = 1 << 16,
                         progress: Progress | None = None) -> tuple[dict[str, str], int]:
    """The best placement and how many were tried."""
    platform = costs.platform
    order = [n.name for n in graph.nodes]
    choices = {v: [u for u in platform.names if costs.runs(v, u)] for v in order if not costs_nothing(graph.node(v))}
    movable = [v for v, us in choices.items() if len(us) > 1]
    total = math.prod(len(choices[v]) for v in movable)
    if total > max_placements:
        raise ScheduleError(f"exhaustive: graph {graph.name!r} has {len(movable)} operators that several units run, "
                            f"{total} placements; the limit is max_placements={max_placements}")
    fixed = {v: us[0] for v, us in choices.items() if len(us) == 1}
    best: tuple[float, dict[str, str]] = (math.inf, {})
    for k, picks in enumerate(itertools.product(*(choices[v] for v in movable))):
        unit_of = {**fixed, **dict(zip(movable, picks))}
        for v in order:
            if v not in unit_of:  # free: with its first producer
                first = next((u for u in graph.node(v).inputs if u in unit_of), None)
                unit_of[v] = unit_of[first] if first else platform.default
        span = placement_makespan(costs, unit_of, order)
        if span < best[0]:
            best = (span, unit_of)
        if progress is not None and k % 256 == 0:
            progress(k, total, f"best {best[0]:.3f} ms")
    return best[1], total


def _exhaustive(graph: Graph, cost: CostModel, options: ExhaustiveOptions, progress: Progress | None) -> Schedule:
    _, costs = unit_costs(graph, cost, options)
    unit_of, tried = exhaustive_placement(graph, costs, options.max_placements, progress)
    return placed_schedule(graph, costs, unit_of, [n.name for n in graph.nodes], "exhaustive", options,
                           {"placements": tried})


register(SchedulerSpec("exhaustive", _exhaustive, ExhaustiveOptions,
                       "the best placement of all, tried one by one, for small graphs (placement baseline)"))

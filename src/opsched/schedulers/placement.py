"""What the placement schedulers share: their options and how a placement becomes a schedule.

A placement scheduler decides, for each node, the processing unit of a platform
(:mod:`opsched.cost.units`) that runs it, and the order in which each unit runs its nodes. Its
schedule has one lane per unit that runs something, the lane's ``device`` the unit's name and its
``backend`` the unit's backend; ``options["platform"]`` names the platform. Every placement
scheduler's estimate is the replay of its schedule by the unit simulator
(:mod:`.placed_sim`), so they are compared on one model whatever each optimised.

The platform and the per-unit cost models come from the cost model where it is a
:class:`~opsched.cost.unit_costs.PlatformCost`, else from the ``platform`` option (each unit
priced by its analytic preset).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsched.cost import CostModel
from opsched.cost.unit_costs import PlatformCost, UnitCosts, platform_cost
from opsched.errors import ScheduleError
from opsched.ir import Graph
from opsched.schedule import Lane, Schedule, graph_batch, input_types
from opsched.schedulers.placed_sim import replay, simulate_placed
from opsched.schedulers.registry import option
from opsched.schedulers.tasks import GraphTasks, TaskSchedule

__all__ = ["PlacementOptions", "unit_costs", "placement_lanes", "placement_makespan", "placed_schedule", "placed_tasks"]


@dataclass(frozen=True)
class PlacementOptions:
    platform: str | None = option(None, "the processing units to place operators on: a platform preset "
                                        "(cpu+npu, cpu-pools, cpu+cuda); None: the cost model's own platform, "
                                        "else cpu+cuda where a GPU is present and cpu-pools where not")


def unit_costs(graph: Graph, cost: CostModel, options: PlacementOptions) -> tuple[PlatformCost, UnitCosts]:
    pc = platform_cost(cost, options.platform)
    return pc, UnitCosts(graph, pc)


def placement_lanes(costs: UnitCosts, unit_of: Mapping[str, str], order: Sequence[str]) -> tuple[Lane, ...]:
    """One lane per unit that runs something (in the platform's order), each with its nodes in
    the order ``order`` gives them."""
    lanes = []
    for unit in costs.platform.units:
        nodes = tuple(v for v in order if unit_of[v] == unit.name)
        if nodes:
            lanes.append(Lane(nodes, unit.name, unit.backend))
    return tuple(lanes)


def placement_makespan(costs: UnitCosts, unit_of: Mapping[str, str], order: Sequence[str]) -> float:
    """The unit simulator's makespan of a placement whose units run their nodes in ``order``
    (which must be topological; nothing is validated, for searches that replay many)."""
    probe = Schedule(costs.graph.structural_hash(), placement_lanes(costs, unit_of, order))
    return replay(probe, costs).makespan_ms


def placed_schedule(graph: Graph, costs: UnitCosts, unit_of: Mapping[str, str], order: Sequence[str], name: str,
                    options: Any, stats: Mapping[str, Any] | None = None) -> Schedule:
    """The schedule of :func:`placement_lanes`, estimated by the unit simulator."""
    platform = costs.platform
    for v in order:
        if not costs.runs(v, unit_of[v]):
            raise ScheduleError(f"{name}: node {v!r} ({graph.node(v).op}) placed on unit {unit_of[v]!r}, "
                                f"which cannot run it")  # an internal invariant, named for the report
    lanes = placement_lanes(costs, unit_of, order)
    values = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(options).items()}
    values["platform"] = platform.name
    sched = Schedule(graph.structural_hash(), lanes, graph_name=graph.name, batch=graph_batch(graph),
                     device=platform.name, scheduler=name, options=values, inputs=input_types(graph))
    sim = simulate_placed(sched, costs)
    placed = {u.name: sum(1 for v in order if unit_of[v] == u.name) for u in platform.units}
    return dataclasses.replace(sched, estimated_ms=sim.makespan_ms,
                               stats={"units": placed, "copies": len(sim.transfers), **(stats or {})})


def placed_tasks(graph: Graph, costs: UnitCosts, gt: GraphTasks, result: TaskSchedule, name: str,
                 options: Any) -> Schedule:
    """A list scheduler's task schedule as a placed schedule: each unit's nodes in order of start."""
    units = costs.platform.names
    unit_of = {v: units[result.proc[i]] for i, v in enumerate(gt.nodes) if v is not None}
    order = sorted((i for i, v in enumerate(gt.nodes) if v is not None), key=lambda i: (result.start[i], i))
    return placed_schedule(graph, costs, unit_of, [v for i in order if (v := gt.nodes[i]) is not None], name,
                           options, {"planned_ms": result.makespan})

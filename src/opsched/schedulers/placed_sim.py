"""Replay a placed schedule (lanes on the units of a platform) under the units' profiles.

The model, HEFT's and PartitionTuner's: a unit runs one operator at a time, its lane's nodes in
order; a node starts once the unit is free and each input has arrived. An input made on another
unit arrives after its copy (the link's switch cost plus its bytes at the link's bandwidth);
each value is copied once to each unit that reads it, and links carry copies without
contention. The model's inputs start on the default unit, its outputs end there. Consecutive
nodes of a lane that the unit fuses (:meth:`UnitCosts.fusable`, longest match first) run as one
fused kernel. The makespan is when the last output is back on the default unit.
"""

from __future__ import annotations

from dataclasses import dataclass

from opsched._toposort import topological_order
from opsched.cost.unit_costs import UnitCosts
from opsched.errors import InvalidScheduleError
from opsched.ir import op_schema
from opsched.schedule import Schedule
from opsched.timeline import TraceEvent

__all__ = ["PlacedSimulation", "Transfer", "simulate_placed", "replay", "fused_groups"]

#: The longest chain a unit fuses (PartitionTuner profiles 2- and 3-operator chains).
MAX_FUSE = 3


@dataclass(frozen=True, slots=True)
class Transfer:
    value: str
    src: str
    dst: str
    start_ms: float
    end_ms: float


@dataclass(frozen=True)
class PlacedSimulation:
    makespan_ms: float
    events: tuple[TraceEvent, ...]      # one per fused group, on its unit's lane
    transfers: tuple[Transfer, ...]     # one per value copied to a unit


def fused_groups(nodes: tuple[str, ...], unit: str, costs: UnitCosts) -> list[tuple[str, ...]]:
    """A lane's nodes cut into the chains its unit runs as one kernel (longest match first)."""
    groups, i = [], 0
    while i < len(nodes):
        k = next(k for k in range(min(MAX_FUSE, len(nodes) - i), 0, -1) if costs.fusable(nodes[i:i + k], unit))
        groups.append(nodes[i:i + k])
        i += k
    return groups


def simulate_placed(schedule: Schedule, costs: UnitCosts, fuse: bool = True) -> PlacedSimulation:
    """The replay of ``schedule`` (validated against the costs' graph first)."""
    return replay(schedule.validate(costs.graph), costs, fuse)


def _group_order(schedule: Schedule, groups: list[tuple[int, tuple[str, ...]]], waits: dict[str, list[str]],
                 costs: UnitCosts) -> list[int]:
    """The groups in an order that respects their lanes, their data and the schedule's waits."""
    graph = costs.graph
    group_of = {v: i for i, (_, g) in enumerate(groups) for v in g}
    before: dict[int, set[int]] = {i: set() for i in range(len(groups))}
    last_on_lane: dict[int, int] = {}
    for i, (k, g) in enumerate(groups):
        if k in last_on_lane:
            before[i].add(last_on_lane[k])
        last_on_lane[k] = i
        for v in g:
            for u in (*graph.node(v).inputs, *waits.get(v, ())):
                if u in group_of and group_of[u] != i:
                    before[i].add(group_of[u])
    order, _ = topological_order(before)  # validated: no cycle
    return order


def replay(schedule: Schedule, costs: UnitCosts, fuse: bool = True) -> PlacedSimulation:
    """:func:`simulate_placed` of a schedule known to be valid for the costs' graph."""
    graph, platform = costs.graph, costs.platform
    if schedule.merges or schedule.barriers:
        raise InvalidScheduleError("a placed schedule has no merges or barriers; the unit simulator models neither")
    units = [lane.device or platform.default for lane in schedule.lanes]
    for u in units:
        platform.unit(u)  # a unit of this platform
    if len(set(units)) != len(units):
        raise InvalidScheduleError(f"two lanes on one unit ({units}); a unit runs one lane")
    groups = [(k, g) for k, lane in enumerate(schedule.lanes)
              for g in (fused_groups(lane.nodes, units[k], costs) if fuse else [(v,) for v in lane.nodes])]
    waits: dict[str, list[str]] = {}
    for a, b in schedule.waits:
        waits.setdefault(a, []).append(b)
    order = _group_order(schedule, groups, waits, costs)
    end: dict[str, float] = {i.name: 0.0 for i in graph.inputs}
    where: dict[str, str] = {i.name: platform.default for i in graph.inputs}
    arrival: dict[tuple[str, str], float] = {}
    transfers: list[Transfer] = []

    def arrive(value: str, unit: str) -> float:
        if where[value] == unit:
            return end[value]
        key = (value, unit)
        if key not in arrival:
            t0 = end[value]
            arrival[key] = t0 + costs.copy_ms(value, where[value], unit)
            transfers.append(Transfer(value, where[value], unit, t0, arrival[key]))
        return arrival[key]

    free = {u: 0.0 for u in units}
    events = []
    for i in order:
        k, g = groups[i]
        unit = units[k]
        members = set(g)
        inputs = [u for v in g for u in graph.node(v).inputs if u not in members]
        start = max([free[unit], *(arrive(u, unit) for u in inputs),
                     *(end[w] for v in g for w in waits.get(v, ()))])
        finish = start + costs.chain_ms(g, unit)
        free[unit] = finish
        for v in g:
            end[v], where[v] = finish, unit
        head = graph.node(g[0])
        label = g[0] if len(g) == 1 else "+".join(g)
        events.append(TraceEvent(0, k, label, head.op, start, finish, op_schema(head.op).category))
    makespan = max([0.0, *(arrive(v, platform.default) for v in graph.outputs), *free.values()])
    return PlacedSimulation(makespan, tuple(events), tuple(transfers))

"""The schedule checker: does a schedule fit a graph, and can it run without deadlock?

A schedule runs iff one order satisfies, together: every data edge, the order of each lane,
the waits, and the barriers (everything before a barrier before anything after it). That is
Kahn's algorithm over the nodes plus one item per barrier, so a barrier costs one edge per
lane rather than one per pair of nodes. Where it fails, the message names the first node that
reads a value produced after it (in a later part between barriers, or later in its lane).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from opsched._toposort import kahn
from opsched.errors import IllegalMergeError, InvalidScheduleError, ScheduleMismatchError
from opsched.ir import Graph
from opsched.ir.ops.conv import check_merge

if TYPE_CHECKING:
    from opsched.schedule.types import Schedule

__all__ = ["check_schedule", "input_types"]


def input_types(graph: Graph) -> dict[str, str]:
    """What a schedule records of the inputs of the graph it was made for (name: ``f32[1,3,224,224]``),
    so that applied to another graph it can say what differs."""
    return {i.name: str(i.type) for i in graph.inputs}


def check_schedule(schedule: Schedule, graph: Graph) -> Graph:
    """Raise the error naming the first way ``schedule`` does not fit ``graph`` (see
    :meth:`opsched.schedule.Schedule.validate`); return the graph its lanes name (its instance
    graph)."""
    ghash = graph.structural_hash()
    if schedule.graph_hash != ghash:
        raise ScheduleMismatchError(
            f"this schedule was made for graph {schedule.graph_name or '?'} {_difference(schedule, graph)}: re-run "
            f"the scheduler for this model, batch size, input shape and precision (or, for the same model at another "
            f"batch size or input shape, opsched.load(..., retarget=True) runs it untuned)")
    graph = schedule.instance_graph(graph)
    _check_cover(schedule, graph)
    where = _check_barriers(schedule)
    _check_merges(schedule, graph, where)
    _check_order(schedule, graph, where)
    return graph


def _difference(schedule: Schedule, graph: Graph) -> str:
    """How the graph ``schedule`` was made for differs from ``graph``, as far as the schedule
    recorded it (schedules written before they recorded their inputs have only the hash)."""
    here = input_types(graph)
    made = dict(schedule.inputs)

    def listing(types: dict[str, str]) -> str:
        return ", ".join(f"{name} {t}" for name, t in types.items())
    if not made:
        return (f"(structural hash {schedule.graph_hash[:12]}), not for {graph.name!r} "
                f"({graph.structural_hash()[:12]}, inputs {listing(here)})")
    if list(made.values()) != list(here.values()):  # names are not part of the structure
        return f"with inputs {listing(made)}, not for {graph.name!r}, whose inputs are {listing(here)}"
    return (f"with inputs {listing(made)}, not for {graph.name!r}: the inputs are alike, but the operators differ "
            f"(another model, another version of it, or other import options)")


def _check_cover(schedule: Schedule, graph: Graph) -> None:
    seen: set[str] = set()
    for v in schedule.nodes:
        if v not in graph.index:
            raise InvalidScheduleError(f"schedule names {v!r}, which is not a node of graph {graph.name!r}")
        if v in seen:
            raise InvalidScheduleError(f"node {v!r} is scheduled twice")
        seen.add(v)
    missing = [n.name for n in graph.nodes if n.name not in seen]
    if missing:
        raise InvalidScheduleError(f"{len(missing)} node(s) of {graph.name!r} are never scheduled, e.g. {missing[:5]}")
    for a, b in schedule.waits:
        for v in (a, b):
            if v not in graph.index:
                raise InvalidScheduleError(f"a wait names {v!r}, which is not a node of graph {graph.name!r}")


def _check_barriers(schedule: Schedule) -> dict[str, tuple[int, int, int]]:
    """Per node: (lane, position in it, number of barriers before it)."""
    sizes = [len(lane) for lane in schedule.lanes]
    previous = [0] * len(sizes)
    for k, barrier in enumerate(schedule.barriers):
        if len(barrier) != len(sizes):
            raise InvalidScheduleError(f"barrier {k} gives {len(barrier)} lane position(s) for {len(sizes)} lanes")
        for i, (p, before, size) in enumerate(zip(barrier, previous, sizes)):
            if not before <= p <= size:
                raise InvalidScheduleError(f"barrier {k} puts lane {i} at position {p}: expected {before} to {size} "
                                           f"(barriers go forward, within the lane)")
        previous = list(barrier)
    where = {}
    for i, lane in enumerate(schedule.lanes):
        region = 0
        for pos, v in enumerate(lane.nodes):
            while region < len(schedule.barriers) and schedule.barriers[region][i] <= pos:
                region += 1
            where[v] = (i, pos, region)
    return where


def _check_merges(schedule: Schedule, graph: Graph, where: dict[str, tuple[int, int, int]]) -> None:
    merged: set[str] = set()
    for k, members in enumerate(schedule.merges):
        if len(members) < 2:
            raise IllegalMergeError(f"merge {k}: a merge needs two or more convolutions, got {list(members)}")
        for v in members:
            if v not in graph.index:
                raise InvalidScheduleError(f"merge {k} names {v!r}, which is not a node of graph {graph.name!r}")
            if v in merged:
                raise IllegalMergeError(f"merge {k}: node {v!r} is already in another merge")
            merged.add(v)
        lane, pos, region = where[members[0]]
        if any(where[v] != (lane, pos + j, region) for j, v in enumerate(members)):
            raise IllegalMergeError(f"merge {k}: its convolutions {list(members)} must stand next to each other, "
                                    f"in this order, in one lane, with no barrier between them")
        try:
            check_merge(graph, members)
        except IllegalMergeError as e:
            raise IllegalMergeError(f"merge {k}: {e}") from None


def _check_order(schedule: Schedule, graph: Graph, where: dict[str, tuple[int, int, int]]) -> None:
    for n in graph.nodes:  # the common mistakes, named plainly
        lane, pos, region = where[n.name]
        for u in n.inputs:
            if u not in where:
                continue
            u_lane, u_pos, u_region = where[u]
            if u_region > region:
                raise InvalidScheduleError(f"node {n.name!r} (after barrier {region}) reads {u!r}, which is "
                                           f"scheduled later (after barrier {u_region})")
            if u_lane == lane and u_pos > pos:
                raise InvalidScheduleError(f"node {n.name!r} runs before {u!r}, which it reads (lane {lane})")
    waits: dict[str, set[str]] = {}
    for lane_ in schedule.lanes:
        for pos, v in enumerate(lane_.nodes):
            deps = {u for u in graph.node(v).inputs if u in graph.index}
            if pos:
                deps.add(lane_.nodes[pos - 1])
            region = where[v][2]
            if region:
                deps.add(f"|barrier {region - 1}")
            waits[v] = deps
    for k, barrier in enumerate(schedule.barriers):
        deps = {lane.nodes[p - 1] for lane, p in zip(schedule.lanes, barrier) if p}
        waits[f"|barrier {k}"] = deps | ({f"|barrier {k - 1}"} if k else set())
    for a, b in schedule.waits:
        waits[a].add(b)
    stuck = kahn(waits)
    if stuck:
        named = sorted(v for v in stuck if not v.startswith("|"))
        raise InvalidScheduleError(f"lane order, waits and barriers contradict data dependencies (it would "
                                   f"deadlock) at {named[:5]}")

"""Replay a schedule under the resource model: an event-driven simulation.

The model (:mod:`opsched.cost.resources`): each operator has a duration alone and a demand on
the device; operators running at once advance at a common rate that the device's capacity and
their mutual contention set. Stage-based schedules run their stages one after another (a
barrier, costing ``barrier_ms``, after each stage of several groups), each group in order on its
lane; lane-based schedules run each lane in order, an operator starting once its producers on
other lanes, and the nodes its schedule says it waits for, are done.

The analytic cost model provides the model (:meth:`AnalyticCostModel.resources`). Unlike the
analytic stage formula, the simulation lets operators of different groups start and end at
different times within a stage, so a stage's replay can be shorter than its formula where the
formula's bounds (longest chain, total work) do not bind at the same moments.

:class:`Fluid` is the engine; the ``est`` list scheduler plans on the same engine, so its
planned timeline and the replay of its schedule agree exactly.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from opsched.cost.resources import ResourceModel
from opsched.ir import Graph
from opsched.runtime.cpu import TraceEvent
from opsched.schedule.types import Schedule

__all__ = ["Fluid", "Simulation", "simulate"]

_DONE = 1e-12  # ms of duration left that count as finished


@dataclass(frozen=True)
class Simulation:
    makespan_ms: float
    events: tuple[TraceEvent, ...]  # one per operator (a merge is one), on its lane


class Fluid:
    """Operators sharing one device; time moves from one completion to the next.

    Operators of demand 0 (a barrier, a host-side wait) hold no device: they advance at speed 1
    and do not count among the co-running ones.
    """

    def __init__(self, model: ResourceModel) -> None:
        self.model = model
        self.t = 0.0
        self.load = 0.0
        self.holding = 0  # running operators of demand > 0
        self.work: dict[int, float] = {}  # running operator -> duration-alone left, in start order
        self.demand: dict[int, float] = {}

    def start(self, op: int, work: float, demand: float) -> None:
        self.work[op] = work
        self.demand[op] = demand
        self.load += demand
        self.holding += demand > 0

    @property
    def busy(self) -> int:
        return len(self.work)

    def advance(self) -> list[int]:
        """Run until the next operator(s) finish; return them in start order."""
        work, demand = self.work, self.demand
        shared = self.model.rate(self.load, self.holding)
        step = min(w / shared if demand[i] > 0 else w for i, w in work.items())
        self.t += step
        finished = []
        for i, w in list(work.items()):
            d = demand[i]
            left = w - step * (shared if d > 0 else 1.0)
            if left <= _DONE:
                finished.append(i)
                del work[i], demand[i]
                self.load -= d
                self.holding -= d > 0
            else:
                work[i] = left
        if not work:
            self.load = 0.0  # no drift from adding and removing floats
        return finished


@dataclass
class _Op:
    key: str
    label: str
    op: str
    lane: int
    phase: int
    work: float          # duration alone, ms
    demand: float
    deps: set[int]
    start: float = -1.0
    end: float = -1.0


def _ops(graph: Graph, schedule: Schedule, demands: ResourceModel) -> list[_Op]:
    ops: list[_Op] = []
    index: dict[str, int] = {}
    barrier_ms = demands.barrier_ms
    if schedule.lanes is not None:
        merge_of = {v: m for m in schedule.merges for v in m}
        for li, lane in enumerate(schedule.lanes):
            for v in lane:
                members = merge_of.get(v, (v,))
                if v != members[0]:
                    index[v] = index[members[0]]
                    continue
                index[v] = len(ops)
                key = "+".join(members)
                d = demands[key]
                merged = len(members) > 1
                label, op = (f"merge({','.join(members)})", "conv2d(merged)") if merged else (v, graph.node(v).op)
                ops.append(_Op(key, label, op, li, 0, d.duration_ms, d.demand, set()))
        for lane in schedule.lanes:
            for pos, v in enumerate(lane):
                i = index[v]
                ops[i].deps |= {index[u] for u in graph.node(v).inputs if u in index}
                if pos and index[lane[pos - 1]] != i:
                    ops[i].deps.add(index[lane[pos - 1]])
        for a, b in schedule.waits:
            ops[index[a]].deps.add(index[b])
        return ops
    previous: list[int] = []
    for k, stage in enumerate(schedule.stages):
        current: list[int] = []
        barrier = []
        if previous and barrier_ms > 0 and len(schedule.stages[k - 1].groups) > 1:
            barrier = [len(ops)]  # the barrier is an operator of its own that holds no device
            ops.append(_Op(f"barrier{k}", "barrier", "barrier", 0, k, barrier_ms, 0.0, set(previous)))
        gate = set(barrier) if barrier else set(previous)
        if stage.strategy == "merge":
            key = "+".join(stage.nodes)
            d = demands[key]
            ops.append(_Op(key, f"merge({','.join(stage.nodes)})", "conv2d(merged)", 0, k, d.duration_ms,
                           d.demand, set(gate)))
            current.append(len(ops) - 1)
        else:
            for li, group in enumerate(stage.groups):
                prev = None
                for v in group:
                    d = demands[v]
                    deps = set(gate) if prev is None else {prev}
                    ops.append(_Op(v, v, graph.node(v).op, li, k, d.duration_ms, d.demand, deps))
                    prev = len(ops) - 1
                    current.append(prev)
        previous = current
    return ops


def simulate(graph: Graph, schedule: Schedule, resources: ResourceModel) -> Simulation:
    """Replay ``schedule`` (validated against ``graph`` first) under ``resources``."""
    schedule.validate(graph)
    ops = _ops(graph, schedule, resources)
    consumers: list[list[int]] = [[] for _ in ops]
    pending = [len(o.deps) for o in ops]
    for i, o in enumerate(ops):
        for d in o.deps:
            consumers[d].append(i)
    fluid = Fluid(resources)
    ready = deque(i for i, n in enumerate(pending) if n == 0)
    finished = 0

    def finish(i: int) -> None:
        nonlocal finished
        ops[i].end = fluid.t
        finished += 1
        for c in consumers[i]:
            pending[c] -= 1
            if pending[c] == 0:
                ready.append(c)

    while True:
        while ready:
            i = ready.popleft()
            ops[i].start = fluid.t
            if ops[i].work <= 0:
                finish(i)
            else:
                fluid.start(i, ops[i].work, ops[i].demand)
        if not fluid.busy:
            break
        for i in fluid.advance():
            finish(i)
    if finished != len(ops):
        raise AssertionError("simulation deadlock: the schedule validated, so this is a bug")
    events = tuple(TraceEvent(o.phase, o.lane, o.label, o.op, o.start, o.end) for o in ops if o.op != "barrier")
    return Simulation(fluid.t, events)

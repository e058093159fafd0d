"""Replay a schedule under the resource model: an event-driven simulation.

The model (:mod:`opsched.cost.resources`): each operator has a duration alone and a demand on
the device; operators running at once advance at a common rate that the device's capacity and
their mutual contention set. Each lane runs in order; an operator starts once its producers on
other lanes, and the nodes its schedule says it waits for, are done; at a barrier everything
waits for everything before it, which costs ``barrier_ms`` after a part of several lanes (IOS's
stages: a barrier after each stage of several groups).

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

from opsched.cost import ResourceModel
from opsched.ir import Graph
from opsched.ir.ops import op_def
from opsched.schedule import Schedule
from opsched.timeline import TraceEvent

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
    """One op per node (a merge is one) on its lane, a gate op at each barrier, and the edges."""
    ops: list[_Op] = []
    index: dict[str, int] = {}
    merge_of = {v: m for m in schedule.merges for v in m}
    parts = schedule.regions()
    previous: list[int] = []
    for k, part in enumerate(parts):
        gate = None
        if k:  # a barrier holds no device; it costs its time only after a part of several lanes
            several = sum(1 for nodes in parts[k - 1] if nodes) > 1
            ops.append(_Op("barrier", "barrier", "barrier", 0, k, demands.barrier_ms if several else 0.0, 0.0,
                           set(previous)))
            gate = len(ops) - 1
        current: list[int] = []
        for li, nodes in enumerate(part):
            prev = gate
            for v in nodes:
                members = merge_of.get(v, (v,))
                if v != members[0]:
                    index[v] = index[members[0]]
                    continue
                index[v] = len(ops)
                key = "+".join(members)
                d = demands[key]
                if len(members) > 1:
                    label, op = f"merge({','.join(members)})", "conv2d(merged)"
                else:
                    label, op = v, graph.node(v).op
                ops.append(_Op(key, label, op, li, k, d.duration_ms, d.demand, set() if prev is None else {prev}))
                prev = len(ops) - 1
                current.append(prev)
        previous = current
    for n in graph.nodes:
        i = index[n.name]
        ops[i].deps |= {index[u] for u in n.inputs if u in index and index[u] != i}
    for a, b in schedule.waits:
        ops[index[a]].deps.add(index[b])
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
    events = tuple(TraceEvent(o.phase, o.lane, o.label, o.op, o.start, o.end, _category(o.op))
                   for o in ops if o.op != "barrier")
    return Simulation(fluid.t, events)


def _category(op: str) -> str:
    return "conv" if op == "conv2d(merged)" else op_def(op).category

"""Early-start-time-first list scheduling under the resource model, without stage barriers.

The scheduler plays the graph forward on the simulator's engine (:class:`opsched.schedule.
simulate.Fluid`): at time 0 and whenever an operator finishes, it starts ready operators, each at
the earliest time dependencies and the device allow. Two rules decide which and where:

1. **Critical-path priority.** Ready operators are considered by *bottom level*, the longest
   chain of durations from the operator to the end of the graph (ties: larger area first), so
   the chain that bounds the makespan is never kept waiting for work that has slack.
2. **Capacity-aware admission.** Ready operators start, in priority order, while the device
   is not full (``load < 1``), even if the last one then oversubscribes it: a device that
   shares itself (a GPU's block scheduler; the model's ``load > 1`` case) loses no throughput
   by that, and the critical operator never waits while there is room. Where the executor
   gives each lane a fixed share instead (a CPU's threads: ``ResourceModel.oversubscribe`` is
   false), the most urgent ready operator starts only if its demand fits in what the running
   ones leave, or if nothing runs, and the others wait behind it. (Measured on the GPU
   presets' model, starting only what fits, or also backfilling lower-priority operators that
   fit first, gave 1-9% longer makespans on NASNet and RandWire; on this 2-core CPU,
   oversubscribing lanes ran Inception V3 1.27x slower than its sequential schedule, fitting
   alone 1.06x.)

Where running operators at once costs the plan something of its own (``OpDemand.fork_ms``: on
ONNX Runtime, cutting a one-lane segment and converting what crosses the cut), an operator
starts beside running ones only if it runs longer than that; otherwise it waits for the device
to come free. (On this project's 2-core machine, without it, est's plans for NASNet-A mobile
opened many short concurrent regions and ran 1.5x slower than the DP's, whose search charges
the cuts.)

At most ``max_lanes`` operators run at once (streams or CPU threads). Each started operator goes
on a free lane: its last-finishing producer's lane when that is free (no event for that edge),
else a lane that just came free, else the longest-idle one, else a new lane. When an operator
was held back by the device rather than by its producers, it gets a *wait* on an operator that
finished at its start time: an ordering edge without data, so the executors and the simulator
start it exactly when the plan did. The replay of the schedule is then the plan itself (by
induction over completion times: every operator's last constraint ends exactly at its start).

**Guarantees** (``W`` = sum of durations = the sequential schedule, ``CP`` = critical path of
durations, ``A`` = total area, ``L`` = ``max_lanes``):

* ``makespan <= W``, for any overlap: an operator always runs, and ``k`` co-running ones
  advance at least one unit of duration per unit of time (:mod:`opsched.cost.resources`).
* on a device that shares itself with ``overlap = 1`` (capacity only), ``makespan <= CP + A +
  W / L``, and the last term vanishes when ``L`` is at least the graph's width (no lane ever
  runs out), so then ``makespan <= 2 max(CP, A)``, Graham's bound: follow a chain back from the
  last operator through the producer that released each; at any moment either the load is at
  least 1 (area advances at rate 1: at most ``A`` in all), or all ``L`` lanes run at full speed
  (at most ``W / L``), or an operator of that chain runs at full speed (at most ``CP``): had
  it been ready and not running, rule 2 would have started it.

It runs in O(n log n + E) per graph plus O(lanes) per completion.
"""

from __future__ import annotations

import heapq
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsched.cost import CostModel, ResourceModel, StageCoster, device_spec, resources_for
from opsched.errors import CostModelError, ScheduleError
from opsched.ir import Graph
from opsched.ir.ops.conv import merge_class
from opsched.schedule import Schedule, Stage
from opsched.schedulers.registry import Progress, SchedulerSpec, laned, option, positive, register
from opsched.schedulers.simulate import Fluid

__all__ = ["EstOptions", "EstPlan", "est_lanes", "bottom_levels", "choose_merges"]

_EPS = 1e-9


@dataclass(frozen=True)
class EstOptions:
    """The list scheduler's options (:func:`est_lanes`)."""

    max_lanes: int | None = option(8, "most operators running at once (streams, CPU threads); None: no limit")
    merge: bool = option(True, "merge sibling convolutions where the cost model says it pays")
    demands: str | None = option(None, "analytic preset whose device demands to borrow (default: the cost "
                                       "model's device)")

    def __post_init__(self) -> None:
        positive("est", "max_lanes", self.max_lanes, allow_none=True)
        if self.demands is not None:
            try:
                device_spec(self.demands)
            except CostModelError as e:
                raise ScheduleError(f"option demands of scheduler 'est': {e}") from None


@dataclass(frozen=True)
class EstPlan:
    lanes: tuple[tuple[str, ...], ...]
    waits: tuple[tuple[str, str], ...]   # (node, node it waits for), beyond data edges
    merges: tuple[tuple[str, ...], ...]  # as given, each placed as one operator
    makespan_ms: float
    start_ms: dict[str, float]           # per node
    end_ms: dict[str, float]


@dataclass(frozen=True)
class _Tasks:
    """The graph with each merge contracted to one operator, in topological order."""

    members: list[tuple[str, ...]]
    preds: list[list[int]]
    succs: list[list[int]]

    @classmethod
    def of(cls, graph: Graph, merges: Sequence[tuple[str, ...]]) -> _Tasks:
        merge_of = {v: tuple(m) for m in merges for v in m}
        task_of: dict[str, int] = {}
        members: list[tuple[str, ...]] = []
        for node in graph.nodes:  # a merge's task appears at its first member: still topological
            if node.name not in task_of:
                group = merge_of.get(node.name, (node.name,))
                for v in group:
                    task_of[v] = len(members)
                members.append(group)
        preds: list[list[int]] = []
        succs: list[list[int]] = [[] for _ in members]
        for t, group in enumerate(members):
            ps = sorted({task_of[u] for v in group for u in graph.node(v).inputs if u in graph.index} - {t})
            preds.append(ps)
            for p in ps:
                succs[p].append(t)
        return cls(members, preds, succs)


def bottom_levels(succs: Sequence[Sequence[int]], duration: Sequence[float]) -> list[float]:
    """Per operator (in topological order): the longest chain of durations from it (inclusive) to a sink."""
    level = [0.0] * len(duration)
    for i in range(len(duration) - 1, -1, -1):
        level[i] = duration[i] + max((level[s] for s in succs[i]), default=0.0)
    return level


def choose_merges(graph: Graph, coster: StageCoster) -> list[tuple[str, ...]]:
    """Sibling convolutions that may merge (:func:`opsched.ir.ops.conv.merge_class`) and cost
    less merged than both alternatives, as the cost model prices them: side by side (plus the
    resume of the segment that cuts, where the backend charges cuts) and one after another.
    (On ONNX Runtime a merge's split forces layout conversions: SqueezeNet's fire modules merged
    ran 1.2x slower than sequential, though cheaper than their side-by-side stage.)"""
    classes: dict[object, list[str]] = defaultdict(list)
    for node in graph.nodes:
        cls = merge_class(graph, node)
        if cls is not None:
            classes[cls].append(node.name)
    cut = coster.segment_cut
    chosen = []
    for members in classes.values():
        if len(members) < 2:
            continue
        side_by_side = coster.latency(Stage(tuple((v,) for v in members))) + (cut.resume_ms if cut else 0.0)
        one_by_one = sum(coster.latency(Stage(((v,),))) for v in members)
        if coster.latency(Stage(tuple((v,) for v in members), "merge")) < min(side_by_side, one_by_one):
            chosen.append(tuple(members))
    return chosen


def est_lanes(graph: Graph, resources: ResourceModel, max_lanes: int | None = None,
              merges: Sequence[tuple[str, ...]] = ()) -> EstPlan:
    """Lanes, waits and the planned timeline of ``graph`` (see the module docstring)."""
    return _Planner(graph, resources, max_lanes, merges).plan()


class _Planner:
    """One play of the graph forward on the fluid device, placing operators as they start."""

    def __init__(self, graph: Graph, resources: ResourceModel, max_lanes: int | None,
                 merges: Sequence[tuple[str, ...]]) -> None:
        self.tasks = _Tasks.of(graph, merges)
        self.merges = tuple(tuple(m) for m in merges)
        self.resources = resources
        n = len(self.tasks.members)
        self.names = [group[0] for group in self.tasks.members]
        self.demand = [resources["+".join(group)] for group in self.tasks.members]
        self.duration = [d.duration_ms for d in self.demand]
        self.level = bottom_levels(self.tasks.succs, self.duration)
        self.cap = max_lanes if max_lanes is not None else n
        self.pending = [len(ps) for ps in self.tasks.preds]
        self.start, self.end, self.ready_at = [0.0] * n, [0.0] * n, [0.0] * n
        self.lane_of = [-1] * n
        self.lanes: list[list[int]] = []
        self.lane_busy: list[bool] = []
        self.waits: list[tuple[str, str]] = []
        self.fluid = Fluid(resources)
        self.just_finished: list[int] = []  # operators that finished at the current time
        self.heap: list[tuple[float, float, int]] = []  # ready operators, most urgent first
        self.views: list[tuple[float, float, int]] = []  # ready views (they take no time), same keys

    def plan(self) -> EstPlan:
        for i, p in enumerate(self.pending):
            if p == 0:
                self._ready(i)
        self._admit()
        while self.fluid.busy:
            self.just_finished.clear()
            for i in self.fluid.advance():
                self._finish(i)
            self._admit()
        if any(p > 0 for p in self.pending) or self.heap or self.views:
            raise AssertionError("est left operators unscheduled on a verified graph: a bug")
        members, start, end = self.tasks.members, self.start, self.end
        node_times = [(v, start[t], end[t]) for t, group in enumerate(members) for v in group]
        return EstPlan(tuple(tuple(v for t in lane for v in members[t]) for lane in self.lanes), tuple(self.waits),
                       self.merges, self.fluid.t, {v: s for v, s, _ in node_times}, {v: e for v, _, e in node_times})

    def _ready(self, i: int) -> None:
        entry = (-self.level[i], -self.demand[i].area_ms, i)
        if self.duration[i] <= 0:
            self.views.append(entry)
        else:
            heapq.heappush(self.heap, entry)

    def _free_lane(self, i: int, delayed: bool) -> int:
        lanes, end, preds = self.lanes, self.end, self.tasks.preds[i]
        free = [li for li, busy in enumerate(self.lane_busy) if not busy]
        if not free:
            lanes.append([])
            self.lane_busy.append(False)
            return len(lanes) - 1
        mine = [li for li in free if lanes[li] and lanes[li][-1] in preds]
        fresh = [li for li in free if lanes[li] and lanes[li][-1] in self.just_finished]
        if delayed and fresh:
            return max(fresh, key=lambda li: lanes[li][-1] in preds)
        if mine:
            return max(mine, key=lambda li: end[lanes[li][-1]])
        used = [li for li in free if lanes[li]]
        return max(used, key=lambda li: end[lanes[li][-1]]) if used else free[0]

    def _finish(self, i: int) -> None:
        self.end[i] = self.fluid.t
        self.lane_busy[self.lane_of[i]] = False
        self.just_finished.append(i)
        for s in self.tasks.succs[i]:
            self.pending[s] -= 1
            if self.pending[s] == 0:
                self.ready_at[s] = self.fluid.t
                self._ready(s)

    def _place(self, i: int) -> None:
        fluid = self.fluid
        li = self._free_lane(i, self.ready_at[i] < fluid.t)
        lane = self.lanes[li]
        last = lane[-1] if lane else -1
        constraints = [self.end[p] for p in self.tasks.preds[i]] + ([self.end[last]] if last >= 0 else [])
        if fluid.t > 0 and max(constraints, default=0.0) < fluid.t:
            donor = max(self.just_finished, key=lambda j: (self.demand[j].demand, -j))
            self.waits.append((self.names[i], self.names[donor]))
        lane.append(i)
        self.lane_of[i] = li
        self.lane_busy[li] = True
        self.start[i] = fluid.t
        if self.duration[i] <= 0:
            self._finish(i)  # a view: done at once; its consumers may be ready now
        else:
            fluid.start(i, self.duration[i], self.demand[i].demand)

    def _admit(self) -> None:
        fluid, heap, demand, duration = self.fluid, self.heap, self.demand, self.duration
        # views first: they take no time and no device, so they follow their producer on its
        # lane before anything else takes it (on another lane a view would only add events and,
        # on ONNX Runtime, cut segments)
        while self.views and fluid.busy < self.cap:
            batch = sorted(self.views)
            self.views.clear()
            for _, _, i in batch:
                self._place(i)
        # rule 2: start ready operators, most urgent first, while the device is not full
        while heap and fluid.busy < self.cap and fluid.load < 1.0 - _EPS:
            i = heap[0][2]
            if fluid.busy and 0 < duration[i] < demand[i].fork_ms:
                break  # beside the running ones it would gain less than the cut it costs
            if not self.resources.oversubscribe and fluid.busy and fluid.load + demand[i].demand > 1.0 + _EPS:
                break  # a fixed share per lane: starting it now would only starve it
            self._place(heapq.heappop(heap)[2])


def _est(graph: Graph, cost: CostModel, options: EstOptions, progress: Progress | None) -> Schedule:
    began = time.perf_counter()
    merges = choose_merges(graph, StageCoster(graph, cost)) if options.merge else []
    resources = resources_for(graph, cost, options.demands, merges)
    priced = time.perf_counter()
    plan = est_lanes(graph, resources, options.max_lanes, merges)
    done = time.perf_counter()
    lane_of = {v: k for k, lane in enumerate(plan.lanes) for v in lane}
    cross = sum(1 for v, k in lane_of.items() for u in graph.node(v).inputs if lane_of.get(u, k) != k)
    stats = {"lanes": len(plan.lanes), "merges": len(merges), "events": cross, "waits": len(plan.waits),
             "pricing_seconds": priced - began, "seconds": done - priced}
    return laned(graph, cost, plan.lanes, "est", options, plan.waits, plan.merges, plan.makespan_ms, stats)


def summarize(stats: Mapping[str, Any]) -> str:
    """One line about a list schedule, from its stats."""
    return (f"{stats.get('lanes', 0)} lanes, {stats.get('merges', 0)} merges, {stats.get('events', 0)} cross-lane "
            f"events, {stats.get('waits', 0)} waits; priced in {stats.get('pricing_seconds', 0.0):.2f} s, "
            f"planned in {1e3 * stats.get('seconds', 0.0):.1f} ms")


def _defaults(device_type: str, cores: int) -> dict[str, Any]:
    return {"max_lanes": cores} if device_type == "cpu" else {}


register(SchedulerSpec("est", _est, EstOptions, "early-start-time-first list scheduling on lanes, no barriers",
                       _defaults, summarize))

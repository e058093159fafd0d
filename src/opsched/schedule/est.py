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
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from opsched.cost.resources import ResourceModel
from opsched.ir import Graph
from opsched.schedule.coster import StageCoster
from opsched.schedule.merge import merge_class
from opsched.schedule.simulate import Fluid
from opsched.schedule.types import Stage

__all__ = ["EstPlan", "est_lanes", "bottom_levels", "choose_merges"]

_EPS = 1e-9


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
    """Sibling convolutions that may merge (:func:`opsched.schedule.merge.merge_class`) and cost
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
    tasks = _Tasks.of(graph, merges)
    preds, succs = tasks.preds, tasks.succs
    n = len(tasks.members)
    names = [group[0] for group in tasks.members]
    demand = [resources["+".join(group)] for group in tasks.members]
    duration = [d.duration_ms for d in demand]
    level = bottom_levels(succs, duration)
    cap = max_lanes if max_lanes is not None else n
    pending = [len(ps) for ps in preds]
    start, end, ready_at = [0.0] * n, [0.0] * n, [0.0] * n
    lane_of = [-1] * n
    lanes: list[list[int]] = []
    lane_busy: list[bool] = []
    waits: list[tuple[str, str]] = []
    fluid = Fluid(resources)
    just_finished: list[int] = []  # operators that finished at the current time
    heap: list[tuple[float, float, int]] = []  # ready operators, most urgent first
    views: list[tuple[float, float, int]] = []  # ready views (they take no time), same keys

    def ready(i: int) -> None:
        entry = (-level[i], -demand[i].area_ms, i)
        if duration[i] <= 0:
            views.append(entry)
        else:
            heapq.heappush(heap, entry)

    def free_lane(i: int, delayed: bool) -> int:
        free = [li for li, busy in enumerate(lane_busy) if not busy]
        if not free:
            lanes.append([])
            lane_busy.append(False)
            return len(lanes) - 1
        mine = [li for li in free if lanes[li] and lanes[li][-1] in preds[i]]
        fresh = [li for li in free if lanes[li] and lanes[li][-1] in just_finished]
        if delayed and fresh:
            return max(fresh, key=lambda li: lanes[li][-1] in preds[i])
        if mine:
            return max(mine, key=lambda li: end[lanes[li][-1]])
        used = [li for li in free if lanes[li]]
        return max(used, key=lambda li: end[lanes[li][-1]]) if used else free[0]

    def finish(i: int) -> None:
        end[i] = fluid.t
        lane_busy[lane_of[i]] = False
        just_finished.append(i)
        for s in succs[i]:
            pending[s] -= 1
            if pending[s] == 0:
                ready_at[s] = fluid.t
                ready(s)

    def place(i: int) -> None:
        li = free_lane(i, ready_at[i] < fluid.t)
        last = lanes[li][-1] if lanes[li] else -1
        constraints = [end[p] for p in preds[i]] + ([end[last]] if last >= 0 else [])
        if fluid.t > 0 and max(constraints, default=0.0) < fluid.t:
            donor = max(just_finished, key=lambda j: (demand[j].demand, -j))
            waits.append((names[i], names[donor]))
        lanes[li].append(i)
        lane_of[i] = li
        lane_busy[li] = True
        start[i] = fluid.t
        if duration[i] <= 0:
            finish(i)  # a view: done at once; its consumers may be ready now
        else:
            fluid.start(i, duration[i], demand[i].demand)

    def admit() -> None:
        # views first: they take no time and no device, so they follow their producer on its
        # lane before anything else takes it (on another lane a view would only add events and,
        # on ONNX Runtime, cut segments)
        while views and fluid.busy < cap:
            batch = sorted(views)
            views.clear()
            for _, _, i in batch:
                place(i)
        # rule 2: start ready operators, most urgent first, while the device is not full
        while heap and fluid.busy < cap and fluid.load < 1.0 - _EPS:
            i = heap[0][2]
            if fluid.busy and 0 < duration[i] < demand[i].fork_ms:
                break  # beside the running ones it would gain less than the cut it costs
            if not resources.oversubscribe and fluid.busy and fluid.load + demand[i].demand > 1.0 + _EPS:
                break  # a fixed share per lane: starting it now would only starve it
            place(heapq.heappop(heap)[2])

    for i in range(n):
        if pending[i] == 0:
            ready(i)
    admit()
    while fluid.busy:
        just_finished.clear()
        for i in fluid.advance():
            finish(i)
        admit()
    if any(p > 0 for p in pending) or heap or views:
        raise AssertionError("est left operators unscheduled on a verified graph: a bug")
    node_times = [(v, start[t], end[t]) for t, group in enumerate(tasks.members) for v in group]
    return EstPlan(tuple(tuple(v for t in lane for v in tasks.members[t]) for lane in lanes), tuple(waits),
                   tuple(tuple(m) for m in merges), fluid.t, {v: s for v, s, _ in node_times},
                   {v: e for v, _, e in node_times})

"""Stream programs: a plan lowered to the operations a stream-ordered device is given.

A GPU runs a plan by enqueuing work on streams from one host thread. The order of that work is
only what the streams and events say, and memory is reused as soon as the host lets go of it,
so everything that makes a run correct is decided here, once, as a flat list of operations in
host order:

* ``Launch(stream, step)``: the step's kernel(s) on that stream;
* ``Record(stream, event)`` / ``Wait(stream, event)``: the only cross-stream ordering;
* ``Release(slots)``: the host drops its references, after which the caching allocator may hand
  the memory to later work *on the stream that allocated it*.

Stream 0 is the caller's stream (the capture stream under CUDA-graph capture). A phase of one
lane runs on stream 0. A phase of ``k`` lanes runs lane ``i`` on stream ``i``: it *forks* (an
event recorded on stream 0 that every side stream waits for) and *joins* (stream 0 waits for
each side stream's last work), so a phase's lanes start after everything before it and
everything after it starts after them; under capture, that fork and join is what brings the
side streams into the graph.

Inside a phase, a step that reads (or is told to wait for) a step of another lane waits for an
event recorded right after that step, unless the waiting stream already knows that step is done
through earlier waits: vector clocks find those, so there is one wait per dependency that the
streams do not already imply, and a record only for an event somebody waits on. Launches are
enqueued round-robin across lanes, each as soon as everything it waits for has been recorded
(a wait on an event not yet recorded would be a no-op on CUDA, not a wait).

Buffers: the host may release a slot at once only where no other stream can still be reading
it, i.e. when every reader runs on the stream that produced it (a value read only inside one
lane that also wrote it, or any value on stream 0 between phases). Every other release moves to
the end of the phase, after the join, where stream 0, and through the next fork every side
stream, is ordered after all of the slot's readers. That is the rule ``record_stream`` would
otherwise enforce at run time, decided statically, and it holds the same under capture.
"""

from __future__ import annotations

from dataclasses import dataclass

from opsched.runtime.plan import Plan

__all__ = ["Launch", "Record", "Wait", "Release", "Op", "StreamProgram", "stream_program"]


@dataclass(frozen=True, slots=True)
class Launch:
    stream: int
    step: int


@dataclass(frozen=True, slots=True)
class Record:
    stream: int
    event: int


@dataclass(frozen=True, slots=True)
class Wait:
    stream: int
    event: int


@dataclass(frozen=True, slots=True)
class Release:
    slots: tuple[int, ...]


Op = Launch | Record | Wait | Release


@dataclass(frozen=True)
class StreamProgram:
    """The operations in host order; ``n_streams`` streams (0 is the caller's), ``n_events`` events."""

    plan: Plan
    ops: tuple[Op, ...]
    n_streams: int
    n_events: int

    def counts(self) -> dict[str, int]:
        """How many of each operation: for reports, and to see what the vector clocks saved."""
        out = {"launch": 0, "record": 0, "wait": 0, "release": 0}
        for op in self.ops:
            out[type(op).__name__.lower()] += 1
        return out


def _round_robin(plan: Plan, lanes: tuple[tuple[int, ...], ...]) -> list[tuple[int, int]]:
    """(lane, step) in host order: lanes in turn, each step once all it waits for is enqueued."""
    nxt = [0] * len(lanes)
    enqueued: set[int] = set()
    order: list[tuple[int, int]] = []
    remaining = sum(len(lane) for lane in lanes)
    while remaining:
        progress = False
        for li, lane in enumerate(lanes):
            if nxt[li] < len(lane) and all(w in enqueued for w in plan.steps[lane[nxt[li]]].waits):
                s = lane[nxt[li]]
                order.append((li, s))
                enqueued.add(s)
                nxt[li] += 1
                remaining -= 1
                progress = True
        assert progress, "lane waits form a cycle; Schedule.validate should have refused this plan"
    return order


def stream_program(plan: Plan) -> StreamProgram:
    """Lower ``plan`` to stream operations (see the module docstring for the rules)."""
    emitter = _Emitter(plan)
    for phase in plan.phases:
        if len(phase.lanes) == 1:
            emitter.one_lane(phase.lanes[0], phase.frees)
        else:
            emitter.several_lanes(phase.lanes, phase.frees)
    return StreamProgram(plan, tuple(emitter.ops), max((len(p.lanes) for p in plan.phases), default=1),
                         emitter.n_events)


class _Emitter:
    """Operations in host order, phase after phase; which stream made each slot."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        self.ops: list[Op] = []
        self.n_events = 0
        self.produced_on: dict[int, int] = {slot: 0 for slot in plan.input_slots}

    def event(self) -> int:
        self.n_events += 1
        return self.n_events - 1

    def one_lane(self, lane: tuple[int, ...], frees: tuple[int, ...]) -> None:
        """A phase of one lane runs on stream 0, releasing as it goes."""
        for s in lane:
            step = self.plan.steps[s]
            self.ops.append(Launch(0, s))
            self.produced_on.update((o, 0) for o in step.outputs)
            if step.frees:
                self.ops.append(Release(step.frees))
        if frees:
            self.ops.append(Release(frees))

    def several_lanes(self, lanes: tuple[tuple[int, ...], ...], frees: tuple[int, ...]) -> None:
        """A fork, the lanes round-robin with the waits the streams do not already imply, a join."""
        plan, ops = self.plan, self.ops
        k = len(lanes)
        fork = self.event()
        ops.append(Record(0, fork))
        ops.extend(Wait(i, fork) for i in range(1, k))
        order = _round_robin(plan, lanes)
        needed, clock = _needed_waits(plan, lanes, order)
        recorded = {p for ps in needed.values() for p in ps}
        # emit, releasing at once only what no other stream can still be reading
        event_of: dict[int, int] = {}
        deferred: list[int] = []
        for li, s in order:
            step = plan.steps[s]
            ops.extend(Wait(li, event_of[p]) for p in needed.get(s, ()))
            ops.append(Launch(li, s))
            self.produced_on.update((o, li) for o in step.outputs)
            if s in recorded:
                event_of[s] = self.event()
                ops.append(Record(li, event_of[s]))
            now = tuple(f for f in step.frees if self.produced_on[f] == li)
            deferred.extend(f for f in step.frees if self.produced_on[f] != li)
            if now:
                ops.append(Release(now))
        for i in range(1, k):
            if lanes[i] and clock[0][i] < len(lanes[i]):
                join = self.event()
                ops.append(Record(i, join))
                ops.append(Wait(0, join))
                clock[0] = [max(a, b) for a, b in zip(clock[0], clock[i])]
        if deferred or frees:
            ops.append(Release(tuple(sorted(deferred)) + frees))


def _needed_waits(plan: Plan, lanes: tuple[tuple[int, ...], ...], order: list[tuple[int, int]]
                  ) -> tuple[dict[int, list[int]], list[list[int]]]:
    """Which waits the streams do not already imply (vector clocks over one phase): per step, the
    steps it must wait for; and each stream's clock at the end."""
    k = len(lanes)
    lane_of = {s: li for li, lane in enumerate(lanes) for s in lane}
    rank = {s: r + 1 for lane in lanes for r, s in enumerate(lane)}  # steps done on its lane, it included
    clock = [[0] * k for _ in range(k)]  # clock[i][j]: steps of lane j known done before stream i's next work
    after: dict[int, list[int]] = {}     # step -> the vector clock of its stream right after it
    needed: dict[int, list[int]] = {}
    for li, s in order:
        for p in sorted(plan.steps[s].waits, key=lambda p: -rank[p]):
            j = lane_of[p]
            if clock[li][j] >= rank[p]:
                continue
            needed.setdefault(s, []).append(p)
            clock[li] = [max(a, b) for a, b in zip(clock[li], after[p])]
        clock[li][li] = rank[s]
        after[s] = list(clock[li])
    return needed, clock

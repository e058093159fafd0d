"""CPU lanes: a plan's lanes on persistent worker threads, intra-op threads shared among them.

An executor runs a :class:`Program`: the plan's phases and lanes, whose items are either single
steps (torch kernels) or, with the ONNX Runtime backend, whole segments of a lane run as one
session (:mod:`opsched.backends.ort`). torch's intra-op thread count is process-wide
(``torch.set_num_threads`` from any thread changes it for all), so the coordinating thread sets
it at each phase boundary: a phase of k lanes gives each lane ``cores // k`` threads, and a
phase of one lane runs at the count the caller set. The caller's thread runs the first lane
itself; the others go to a crew of persistent workers, one per lane past the first.

Several threads may call one executor at once: each call has its own slots and events, and its
own crew, taken from those idle or made afresh, and kept for later calls (so there are as many
crews as calls have ever overlapped). Calls sharing one crew would hang: a lane that waits for
another lane's step can hold a worker while the lane it waits for is queued behind another
call's, each call's holding what the other's waits for (NASNet-A mobile on Nimble's 13 lanes,
called from four threads, hung at once). Concurrent calls share the cores, and torch's thread
count (the caller's is put back when no call's phase of several lanes runs); results stay
exact. A process forked from one that has called an executor (a server's workers forked from a
parent that loaded the model) makes its crews afresh: the workers of the parent's are not in
it, and work handed to them never ran.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from opsched._text import count
from opsched.errors import ExecutionError, OpschedError
from opsched.ir import Graph
from opsched.ir.ops import op_def
from opsched.runtime.kernels import bind_step
from opsched.runtime.plan import MERGED_OP, Plan, Step
from opsched.timeline import TraceEvent

__all__ = ["Item", "Program", "LaneExecutor", "torch_program", "step_category"]


def step_category(step: Step) -> str:
    """What a step mostly does, for pictures (:attr:`opsched.ir.OpSchema.category`)."""
    return "conv" if step.op == MERGED_OP else op_def(step.op).category


@dataclass(frozen=True, slots=True)
class Item:
    """One unit of a lane's work: reads and writes value slots; may wait for items of other lanes."""

    id: int
    label: str
    op: str
    run: Callable[[list[Any]], None]
    waits: tuple[int, ...] = ()
    category: str = "other"


@dataclass(frozen=True)
class Program:
    phases: tuple[tuple[tuple[Item, ...], ...], ...]  # per phase, per lane, the items in order
    frees: tuple[tuple[int, ...], ...]                 # per phase, the slots dead after it
    n_items: int
    n_slots: int
    input_slots: tuple[int, ...]
    output_slots: tuple[int, ...]
    encode: Callable[[torch.Tensor], Any] = staticmethod(lambda t: t)
    decode: Callable[[Any], torch.Tensor] = staticmethod(lambda v: v)
    sessions: tuple[Any, ...] = ()  # per item, the backend session that runs it (ONNX Runtime), or None
    #: The whole program as one call, inputs to outputs, where a backend has one (a plan that is
    #: one ONNX Runtime session); an untraced run takes it, skipping the slots.
    direct: Callable[[Sequence[torch.Tensor]], list[torch.Tensor]] | None = None


def torch_program(graph: Graph, plan: Plan) -> Program:
    """One item per step, each a bound torch kernel."""
    def item(s: int) -> Item:
        step = plan.steps[s]
        return Item(s, step.label, step.op, bind_step(graph, step), step.waits, step_category(step))
    phases = tuple(tuple(tuple(item(s) for s in lane) for lane in phase.lanes) for phase in plan.phases)
    return Program(phases, tuple(p.frees for p in plan.phases), len(plan.steps), len(plan.slot_names),
                   plan.input_slots, plan.output_slots)


class _Run:
    def __init__(self, program: Program, evented: bool, trace: list[TraceEvent] | None) -> None:
        self.slots: list[Any] = [None] * program.n_slots
        self.done = [threading.Event() for _ in range(program.n_items)] if evented else None
        self.failed = False
        self.trace = trace
        self.t0 = time.perf_counter()
        self.phase = 0


class _LaneThreads:
    """torch's intra-op thread count while phases of several lanes run: each phase sets its
    lanes' share, and the count the caller had is put back when the last phase of any call
    ends (overlapping calls' phases share the one process-wide count). Put back from the
    executor's own cores, it undid a count the caller had set since."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0  # phases of several lanes running, over every call
        self._callers = 0  # the count before the first of them

    @contextlib.contextmanager
    def share(self, threads: int) -> Iterator[None]:
        with self._lock:
            if not self._running:
                self._callers = torch.get_num_threads()
            self._running += 1
            torch.set_num_threads(threads)
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if not self._running:
                    torch.set_num_threads(self._callers)


_LANE_THREADS = _LaneThreads()

#: Every executor alive, so that a forked child can forget their crews (:func:`_forget_crews`).
_EXECUTORS: weakref.WeakSet[LaneExecutor] = weakref.WeakSet()


def _forget_crews() -> None:
    """In a forked child: no crew's workers came along, so none is kept (new ones are made)."""
    for executor in list(_EXECUTORS):
        executor._crews_lock = threading.Lock()
        executor._crews, executor._idle = [], []


if hasattr(os, "register_at_fork"):  # not on Windows, which does not fork
    os.register_at_fork(after_in_child=_forget_crews)


class LaneExecutor:
    """Runs a :class:`Program`: each phase's first lane on the caller's thread, the others on
    persistent workers (see the module docstring). An :class:`~opsched.backends.Executor`."""

    def __init__(self, program: Program, cores: int | None = None, name: str = "torch") -> None:
        self.program = program
        self.name = name
        self.cores = cores or torch.get_num_threads()
        self._evented = any(it.waits for phase in program.phases for lane in phase for it in lane)
        self._workers = max((len(phase) for phase in program.phases), default=1) - 1
        self._crews: list[ThreadPoolExecutor] = []  # every crew made
        self._idle: list[ThreadPoolExecutor] = []   # those no call holds
        self._crews_lock = threading.Lock()
        _EXECUTORS.add(self)

    def close(self) -> None:
        with self._crews_lock:
            crews, self._crews, self._idle = self._crews, [], []
        for crew in crews:
            crew.shutdown(wait=False)

    def _take_crew(self) -> ThreadPoolExecutor:
        """Workers for one call's lanes past the first, held by it alone (see the module docstring)."""
        with self._crews_lock:
            if self._idle:
                return self._idle.pop()
            crew = ThreadPoolExecutor(self._workers, thread_name_prefix=f"opsched-lane{len(self._crews)}")
            self._crews.append(crew)
            return crew

    def _give_back(self, crew: ThreadPoolExecutor) -> None:
        with self._crews_lock:
            if crew in self._crews:  # not closed meanwhile
                self._idle.append(crew)

    @property
    def sessions(self) -> int:
        """How many compiled units (ONNX Runtime sessions, Inductor-compiled segments) it runs;
        0 where every item is a torch kernel."""
        return sum(1 for s in self.program.sessions if s is not None)

    def describe(self) -> str:
        prog = self.program
        lanes = max((len(phase) for phase in prog.phases), default=1)
        return (f"{self.name}: {count(prog.n_items, 'item')} in {count(len(prog.phases), 'phase')} of up to "
                f"{count(lanes, 'lane')} on {count(self.cores, 'core')}")

    def trace(self, inputs: Sequence[torch.Tensor]) -> list[TraceEvent]:
        events: list[TraceEvent] = []
        self.run(inputs, events)
        return events

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return self.run(inputs)

    def run(self, inputs: Sequence[torch.Tensor], trace: list[TraceEvent] | None = None) -> list[torch.Tensor]:
        """Run the program; with a ``trace`` list, append one :class:`TraceEvent` per item."""
        prog = self.program
        if prog.direct is not None and trace is None:
            return prog.direct(inputs)
        run = _Run(prog, self._evented, trace)
        for slot, t in zip(prog.input_slots, inputs):
            run.slots[slot] = prog.encode(t)
        crew = self._take_crew() if self._workers else None
        try:
            for k, (lanes, frees) in enumerate(zip(prog.phases, prog.frees)):
                run.phase = k
                if len(lanes) == 1:
                    self._lane(lanes[0], run)
                else:
                    assert crew is not None
                    self._parallel(lanes, run, crew)
                for slot in frees:
                    run.slots[slot] = None
        finally:
            if crew is not None:
                self._give_back(crew)
        return [prog.decode(run.slots[s]) for s in prog.output_slots]

    def _parallel(self, lanes: tuple[tuple[Item, ...], ...], run: _Run, crew: ThreadPoolExecutor) -> None:
        with _LANE_THREADS.share(max(1, self.cores // len(lanes))):
            futures = [crew.submit(self._lane, lane, run, k) for k, lane in enumerate(lanes[1:], start=1)]
            error: BaseException | None = None
            try:
                self._lane(lanes[0], run)
            except BaseException as e:  # keep it until the other lanes have stopped
                error = e
            for f in futures:
                try:
                    f.result()
                except BaseException as e:
                    error = error or e
            if error is not None:
                raise error

    def _lane(self, lane: Sequence[Item], run: _Run, index: int = 0) -> None:
        slots, trace = run.slots, run.trace
        with torch.no_grad():  # grad mode is per thread: every lane sets it
            for it in lane:
                if it.waits:
                    assert run.done is not None
                    for w in it.waits:
                        run.done[w].wait()
                    if run.failed:
                        return
                try:
                    if trace is None:
                        it.run(slots)
                    else:
                        start = time.perf_counter()
                        it.run(slots)
                        end = time.perf_counter()
                        trace.append(TraceEvent(run.phase, index, it.label, it.op, (start - run.t0) * 1e3,
                                                (end - run.t0) * 1e3, it.category))
                except BaseException as e:
                    self._fail(run)
                    if isinstance(e, (OpschedError, KeyboardInterrupt)):
                        raise
                    raise ExecutionError(f"node {it.label!r} ({it.op}) failed: {type(e).__name__}: {e}") from e
                if run.done is not None:
                    run.done[it.id].set()

    @staticmethod
    def _fail(run: _Run) -> None:
        run.failed = True
        if run.done is not None:  # wake every lane waiting on an event that will never come
            for event in run.done:
                event.set()

"""The CUDA executor: a plan's lanes on CUDA streams, the whole plan captured into one CUDA graph.

The executor runs a :class:`~opsched.runtime.stream_program.StreamProgram` (launches, event
records and waits, releases, all decided when the plan was lowered). The first call captures
that program into one CUDA graph: warm-up runs on a side stream first (cuDNN autotuning, lazy
initialisation, allocator pools), then one capture, in which the side streams fork from and
join back to the capture stream through the program's own events. Later calls copy the inputs
into the graph's static input buffers, replay it, and return its outputs (cloned, unless
``copy_outputs=False``: then the returned tensors are the graph's own buffers, overwritten by
the next call). Where capture is impossible (an opaque node that runs on the host) or fails,
the executor logs why once and keeps running the same program eagerly on the streams.

Several threads may call one executor: its calls take turns, as the graph's static buffers and
the program's events are one set for all of them (two at once would each read the other's
inputs, or wait on the other's events), and a call on another stream than the last one's
first waits for the work of that stream, as the buffers it overwrites may still be being read
there. The capture errors only on what its own thread does (``thread_local``, as Inductor's
CUDA graphs capture), so another thread's work on the GPU, another model's, neither breaks it
nor is broken by it.

The device is reached through a small :class:`StreamDevice` interface, so the whole walk
(stream switching, events, releases, the capture fallback) also runs against a recording
stand-in in the CPU tests; only :class:`TorchCuda` touches ``torch.cuda``. The backends that
run it (:mod:`.cuda`, :mod:`.cuda_inductor`) prepare it and time stages with it.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from opsched._text import count
from opsched.backends.lanes import step_category
from opsched.errors import ExecutionError, InputMismatchError, OpschedError
from opsched.ir import Graph
from opsched.runtime import Plan
from opsched.runtime.kernels import bind_step
from opsched.runtime.stream_program import Launch, Record, Release, StreamProgram, Wait, stream_program
from opsched.timeline import TraceEvent

__all__ = ["StreamDevice", "TorchCuda", "CudaExecutor", "FusedSegment", "capture_blocker"]

log = logging.getLogger(__name__)


class StreamDevice(Protocol):
    """What the executor needs from a stream-ordered device."""

    def current_stream(self) -> Any: ...
    def new_stream(self) -> Any: ...
    def set_stream(self, stream: Any) -> None: ...
    def new_event(self, timing: bool = False) -> Any: ...
    def record(self, event: Any, stream: Any) -> None: ...
    def wait(self, stream: Any, event: Any) -> None: ...
    def synchronize(self) -> None: ...
    def elapsed_ms(self, start: Any, end: Any) -> float: ...
    def capture(self, run: Callable[[], list[torch.Tensor]], warmup: int) -> tuple[Callable[[], None],
                                                                                   list[torch.Tensor]]: ...


class TorchCuda:
    """:class:`StreamDevice` on one CUDA device through ``torch.cuda``."""

    def __init__(self, device: torch.device) -> None:
        if not torch.cuda.is_available():
            raise OpschedError("CUDA is not available: this torch build or machine has no GPU "
                               "(torch.cuda.is_available() is False); run on device='cpu'")
        self.device = device
        torch.backends.cudnn.benchmark = True  # autotune each convolution shape once, in the warm-up

    def current_stream(self) -> Any:
        return torch.cuda.current_stream(self.device)

    def new_stream(self) -> Any:
        return torch.cuda.Stream(self.device)

    def set_stream(self, stream: Any) -> None:
        torch.cuda.set_stream(stream)

    def new_event(self, timing: bool = False) -> Any:
        return torch.cuda.Event(enable_timing=timing)

    def record(self, event: Any, stream: Any) -> None:
        event.record(stream)

    def wait(self, stream: Any, event: Any) -> None:
        stream.wait_event(event)

    def synchronize(self) -> None:
        torch.cuda.synchronize(self.device)

    def elapsed_ms(self, start: Any, end: Any) -> float:
        return float(start.elapsed_time(end))

    def capture(self, run: Callable[[], list[torch.Tensor]], warmup: int) -> tuple[Callable[[], None],
                                                                                   list[torch.Tensor]]:
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(warmup):
                run()
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with warnings.catch_warnings():
            # a plan of views alone (a stage being timed, a model that reshapes its input)
            # launches nothing: its graph is empty, which torch warns of and we expect
            warnings.filterwarnings("ignore", "The CUDA Graph is empty", UserWarning)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                outputs = run()
        return graph.replay, outputs


def capture_blocker(graph: Graph) -> str | None:
    """Why a plan of ``graph`` cannot be captured, or None."""
    opaque = [n.name for n in graph.nodes if n.op == "opaque"]
    if opaque:
        return (f"node {opaque[0]!r}{f' and {len(opaque) - 1} more' if len(opaque) > 1 else ''} is opaque "
                "(runs its Python callable on the host)")
    return None


@dataclass(frozen=True)
class FusedSegment:
    """Consecutive steps of one lane that one compiled function runs (an Inductor-compiled
    segment, :mod:`.cuda_inductor`): the steps, ``run`` (reads its inputs from the slots and
    writes its outputs there), a label, and what it is (``op``)."""

    steps: tuple[int, ...]
    run: Callable[[list[Any]], None]
    label: str
    op: str


@dataclass
class _Run:
    slots: list[Any]
    streams: list[Any]


class CudaExecutor:
    """Runs ``plan`` (lowered from a graph placed on ``device``) on CUDA streams, captured into
    one CUDA graph when ``graphs`` is true (see the module docstring)."""

    def __init__(self, graph: Graph, plan: Plan, *, device: str | torch.device = "cuda", graphs: bool = True,
                 copy_outputs: bool = True, channels_last: bool = False, warmup: int = 3,
                 stream_device: StreamDevice | None = None, segments: Sequence[FusedSegment] = ()) -> None:
        self.graph, self.plan = graph, plan
        self.device = torch.device(device)
        self.dev: StreamDevice = stream_device if stream_device is not None else TorchCuda(self.device)
        self.program: StreamProgram = stream_program(plan)
        # a fused segment runs at its first step's launch, on that step's stream; its other steps
        # launch nothing (the cut ends a segment at any step another stream waits for)
        self.segments = tuple(segments)
        self._head = {seg.steps[0]: seg for seg in self.segments}
        self._inside = {s for seg in self.segments for s in seg.steps[1:]}
        self.copy_outputs, self.channels_last, self.warmup = copy_outputs, channels_last, warmup
        self._side = [self.dev.new_stream() for _ in range(self.program.n_streams - 1)]
        self._events = [self.dev.new_event() for _ in range(self.program.n_events)]
        self._ops = [self._compile(op) for op in self.program.ops]
        self._phase_lane = {s: (k, li) for k, ph in enumerate(plan.phases) for li, lane in enumerate(ph.lanes)
                            for s in lane}
        self.capture_error: str | None = None if graphs else "CUDA graphs turned off"
        if graphs and (why := capture_blocker(graph)):
            self._give_up_capture(why)
        self._replay: Callable[[], None] | None = None
        self._static_in: list[torch.Tensor] = []
        self._static_out: list[torch.Tensor] = []
        self._lock = threading.Lock()  # one call at a time (see the module docstring)
        self._last_stream: Any = None  # the stream the last call ran on
        self._handover = self.dev.new_event()

    @property
    def captured(self) -> bool:
        return self._replay is not None

    def replay(self) -> None:
        """Replay the captured graph on the static inputs of the last call (for timing)."""
        if self._replay is None:
            raise ExecutionError(f"graph {self.graph.name!r} has no captured CUDA graph to replay "
                                 f"({self.capture_error or 'not called yet'})")
        self._replay()

    def close(self) -> None:
        self._replay, self._static_in, self._static_out = None, [], []

    # --- the program walk -----------------------------------------------------------------
    def _compile(self, op: Any) -> Callable[[_Run], None]:
        dev, events = self.dev, self._events
        if isinstance(op, Launch):
            if op.step in self._inside:
                return _nothing
            seg = self._head.get(op.step)
            run_step = seg.run if seg is not None else bind_step(self.graph, self.plan.steps[op.step], release=False)
            label, what, _ = self._what(op.step)
            noun, stream = "node" if seg is None else "segment", op.stream

            def launch(r: _Run) -> None:
                dev.set_stream(r.streams[stream])
                try:
                    run_step(r.slots)
                except OpschedError:
                    raise
                except Exception as e:
                    raise ExecutionError(f"{noun} {label!r} ({what}) failed on {self.device}: "
                                         f"{type(e).__name__}: {e}") from e
            return launch
        if isinstance(op, Record):
            def record(r: _Run, e: int = op.event, s: int = op.stream) -> None:
                dev.record(events[e], r.streams[s])
            return record
        if isinstance(op, Wait):
            def wait(r: _Run, e: int = op.event, s: int = op.stream) -> None:
                dev.wait(r.streams[s], events[e])
            return wait
        assert isinstance(op, Release)

        def release(r: _Run, slots: tuple[int, ...] = op.slots) -> None:
            for slot in slots:
                r.slots[slot] = None
        return release

    def _what(self, s: int) -> tuple[str, str, str]:
        """What launching step ``s`` runs, as (label, op, category): its node, or its segment."""
        seg = self._head.get(s)
        if seg is not None:
            return seg.label, seg.op, "segment"
        step = self.plan.steps[s]
        return step.label, step.op, step_category(step)

    def _walk(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        base = self.dev.current_stream()
        run = _Run([None] * len(self.plan.slot_names), [base, *self._side])
        for slot, t in zip(self.plan.input_slots, inputs):
            run.slots[slot] = t
        try:
            with torch.no_grad():
                for op in self._ops:
                    op(run)
        finally:
            self.dev.set_stream(base)
        return [run.slots[s] for s in self.plan.output_slots]

    # --- calls ----------------------------------------------------------------------------
    def _check(self, inputs: Sequence[torch.Tensor]) -> None:
        for spec, t in zip(self.graph.inputs, inputs):
            if t.device != self.device and not (self.device.index is None and t.device.type == self.device.type):
                raise InputMismatchError(f"input {spec.name!r} of graph {self.graph.name!r} is on {t.device}; "
                                         f"this module runs on {self.device}: move it there first")

    def _layout(self, t: torch.Tensor) -> torch.Tensor:
        return t.contiguous(memory_format=torch.channels_last) if self.channels_last and t.dim() == 4 else t

    def _give_up_capture(self, why: str) -> None:
        self.capture_error = why
        log.warning("graph %r: not captured into a CUDA graph (%s); running eagerly on %d stream(s)",
                    self.graph.name, why, self.program.n_streams)

    def describe(self) -> str:
        captured = (f"not captured into a CUDA graph: {self.capture_error}" if self.capture_error
                    else "captured into one CUDA graph")
        fused = f", {count(len(self.segments), 'compiled segment')}" if self.segments else ""
        return f"cuda: {count(self.program.n_streams, 'CUDA stream')} on {self.device}{fused}; {captured}"

    def trace(self, inputs: Sequence[torch.Tensor]) -> list[TraceEvent]:
        """Run the plan eagerly once with CUDA events around each step: one event per step."""
        self._check(inputs)
        events: list[TraceEvent] = []
        with self._lock:
            self._follow_last_call()
            self._traced([self._layout(t) for t in inputs], events)
        return events

    def _follow_last_call(self) -> None:
        """Make the caller's stream wait for the last call's, where they differ."""
        stream = self.dev.current_stream()
        if self._last_stream is not None and stream != self._last_stream:
            self.dev.record(self._handover, self._last_stream)
            self.dev.wait(stream, self._handover)
        self._last_stream = stream

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Run the plan (captured into a CUDA graph on the first call, where it can be)."""
        self._check(inputs)
        with self._lock:
            self._follow_last_call()
            return self._run(inputs)

    def _run(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.capture_error is not None:
            return self._walk([self._layout(t) for t in inputs])
        if self._replay is None:
            self._static_in = [self._layout(t).clone(memory_format=torch.preserve_format) for t in inputs]
            try:
                self._replay, self._static_out = self.dev.capture(lambda: self._walk(self._static_in), self.warmup)
            except ExecutionError:
                raise
            except Exception as e:  # capture refused (an op that syncs, an unsupported call, ...)
                self._replay, self._static_in = None, []
                self._give_up_capture(f"capture failed: {type(e).__name__}: {e}")
                return self._walk([self._layout(t) for t in inputs])
        for static, t in zip(self._static_in, inputs):
            static.copy_(t)  # into the static buffer's layout
        self._replay()
        return [o.clone() for o in self._static_out] if self.copy_outputs else list(self._static_out)

    def _traced(self, inputs: list[torch.Tensor], trace: list[TraceEvent]) -> list[torch.Tensor]:
        marks: dict[int, tuple[Any, Any]] = {}
        dev = self.dev
        origin = dev.new_event(timing=True)
        base = dev.current_stream()
        dev.record(origin, base)
        streams = [base, *self._side]
        run = _Run([None] * len(self.plan.slot_names), streams)
        for slot, t in zip(self.plan.input_slots, inputs):
            run.slots[slot] = t
        try:
            with torch.no_grad():
                for op, fn in zip(self.program.ops, self._ops):
                    if isinstance(op, Launch) and op.step not in self._inside:
                        start, end = dev.new_event(timing=True), dev.new_event(timing=True)
                        dev.record(start, streams[op.stream])
                        fn(run)
                        dev.record(end, streams[op.stream])
                        marks[op.step] = (start, end)
                    else:
                        fn(run)
        finally:
            dev.set_stream(base)
        dev.synchronize()
        for s, (start, end) in sorted(marks.items(), key=lambda kv: dev.elapsed_ms(origin, kv[1][0])):
            phase, lane = self._phase_lane[s]
            label, what, category = self._what(s)
            trace.append(TraceEvent(phase, lane, label, what, dev.elapsed_ms(origin, start),
                                    dev.elapsed_ms(origin, end), category))
        return [run.slots[s] for s in self.plan.output_slots]


def _nothing(_: Any) -> None:
    """A launch that runs nothing: a step its segment's first launch already ran."""

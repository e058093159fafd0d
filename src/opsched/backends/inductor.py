"""The Inductor backend: each lane segment of a plan compiled by TorchInductor, on CPU threads.

Inductor fuses pointwise work into its neighbours and, on a CPU, generates C++ (OpenMP) kernels
around oneDNN convolutions and matrix products, with the weights frozen in (prepacked for
oneDNN). It runs one stream of work; opsched's plan decides what runs at once. So each lane of
each phase is cut into segments (:mod:`.segments`, the cut ONNX Runtime sessions use: a step
another lane waits for ends a segment), each segment is traced to an ATen graph with
``make_fx`` and compiled by ``torch.compile(backend="inductor")`` for the threads its lane gets
(``cpp.threads``: a lane of a phase of k lanes has ``cores // k``) and for the values its
producers made on the example (their strides: a channels-last convolution output, a band of
rows as a view; compiled on fresh contiguous tensors, a segment compiled again at its first
call), and the lanes run on CPU
threads as every CPU plan does (:mod:`.lanes`). Every step has a torch kernel, so every step
joins a segment; calls that are only Python (opaque nodes) are traced through.

Compiling is slow (about a second per segment on two cores once Inductor's caches are warm, tens
of seconds cold), so segments are compiled when the executor is prepared, and the time it took is
in :meth:`InductorExecutor.describe`; Inductor's own on-disk caches make the next process's
compile of the same segments fast. Measured costs time each stage compiled, as it will run; the
profile store keeps them, so a model is measured once per machine.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.fx.experimental.proxy_tensor import make_fx

from opsched._text import count
from opsched.backends.base import CpuBackend, Executor, register_backend
from opsched.backends.lanes import Item, LaneExecutor
from opsched.backends.segments import Segment, SegmentBuilder
from opsched.errors import ExecutionError
from opsched.execution import RunOptions
from opsched.ir import Graph
from opsched.runtime import Plan
from opsched.runtime.kernels import step_kernel

__all__ = ["InductorBackend", "InductorExecutor", "InductorSegments", "inductor_available", "compile_segment"]

#: A segment compiled: its input slots' values to its output slots' values.
CompiledSegment = Callable[..., tuple[torch.Tensor, ...]]

#: Inductor's options for every segment (besides its thread count).
INDUCTOR_OPTIONS: dict[str, Any] = {"freezing": True}


def inductor_available() -> str | None:
    """Why Inductor cannot compile for this CPU here (no C++ compiler), or None."""
    if not any(shutil.which(cc) for cc in ("g++", "clang++", "c++")):
        return "Inductor's CPU code generation needs a C++ compiler (g++ or clang++) on the PATH"
    return None


class InductorSegments(SegmentBuilder):
    """Every step joins a segment; each segment one Inductor-compiled function on ``device``
    (with Inductor ``options``; on a CPU, also the threads its lane gets). ``frees``: whether a
    segment drops the values that die in it, as CPU lanes do; on CUDA streams the stream program
    releases values where every stream is done with them."""

    def __init__(self, graph: Graph, plan: Plan, cores: int, device: torch.device | None = None,
                 options: dict[str, Any] | None = None, frees: bool = True) -> None:
        super().__init__(graph, plan, cores)
        self.device = device or torch.device("cpu")
        self.options = options or {}
        self.frees = frees
        self.compile_seconds = 0.0
        # each compiled segment's outputs on the example, kept until the last segment reading
        # them is compiled: a segment is compiled on what its producers give, strides and all
        # (an Inductor convolution's output is channels-last; a band of rows is a view), not on
        # fresh contiguous tensors, which would make it compile again at its first call
        self.examples: dict[int, torch.Tensor] = {}
        self.compiled: set[int] = set()  # the steps compiled so far

    def fits(self, s: int) -> bool:
        return True

    def step_item(self, s: int) -> Item:
        raise AssertionError("every step fits an Inductor segment")

    def segment_item(self, segment: Segment, threads: int) -> tuple[Item, Any]:
        start = time.perf_counter()
        compiled = self._compile(segment, threads)
        self.compile_seconds += time.perf_counter() - start
        ins, outs, frees = segment.inputs, segment.outputs, segment.frees if self.frees else ()

        def run(slots: list[Any]) -> None:
            for slot, value in zip(outs, compiled(*[slots[i] for i in ins])):
                slots[slot] = value
            for f in frees:
                slots[f] = None
        op = f"inductor[{count(len(segment.steps), 'step')}]"
        return Item(len(self.items), segment.label, op, run, (), "segment"), compiled

    def _compile(self, segment: Segment, threads: int) -> CompiledSegment:
        example = [self._example(slot) for slot in segment.inputs]
        options = self.options
        threads_before = torch.get_num_threads()
        if self.device.type == "cpu":
            options = {**options, "cpp.threads": threads}
            torch.set_num_threads(threads)  # compiled at the threads its lane will have
        try:
            compiled, made = compile_segment(self.graph, self.plan, segment, example, options)
        finally:
            torch.set_num_threads(threads_before)
        self.compiled.update(segment.steps)
        self.examples.update(zip(segment.outputs, made))
        for slot in {*segment.inputs, *segment.outputs}:
            if not self.readers.get(slot, set()) - self.compiled:
                self.examples.pop(slot, None)
        return compiled

    def _example(self, slot: int) -> torch.Tensor:
        """The value of ``slot`` to compile a reader of it on: what its segment made, or (a graph
        input, contiguous as the executor passes them) zeros."""
        if slot in self.examples:
            return self.examples[slot]
        t = self.graph.types[self.plan.slot_names[slot]]
        return torch.zeros(t.shape, dtype=getattr(torch, t.dtype), device=self.device)


def compile_segment(graph: Graph, plan: Plan, segment: Segment, example: Sequence[torch.Tensor],
                    options: dict[str, Any]) -> tuple[CompiledSegment, tuple[torch.Tensor, ...]]:
    """``segment``'s steps as one function of its input slots' values returning its output
    slots' values, and what it returns on ``example`` (a value per input slot, on the device to
    compile for): traced to an ATen graph with ``make_fx`` on ``example``, compiled by Inductor
    with :data:`INDUCTOR_OPTIONS` and ``options`` for tensors of ``example``'s sizes and
    strides, and run once on it (so it is compiled now)."""
    steps = plan.steps
    kernels = [(step_kernel(graph, steps[s]), steps[s].inputs, steps[s].outputs) for s in segment.steps]
    ins, outs = segment.inputs, segment.outputs

    def body(*values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        env = dict(zip(ins, values))
        for kernel, reads, writes in kernels:
            result = kernel(*[env[i] for i in reads])
            if len(writes) == 1:
                env[writes[0]] = result
            else:
                env.update(zip(writes, result))
        return tuple(env[o] for o in outs)

    device = example[0].device if example else torch.device("cpu")
    try:
        with torch.no_grad():
            traced = make_fx(body)(*example)
            compiled = torch.compile(traced, backend="inductor", dynamic=False, fullgraph=True,
                                     options={**INDUCTOR_OPTIONS, **options})
            made = compiled(*example)
    except Exception as e:
        raise ExecutionError(f"Inductor could not compile segment {segment.label!r} of {graph.name!r} "
                             f"({count(len(segment.steps), 'step')}) for {device}: {type(e).__name__}: {e}") from e
    return compiled, tuple(made)


class InductorExecutor(LaneExecutor):
    """A plan whose lane segments run as Inductor-compiled functions (module docstring)."""

    def __init__(self, graph: Graph, plan: Plan, cores: int | None = None) -> None:
        cores = cores or torch.get_num_threads()
        segments = InductorSegments(graph, plan, cores)
        super().__init__(segments.build(), cores, "inductor")
        self.compile_seconds = segments.compile_seconds

    def describe(self) -> str:
        prog = self.program
        return (f"inductor: {count(prog.n_items, 'compiled segment')} in {count(len(prog.phases), 'phase')} on "
                f"{count(self.cores, 'core')} (compiled in {self.compile_seconds:.1f} s)")

    def run(self, inputs: Sequence[torch.Tensor], trace: list[Any] | None = None) -> list[torch.Tensor]:
        # compiled segments expect contiguous inputs of the layout they were traced with
        return super().run([t.contiguous() for t in inputs], trace)


class InductorBackend(CpuBackend):
    """Inductor-compiled lane segments on CPU threads."""

    name = "inductor"

    def unavailable(self) -> str | None:
        return inductor_available()

    def versions(self) -> str:
        return f"torch={torch.__version__} inductor"

    def prepare(self, graph: Graph, plan: Plan, run: RunOptions) -> Executor:
        return InductorExecutor(graph, plan, run.cores)


register_backend(InductorBackend())

"""The ONNX Runtime backend: each lane segment of a plan runs as one ORT session.

On a CPU, ONNX Runtime's kernels are much faster than eager PyTorch's at batch 1 (ORT's own
sequential session ran the zoo 1.5-3.4x faster than eager in docs/results/cpu.md, on a 2-core
machine), so opsched runs its plans with them: every
lane of every phase is cut into maximal segments of exportable steps, each segment exported
(:mod:`opsched.runtime.onnx_export`) and loaded as its own session with its share of the
cores as intra-op threads. ORT releases the GIL while it runs, so the lanes of a phase truly
run at once, and a long single-lane phase is simply ORT running a big subgraph sequentially.
Steps that cannot be exported (opaque calls) run with torch in between; a step that another
lane waits for ends its segment so its event can be set. Values travel as NumPy arrays
(zero-copy to and from torch).

A segment is not free to cut: ONNX Runtime runs convolutions in a blocked layout (NCHWc) and
converts tensors into it and back (``ReorderInput``/``ReorderOutput`` kernels) where a session
begins and ends, so every extra segment pays those conversions and a call. With ``profile_dir``
the sessions record ORT's own per-kernel timings (:func:`kernel_times`), which is how the
measured cost model tells a stage's kernels from what being a session of its own added.
"""

from __future__ import annotations

import bisect
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from opsched.ir import Graph
from opsched.runtime.cpu import Item, LaneExecutor, Program, TraceEvent
from opsched.runtime.onnx_export import export_segment, exportable
from opsched.runtime.plan import Plan

__all__ = ["ort_available", "ort_program", "OrtExecutor", "KernelEvent", "KernelTimes", "kernel_events", "kernel_times",
           "profiled_trace", "LAYOUT_KERNELS"]

#: The kernels ORT inserts to move tensors into and out of its blocked layout.
LAYOUT_KERNELS = ("ReorderInput", "ReorderOutput")


def ort_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


def _session(model_bytes: bytes, threads: int, profile_prefix: str | None = None, spin: bool = False) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # idle ORT threads spin only where told (see ort_program): other lanes and sessions need the cores
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.log_severity_level = 3
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def _to_numpy(v: Any) -> np.ndarray:
    return v.detach().numpy() if isinstance(v, torch.Tensor) else v


@dataclass(frozen=True, slots=True)
class KernelEvent:
    """One kernel of one run of a profiled session, by ORT's own timing."""

    name: str        # ORT's node name (for opsched's exports, it starts with its step's label)
    op: str          # ORT's operator kind: Conv, MaxPool, ReorderInput...
    start_ms: float  # from the start of the run
    dur_ms: float


@dataclass(frozen=True, slots=True)
class KernelTimes:
    """One run of a profiled session, by ORT's own kernel timings (ms)."""

    compute_ms: float     # every kernel but the layout conversions
    layout_in_ms: float   # conversions into the blocked layout (``ReorderInput``)
    layout_out_ms: float  # conversions out of it (``ReorderOutput``)


def kernel_events(session: Any) -> list[list[KernelEvent]]:
    """End the profiling of a session made with a ``profile_dir``; per run, in order, its kernels."""
    path = session.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        os.remove(path)
    runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    out: list[list[KernelEvent]] = [[] for _ in runs]
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        k = bisect.bisect_right(runs, e["ts"]) - 1
        if k >= 0:
            out[k].append(KernelEvent(name.removesuffix("_kernel_time"), e.get("args", {}).get("op_name", ""),
                                      (e["ts"] - runs[k]) / 1e3, e["dur"] / 1e3))
    return out


def kernel_times(session: Any) -> list[KernelTimes]:
    """End the profiling of a session made with a ``profile_dir``; per run, in order, its kernel
    times. (A layout conversion inside a session, before an operator that has no blocked kernel,
    counts as layout too; in the zoo that is only the classifier's flatten.)"""
    times = []
    for run in kernel_events(session):
        sums = dict.fromkeys(("compute", *LAYOUT_KERNELS), 0.0)
        for e in run:
            sums[e.op if e.op in LAYOUT_KERNELS else "compute"] += e.dur_ms
        times.append(KernelTimes(sums["compute"], *(sums[op] for op in LAYOUT_KERNELS)))
    return times


def profiled_trace(graph: Graph, plan: Plan, inputs: Sequence[torch.Tensor],
                   cores: int | None = None) -> list[TraceEvent]:
    """Run ``plan`` once (after a warm-up) on sessions that profile themselves: one event per
    kernel, on its lane, at its time within its segment's call, named and typed after the step it
    computes (ORT's conversions into and out of its blocked layout as ``layout``; a kernel whose
    name names no step keeps ORT's name and kind); steps run with torch keep their own events."""
    labels = {st.label: st.op for st in plan.steps}
    with tempfile.TemporaryDirectory(prefix="opsched-ort-profile-") as profile_dir:
        executor = OrtExecutor(graph, plan, cores, profile_dir=profile_dir)
        try:
            executor(inputs)
            items: list[TraceEvent] = []
            executor(inputs, trace=items)
        finally:
            executor.close()
        program = executor.program
        runs = {i: kernel_events(s)[-1] for i, s in enumerate(program.sessions) if s is not None}
    item_of = {(k, li, it.label): it.id for k, phase in enumerate(program.phases)
               for li, lane in enumerate(phase) for it in lane}
    out: list[TraceEvent] = []
    for e in items:
        kernels = runs.get(item_of[(e.phase, e.lane, e.label)])
        if kernels is None:
            out.append(e)
            continue
        for ke in kernels:
            owner = _owner(ke.name, labels)
            op = "layout" if ke.op in LAYOUT_KERNELS else labels[owner] if owner else f"onnxruntime:{ke.op}"
            start = e.start_ms + ke.start_ms
            out.append(TraceEvent(e.phase, e.lane, owner or ke.name, op, start, start + ke.dur_ms))
    return out


def _owner(name: str, labels: Mapping[str, str]) -> str | None:
    """The step whose label is the longest prefix of an ORT node name (ORT extends the names it
    is given when it fuses or converts nodes)."""
    for cut in range(len(name), 0, -1):
        if name[:cut] in labels:
            return name[:cut]
    return None


def ort_program(graph: Graph, plan: Plan, cores: int, profile_dir: str | None = None,
                spin: bool = False) -> Program:
    """Segments of ``plan`` as ORT sessions; with ``profile_dir``, sessions that profile
    themselves there (read them with :func:`kernel_times` or :func:`kernel_events`, from
    ``Program.sessions``).

    With ``spin``, a plan that is one ORT session (one lane, every step exportable) lets that
    session's idle intra-op threads spin between kernels, ONNX Runtime's default, instead of
    sleeping and being woken for every kernel: on two cores its sequential plans of the zoo ran
    1.05x (Inception V3) to 1.7x (RandWire-small) faster, timed in blocks. After a run the spinning threads keep
    a core busy for tens of milliseconds, so plans of several sessions or lanes never spin
    (they would take the cores their other sessions need); nor do stages being measured."""
    steps = plan.steps
    readers: dict[int, set[int]] = {}
    for s, step in enumerate(steps):
        for slot in step.inputs:
            readers.setdefault(slot, set()).add(s)
    waited = {w for step in steps for w in step.waits}
    outputs = set(plan.output_slots)
    names = plan.slot_names
    item_of: dict[int, int] = {}
    items: list[Item] = []
    session_of: dict[int, Any] = {}  # item -> its session

    def torch_item(s: int) -> Item:
        step = steps[s]
        kernel, ins, outs, frees = step.kernel, step.inputs, step.outputs, step.frees

        def run(slots: list[Any]) -> None:
            result = kernel(*[torch.from_numpy(np.asarray(slots[i])) for i in ins])
            values = (result,) if len(outs) == 1 else result
            for slot, value in zip(outs, values):
                slots[slot] = value.numpy()
            for f in frees:
                slots[f] = None
        return Item(len(items), step.label, step.op, run)

    def ok(s: int) -> bool:
        return all(exportable(graph, graph.node(v)) for v in steps[s].nodes)

    one_session = spin and len(plan.phases) == 1 and len(plan.phases[0].lanes) == 1 and all(
        ok(s) for s in plan.phases[0].lanes[0])

    def ort_item(segment: list[int], threads: int) -> Item:
        inside = set(segment)
        produced: set[int] = set()
        ins: list[int] = []
        for s in segment:
            for slot in steps[s].inputs:
                if slot not in produced and slot not in ins:
                    ins.append(slot)
            produced.update(steps[s].outputs)
        outs = [slot for s in segment for slot in steps[s].outputs
                if slot in outputs or readers.get(slot, set()) - inside]
        model = export_segment(graph, [steps[s].nodes for s in segment], [names[i] for i in ins],
                               [names[o] for o in outs])
        prefix = None if profile_dir is None else os.path.join(profile_dir, f"segment{len(items)}")
        session = session_of[len(items)] = _session(model.SerializeToString(), threads, prefix, one_session)
        in_names, out_names = [names[i] for i in ins], [names[o] for o in outs]
        frees = [f for s in segment for f in steps[s].frees]

        def run(slots: list[Any]) -> None:
            feeds = {n: np.ascontiguousarray(slots[i]) for n, i in zip(in_names, ins)}
            for slot, value in zip(outs, session.run(out_names, feeds)):
                slots[slot] = value
            for f in frees:
                slots[f] = None
        first, last = steps[segment[0]].label, steps[segment[-1]].label
        label = first if len(segment) == 1 else f"{first}..{last}"
        return Item(len(items), label, f"onnxruntime[{len(segment)} steps]", run)

    phases: list[list[list[tuple[Item, list[int]]]]] = []
    for phase in plan.phases:
        threads = max(1, cores // len(phase.lanes))
        lanes = []
        for lane in phase.lanes:
            built: list[tuple[Item, list[int]]] = []
            segment: list[int] = []

            def emit(item: Item, members: list[int]) -> None:
                items.append(item)
                built.append((item, members))
                for member in members:
                    item_of[member] = item.id

            def close() -> None:
                if segment:
                    emit(ort_item(segment, threads), list(segment))
                    segment.clear()

            for s in lane:
                if steps[s].waits:
                    close()  # a step that waits on another lane starts a new segment
                if ok(s):
                    segment.append(s)
                    if s in waited:
                        close()  # another lane waits for this step: end its segment here
                else:
                    close()
                    emit(torch_item(s), [s])
            close()
            lanes.append(built)
        phases.append(lanes)

    def with_waits(item: Item, members: list[int]) -> Item:
        waits = {item_of[w] for m in members for w in steps[m].waits} - {item.id}
        return Item(item.id, item.label, item.op, item.run, tuple(sorted(waits)))

    program_phases = tuple(tuple(tuple(with_waits(it, members) for it, members in lane) for lane in lanes)
                           for lanes in phases)
    return Program(program_phases, tuple(p.frees for p in plan.phases), len(items), len(names), plan.input_slots,
                   plan.output_slots, encode=_to_numpy, decode=lambda v: torch.from_numpy(np.asarray(v)),
                   sessions=tuple(session_of.get(i) for i in range(len(items))))


def OrtExecutor(graph: Graph, plan: Plan, cores: int | None = None,  # noqa: N802 (a factory)
                profile_dir: str | None = None, spin: bool = False) -> LaneExecutor:
    cores = cores or torch.get_num_threads()
    return LaneExecutor(ort_program(graph, plan, cores, profile_dir, spin), cores)

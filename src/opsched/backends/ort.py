"""The ONNX Runtime backend: each lane segment of a plan runs as one ORT session.

On a CPU, ONNX Runtime's kernels are much faster than eager PyTorch's at batch 1 (ORT's own
sequential session ran the zoo 1.5-3.4x faster than eager in docs/results/cpu.md, on a 2-core
machine), so opsched runs its plans with them: every lane of every phase is cut into maximal
segments of exportable steps, each segment exported (:mod:`.ort_export`) and loaded as its own
session with its share of the cores as intra-op threads. ORT releases the GIL while it runs, so
the lanes of a phase truly run at once, and a long single-lane phase is simply ORT running a
big subgraph sequentially. Steps that cannot be exported (opaque calls) run with torch in
between; a step that another lane waits for ends its segment so its event can be set. Values
travel as NumPy arrays (zero-copy to and from torch).

A segment is not free to cut: ORT converts tensors into its blocked layout and back where a
session begins and ends, so every extra segment pays those conversions and a call. That is
what :meth:`OrtBackend.segment_cut` prices, from calibrations measured once per machine (and
once per model, for what cutting its segments costs beyond calls and conversions).
"""

from __future__ import annotations

import dataclasses
import os
import statistics
import tempfile
import threading
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from opsched._text import count
from opsched.backends.base import CpuBackend, Executor, register_backend
from opsched.backends.lanes import Item, LaneExecutor, Program, step_category
from opsched.backends.ort_export import export_segment, exportable
from opsched.backends.ort_profile import KernelTimes, kernel_events, kernel_times, ort_category, owner
from opsched.backends.segments import Segment, SegmentBuilder
from opsched.cost import SegmentCut, StageTiming, TimingPolicy
from opsched.cost.measured import Calibrations
from opsched.errors import ExecutionError
from opsched.execution import RunOptions
from opsched.ir import Graph, GraphBuilder, random_inputs
from opsched.ir.analysis import live_values
from opsched.ir.ops import op_def
from opsched.runtime import Plan, lower
from opsched.runtime.kernels import step_kernel
from opsched.runtime.plan import Step, cut_segments
from opsched.schedule import Schedule, Stage
from opsched.schedulers.sequential import sequential_stages
from opsched.timeline import TraceEvent
from opsched.timing import interleave

__all__ = ["OrtBackend", "OrtExecutor", "ort_available", "ort_program"]


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
    """``v`` as an array sharing its memory; a lazily conjugated or negated view (``z.conj()``)
    is made real first, as NumPy has no such views."""
    return v.detach().resolve_conj().resolve_neg().numpy() if isinstance(v, torch.Tensor) else v


def _to_torch(v: Any) -> torch.Tensor:
    return torch.from_numpy(np.asarray(v))


#: The op of a join whose parts were written in place (an item with nothing left to compute).
JOIN_IN_PLACE = "join in place"


@dataclass(frozen=True)
class _Join:
    """A join of batch slices (a ``concat`` along axis 0): its slot, its whole value's shape and
    dtype, and per part, the slot and the samples it fills."""

    slot: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    parts: tuple[tuple[int, int, int], ...]


class _OrtSegments(SegmentBuilder):
    """Each segment of exportable steps one ORT session; the other steps torch items between them,
    values held as NumPy arrays.

    A join of batch slices across lanes (the instances of a split sub-graph joined again) costs no
    copy: the first session to make one of its parts allocates the whole value, and every session
    making a part writes it, through ONNX Runtime's I/O binding, straight into its samples of that
    value (a contiguous view); the join itself then only checks that each part is in place
    (copying a part that a torch step made)."""

    encode = staticmethod(_to_numpy)
    decode = staticmethod(_to_torch)

    def __init__(self, graph: Graph, plan: Plan, cores: int, profile_dir: str | None, spin: bool) -> None:
        super().__init__(graph, plan, cores)
        self.profile_dir = profile_dir
        self.exportable = [all(exportable(graph, graph.node(v)) for v in step.nodes) for step in plan.steps]
        lanes = [lane for phase in plan.phases for lane in phase.lanes]
        # a plan that is one session lets its threads spin, as ORT's own sessions do
        self.spin = spin and len(lanes) == 1 and all(self.exportable[s] for s in lanes[0])
        # (a join waits for another lane, so a plan of one lane has none: it stays one session)
        self.joins = {s: join for s, step in enumerate(plan.steps) if (join := self._join(step)) is not None}
        self.part_of: dict[int, tuple[_Join, int, int]] = {}  # a part's slot -> its join and samples
        for join in self.joins.values():
            for slot, a, b in join.parts:
                self.part_of.setdefault(slot, (join, a, b))
        self.lock = threading.Lock()
        self.io: list[tuple[Any, list[str], tuple[int, ...], list[str], tuple[int, ...]]] = []  # per segment

    def build(self) -> Program:
        program = super().build()
        return dataclasses.replace(program, direct=self._direct(program))

    def _direct(self, program: Program) -> Callable[[Sequence[torch.Tensor]], list[torch.Tensor]] | None:
        """A plan that is one session reading the graph's inputs and making its outputs, as one
        call: the feeds keyed by name, the outputs wrapped, none of the slots (microseconds a
        call, which on a model of 0.1 ms is a tenth of its time)."""
        if program.n_items != 1 or len(self.io) != 1 or self.joins:
            return None
        session, in_names, ins, out_names, outs = self.io[0]
        if not set(ins) <= set(program.input_slots) or not set(program.output_slots) <= set(outs):
            return None
        feeds = [(name, program.input_slots.index(slot)) for name, slot in zip(in_names, ins)]
        picks = [outs.index(slot) for slot in program.output_slots]
        item = next(it for phase in program.phases for lane in phase for it in lane)

        def direct(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            try:
                made = session.run(out_names, {name: np.asarray(_to_numpy(inputs[k]), order="C") for name, k in feeds})
            except Exception as e:
                raise ExecutionError(f"node {item.label!r} ({item.op}) failed: {type(e).__name__}: {e}") from e
            return [torch.from_numpy(made[j]) for j in picks]
        return direct

    def _join(self, step: Step) -> _Join | None:
        """``step`` as a join made in place: a concat along the batch that waits for another lane
        (so its parts end segments anyway; a join whose parts all came before it on its own lane
        stays in its session, where ORT concatenates in its blocked layout without converting)."""
        node = self.graph.node(step.nodes[0])
        if step.merged or node.op != "concat" or node.attr("axis", 1) != 0 or not step.waits \
                or len(set(step.inputs)) < len(step.inputs):
            return None
        parts, at = [], 0
        for slot in step.inputs:
            n = self.graph.types[self.plan.slot_names[slot]].shape[0]
            parts.append((slot, at, at + n))
            at += n
        return _Join(step.outputs[0], node.out.shape, np.dtype(node.out.dtype), tuple(parts))

    def fits(self, s: int) -> bool:
        return self.exportable[s] and s not in self.joins

    def _target(self, slots: list[Any], slot: int) -> np.ndarray | None:
        """Where a session writes ``slot``: its samples of the join it is part of, or ``None``."""
        if slot not in self.part_of:
            return None
        join, a, b = self.part_of[slot]
        with self.lock:  # lanes may make parts of one join at once: one allocates
            whole: np.ndarray = slots[join.slot]
            if whole is None:
                whole = slots[join.slot] = np.empty(join.shape, join.dtype)
        return whole[a:b]

    def step_item(self, s: int) -> Item:
        if s in self.joins:
            return self._join_item(s)
        step = self.plan.steps[s]
        kernel, ins, outs, frees = step_kernel(self.graph, step), step.inputs, step.outputs, step.frees

        def run(slots: list[Any]) -> None:
            result = kernel(*[_to_torch(slots[i]) for i in ins])
            values = (result,) if len(outs) == 1 else result
            for slot, value in zip(outs, values):
                slots[slot] = _to_numpy(value)
            for f in frees:
                slots[f] = None
        return Item(len(self.items), step.label, step.op, run, (), step_category(step))

    def segment_item(self, segment: Segment, threads: int) -> tuple[Item, Any]:
        steps, names = self.plan.steps, self.plan.slot_names
        ins, outs, frees = segment.inputs, segment.outputs, segment.frees
        model = export_segment(self.graph, [steps[s].nodes for s in segment.steps], [names[i] for i in ins],
                               [names[o] for o in outs])
        prefix = None if self.profile_dir is None else os.path.join(self.profile_dir, f"segment{len(self.items)}")
        session = _session(model.SerializeToString(), threads, prefix, self.spin)
        in_names, out_names = [names[i] for i in ins], [names[o] for o in outs]

        def run(slots: list[Any]) -> None:
            feeds = {n: np.asarray(slots[i], order="C") for n, i in zip(in_names, ins)}
            for slot, value in zip(outs, session.run(out_names, feeds)):
                slots[slot] = value
            for f in frees:
                slots[f] = None

        def run_into_joins(slots: list[Any]) -> None:
            binding = session.io_binding()
            for n, i in zip(in_names, ins):
                binding.bind_cpu_input(n, np.asarray(slots[i], order="C"))
            targets = [self._target(slots, o) for o in outs]
            for n, target in zip(out_names, targets):
                if target is None:
                    binding.bind_output(n, "cpu")
                else:
                    binding.bind_output(n, "cpu", 0, target.dtype, target.shape, target.ctypes.data)
            session.run_with_iobinding(binding)
            made = binding.get_outputs()
            for slot, target, value in zip(outs, targets, made):
                slots[slot] = value.numpy() if target is None else target
            for f in frees:
                slots[f] = None
        if any(o in self.part_of for o in outs):
            run = run_into_joins
        self.io.append((session, in_names, ins, out_names, outs))
        return (Item(len(self.items), segment.label, f"onnxruntime[{len(segment.steps)} steps]", run, (), "segment"),
                session)


    def _join_item(self, s: int) -> Item:
        step, join = self.plan.steps[s], self.joins[s]
        frees = step.frees

        def run(slots: list[Any]) -> None:
            whole: np.ndarray = slots[join.slot]
            if whole is None:  # no session made a part of it
                whole = slots[join.slot] = np.empty(join.shape, join.dtype)
            for slot, a, b in join.parts:
                part, place = slots[slot], whole[a:b]
                if not (isinstance(part, np.ndarray) and part.base is whole and part.ctypes.data == place.ctypes.data):
                    place[...] = part  # made elsewhere (a torch step, another join's part, an input)
            for f in frees:
                slots[f] = None
        return Item(len(self.items), step.label, JOIN_IN_PLACE, run, (), "data")


def ort_program(graph: Graph, plan: Plan, cores: int, profile_dir: str | None = None, spin: bool = False) -> Program:
    """Segments of ``plan`` as ORT sessions; with ``profile_dir``, sessions that profile
    themselves there (read them from ``Program.sessions`` with
    :func:`~opsched.backends.ort_profile.kernel_times`).

    With ``spin``, a plan that is one ORT session (one lane, every step exportable) lets that
    session's idle intra-op threads spin between kernels, ONNX Runtime's default, instead of
    sleeping and being woken for every kernel: on two cores its sequential plans of the zoo ran
    1.05x (Inception V3) to 1.7x (RandWire-small) faster, timed in blocks. After a run the
    spinning threads keep a core busy for tens of milliseconds, so plans of several sessions or
    lanes never spin (they would take the cores their other sessions need); nor do stages being
    measured."""
    return _OrtSegments(graph, plan, cores, profile_dir, spin).build()


class OrtExecutor(LaneExecutor):
    """A plan on ONNX Runtime sessions (see the module docstring)."""

    def __init__(self, graph: Graph, plan: Plan, cores: int | None = None, profile_dir: str | None = None,
                 spin: bool = False) -> None:
        cores = cores or torch.get_num_threads()
        super().__init__(ort_program(graph, plan, cores, profile_dir, spin), cores, "onnxruntime")
        self.graph, self.plan = graph, plan

    def describe(self) -> str:
        prog = self.program
        sessions = self.sessions
        on_torch = [f"{it.label} ({it.op})" for phase in prog.phases for lane in phase for it, s in
                    ((it, prog.sessions[it.id]) for it in lane) if s is None and it.op != JOIN_IN_PLACE]
        text = (f"onnxruntime: {count(sessions, 'session')} in {count(len(prog.phases), 'phase')} "
                f"on {count(self.cores, 'core')}")
        if on_torch:
            text += f"; {count(len(on_torch), 'step')} run with torch between them: {', '.join(on_torch[:5])}"
        return text

    def trace(self, inputs: Sequence[torch.Tensor]) -> list[TraceEvent]:
        """One event per kernel, on its lane, at its time within its segment's call, named and
        typed after the step it computes (by ORT's own profiler, after a warm-up run); steps run
        with torch keep their own events."""
        plan = self.plan
        labels = {st.label: st.op for st in plan.steps}
        categories = {st.label: step_category(st) for st in plan.steps}
        with tempfile.TemporaryDirectory(prefix="opsched-ort-profile-") as profile_dir:
            profiling = OrtExecutor(self.graph, plan, self.cores, profile_dir=profile_dir)
            try:
                profiling(inputs)
                items: list[TraceEvent] = []
                profiling.run(inputs, items)
            finally:
                profiling.close()
            program = profiling.program
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
                step = owner(ke.name, labels)
                category = ort_category(ke.op)
                if category != "layout" and step is not None:
                    op, category = labels[step], categories[step]
                else:
                    op = "layout" if category == "layout" else f"onnxruntime:{ke.op}"
                start = e.start_ms + ke.start_ms
                out.append(TraceEvent(e.phase, e.lane, step or ke.name, op, start, start + ke.dur_ms, category))
        return out


class OrtBackend(CpuBackend):
    """ONNX Runtime sessions per lane segment; the fast CPU kernels. Ops without an ONNX export
    run with torch between sessions (:attr:`opsched.ir.ops.OpDef.no_onnx` says why)."""

    name = "ort"

    def unavailable(self) -> str | None:
        return None if ort_available() else "onnxruntime is not installed (pip install onnxruntime)"

    def cannot_hold(self, dtypes: Collection[str]) -> str | None:
        if "bfloat16" in dtypes:
            return "it passes values between its sessions and torch as NumPy arrays, and NumPy has no bfloat16"
        return None

    def supports(self, op: str) -> bool:
        return op_def(op).onnx is not None

    def opt_out(self, op: str) -> str:
        return op_def(op).no_onnx

    def versions(self) -> str:
        import onnxruntime

        return f"torch={torch.__version__} onnxruntime={onnxruntime.__version__}"

    def prepare(self, graph: Graph, plan: Plan, run: RunOptions) -> Executor:
        return OrtExecutor(graph, plan, run.cores, spin=run.spin)

    # --- measuring ----------------------------------------------------------------------------
    def _profiled(self, graph: Graph, stages: Sequence[Stage], run: RunOptions, policy: TimingPolicy
                  ) -> list[tuple[list[float], list[KernelTimes] | None]]:
        """Per stage: its calls' wall times and, where every step ran in a session, ORT's kernel
        times per timed round (summed over its sessions)."""
        made: list[OrtExecutor] = []
        with tempfile.TemporaryDirectory(prefix="opsched-ort-profile-") as profile_dir:
            def prepare(sub: Graph, plan: Plan, k: int) -> Executor:
                os.makedirs(own := os.path.join(profile_dir, str(k)))
                made.append(OrtExecutor(sub, plan, run.cores, profile_dir=own))
                return made[-1]

            walls = self.interleaved_walls(graph, stages, run, policy, prepare)
            out: list[tuple[list[float], list[KernelTimes] | None]] = []
            for executor, wall in zip(made, walls):
                sessions = executor.program.sessions
                if not sessions or None in sessions:
                    out.append((wall, None))  # a step ran with torch: no kernel profile of it
                    continue
                per_session = [kernel_times(s)[policy.warmup:] for s in sessions]
                out.append((wall, [KernelTimes(*(sum(getattr(p[r], f.name) for p in per_session)
                                                 for f in dataclasses.fields(KernelTimes)))
                                   for r in range(policy.repeat)]))
        return out

    def time_stages(self, graph: Graph, stages: Sequence[Stage], run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> list[StageTiming]:
        """As a stretch of a segment, a stage costs its kernels (layout conversions at its
        session's edges excluded); a merged convolution also the conversions its split forces:
        out of the blocked layout (measured) and, by its readers, back in (taken to cost as much;
        measured in one session, nine merges of GoogLeNet saved 0.6 ms of convolution and cost
        2.3 ms of conversions and split)."""
        out = []
        for stage, (wall, kernels) in zip(stages, self._profiled(graph, stages, run, policy)):
            if kernels is None:
                call = self.call_overhead_ms(run, policy, calibrations)
                segment = [max(t - call, 0.01 * t) for t in wall]
            elif stage.strategy == "merge":
                segment = [k.compute_ms + 2 * k.layout_out_ms for k in kernels]
            else:
                segment = [k.compute_ms for k in kernels]
            out.append(StageTiming(tuple(wall), tuple(segment)))
        return out

    def segment_cut(self, graph: Graph, run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> SegmentCut | None:
        """Converting each 4-D float value that crosses a cut out of (where a segment ends) or into
        (where one begins) the blocked layout, and per stage of several groups the call of the
        segment that resumes plus, at each of its two cuts, what cutting this model's segments
        costs beyond calls and conversions (:meth:`cut_residual_ms`)."""
        leave, enter = self._conversions(graph, run, policy, calibrations)
        call = self.call_overhead_ms(run, policy, calibrations)
        return SegmentCut(call + 2 * self.cut_residual_ms(graph, run, policy, calibrations), leave, enter)

    def layout_ms_per_mib(self, run: RunOptions, policy: TimingPolicy,
                          calibrations: Calibrations) -> tuple[float, float]:
        """ORT's conversion of a float tensor into its blocked layout and out of it, per MiB, from
        a 1x1 convolution over 64x56x56 (one segment's threads: all cores)."""
        probed: list[list[KernelTimes]] = []  # one probe answers both directions
        mib = 64 * 56 * 56 * 4 / 2**20

        def rate(part: Callable[[KernelTimes], float]) -> Callable[[], float]:
            def measure() -> float:
                if not probed:
                    b = GraphBuilder("layout_probe")
                    x = b.input("x", (1, 64, 56, 56))
                    w = b.param("w", torch.zeros(64, 64, 1, 1))
                    g = b.build([b.add("conv2d", [x], name="probe", params=[w])])
                    ((_, kernels),) = self._profiled(g, [Stage((("probe",),))], run,
                                                     dataclasses.replace(policy, repeat=max(policy.repeat, 11)))
                    probed.append(kernels or [])
                return statistics.median([part(k) for k in probed[0]] or [0.0]) / mib
            return measure
        return (calibrations.remember("layout_in_ms_per_mib", rate(lambda k: k.layout_in_ms)),
                calibrations.remember("layout_out_ms_per_mib", rate(lambda k: k.layout_out_ms)))

    def _conversions(self, graph: Graph, run: RunOptions, policy: TimingPolicy,
                     calibrations: Calibrations) -> tuple[dict[str, float], dict[str, float]]:
        to_in, to_out = self.layout_ms_per_mib(run, policy, calibrations)
        values = {i.name: i.type for i in graph.inputs} | {n.name: n.out for n in graph.nodes}
        mib = {v: t.nbytes / 2**20 for v, t in values.items() if len(t.shape) == 4 and t.dtype.startswith("float")}
        return {v: m * to_out for v, m in mib.items()}, {v: m * to_in for v, m in mib.items()}

    def cut_residual_ms(self, graph: Graph, run: RunOptions, policy: TimingPolicy, calibrations: Calibrations,
                        cuts: int = 8) -> float:
        """What one cut of a segment of ``graph`` costs beyond a call and its conversions: fusions
        ONNX Runtime can no longer make across it, threads woken again. Measured on the model
        itself: its sequential plan raced against the same plan cut into ``cuts + 1`` segments
        (evenly), the difference per cut less the call and the conversions at those cuts.
        (NASNet-A mobile: plans whose concurrent phases were each priced below their serial
        twin ran 17-20% slower than sequential, and as fast once those phases were serialized.)"""
        def measure() -> float:
            sequential = Schedule.from_stages(graph.structural_hash(), sequential_stages(graph), graph_name=graph.name)
            plan = lower(graph, sequential)
            ((lane,),) = (phase.lanes for phase in plan.phases)
            k = max(1, min(cuts, len(lane) // 4))
            positions = [round(len(lane) * (j + 1) / (k + 1)) for j in range(k)]
            whole = OrtExecutor(graph, plan, run.cores)
            cut = OrtExecutor(graph, cut_segments(plan, positions), run.cores)
            inputs = random_inputs(graph)
            try:
                times = interleave({"whole": lambda: whole(inputs), "cut": lambda: cut(inputs)},
                                   max(policy.repeat, 15), policy.warmup)
            finally:
                whole.close()
                cut.close()
            diffs = [c - w for c, w in zip(times["cut"], times["whole"])]
            leave, enter = self._conversions(graph, run, policy, calibrations)
            done: set[str] = set()
            converted = 0.0
            for j, step in enumerate(lane):
                if j in positions:
                    converted += sum(leave.get(v, 0.0) + enter.get(v, 0.0) for v in live_values(graph, done))
                done.update(plan.steps[step].nodes)
            per_cut = statistics.median(diffs) / k
            return max(0.0, per_cut - self.call_overhead_ms(run, policy, calibrations) - converted / k)
        return calibrations.remember(f"cut_residual_ms/{graph.structural_hash()}", measure)


register_backend(OrtBackend())

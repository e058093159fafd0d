"""The ONNX Runtime backend: each lane segment of a plan runs as one ORT session.

On a CPU, ONNX Runtime's kernels are much faster than eager PyTorch's at batch 1 (ORT's own
sequential session ran the zoo 1.5-3.4x faster than eager in docs/results/cpu.md, on a 2-core
machine), so opsched runs its plans with them: every lane of every phase is cut into maximal
segments of exportable steps, each segment exported (:mod:`.ort_export`) and loaded as its own
session with its share of the cores as intra-op threads. ORT releases the GIL while it runs, so
the lanes of a phase truly run at once, and a long single-lane phase is simply ORT running a
big subgraph sequentially. Steps that cannot be exported (opaque calls) run with torch in
between; a step that another lane waits for ends its segment so its event can be set. How a
plan becomes those sessions is :mod:`.ort_program`; this module runs and profiles them, and
prices their cuts.

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
import time
from collections.abc import Callable, Collection, Sequence

import torch

from opsched._text import count
from opsched.backends.base import CpuBackend, Executor, register_backend
from opsched.backends.lanes import LaneExecutor, step_category
from opsched.backends.ort_export import refusal
from opsched.backends.ort_profile import KernelTimes, kernel_events, kernel_times, ort_category, owner
from opsched.backends.ort_program import JOIN_IN_PLACE, ort_program
from opsched.cost import SegmentCut, StageTiming, TimingPolicy
from opsched.cost.measured import Calibrations
from opsched.execution import RunOptions
from opsched.ir import Graph, GraphBuilder, random_inputs
from opsched.ir.analysis import live_values
from opsched.ir.ops import op_def
from opsched.runtime import Plan, lower
from opsched.runtime.plan import cut_segments
from opsched.schedule import Schedule, Stage
from opsched.schedulers.sequential import sequential_stages
from opsched.timeline import TraceEvent
from opsched.timing import interleave

__all__ = ["OrtBackend", "OrtExecutor", "ort_available"]

#: Probes of ORT's layout conversions, the least kept, and the time between them (see
#: :meth:`OrtBackend.layout_ms_per_mib`).
LAYOUT_PROBES = 5
PROBE_GAP_S = 0.05


def ort_available() -> bool:
    try:
        import onnxruntime  # noqa: F401
    except ImportError:
        return False
    return True


class OrtExecutor(LaneExecutor):
    """A plan on ONNX Runtime sessions (see the module docstring)."""

    def __init__(self, graph: Graph, plan: Plan, cores: int | None = None, profile_dir: str | None = None,
                 spin: bool = False) -> None:
        cores = cores or torch.get_num_threads()
        super().__init__(ort_program(graph, plan, cores, profile_dir, spin), cores, "onnxruntime")
        self.graph, self.plan = graph, plan

    @property
    def on_torch(self) -> list[tuple[str, str, str | None]]:
        """The steps run with torch between the sessions, in plan order: each one's label, op and
        why it is not in a session (:func:`~opsched.backends.ort_export.refusal`)."""
        prog = self.program
        steps = {step.label: step for step in self.plan.steps}
        found = []
        for it in (it for phase in prog.phases for lane in phase for it in lane):
            if prog.sessions[it.id] is None and it.op != JOIN_IN_PLACE:
                names = steps[it.label].nodes if it.label in steps else ()
                why = next((r for name in names if (r := refusal(self.graph, self.graph.node(name)))), None)
                found.append((it.label, it.op, why))
        return found

    def describe(self) -> str:
        """How many sessions, and the steps run with torch between them with why (the reasons of
        the first five, each once: the answer to "what cuts my sessions")."""
        text = (f"onnxruntime: {count(self.sessions, 'session')} in {count(len(self.program.phases), 'phase')} "
                f"on {count(self.cores, 'core')}")
        on_torch = self.on_torch
        if on_torch:
            text += (f"; {count(len(on_torch), 'step')} run with torch between them: "
                     f"{', '.join(f'{label} ({op})' for label, op, _ in on_torch[:5])}")
            why: dict[str, list[str]] = {}
            for label, _, reason in on_torch[:5]:
                if reason:
                    why.setdefault(reason, []).append(label)
            if why:
                text += " (" + "; ".join(f"{', '.join(labels)}: {reason}" for reason, labels in why.items()) + ")"
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
    threads_by_cores = True

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
        a 1x1 convolution over 64x56x56 (one segment's threads: all cores).

        The least of :data:`LAYOUT_PROBES` probes, :data:`PROBE_GAP_S` apart, each the median of
        its rounds. One probe lasts about 10 ms, so whatever slows it slows all of it: in 18
        probes alone the rates were 0.035-0.068 ms/MiB into the layout and 0.031-0.050 out of it,
        in four Inception V3 searches 0.051-0.065 and 0.035-0.044, and in a fifth 0.163 and
        0.069. The rates are what a cut is charged per MiB live across it, and what
        :meth:`cut_residual_ms` subtracts from what cuts cost the model: inflated, they left its
        residual at 0.02 ms (0.19-0.44 in the four others), and with cuts that cheap the DP's
        bound pruned less: that search priced 789 distinct stages in 42 s, the others 286-462
        in 8-21 s (a diagnostic run of the search on this repository's CPU, each with a fresh
        profile store)."""
        probes: list[list[KernelTimes]] = []  # each answers both directions
        mib = 64 * 56 * 56 * 4 / 2**20

        def rate(part: Callable[[KernelTimes], float]) -> Callable[[], float]:
            def measure() -> float:
                if not probes:
                    b = GraphBuilder("layout_probe")
                    x = b.input("x", (1, 64, 56, 56))
                    w = b.param("w", torch.zeros(64, 64, 1, 1))
                    g = b.build([b.add("conv2d", [x], name="probe", params=[w])])
                    for k in range(LAYOUT_PROBES):
                        if k:
                            time.sleep(PROBE_GAP_S)
                        ((_, kernels),) = self._profiled(g, [Stage((("probe",),))], run,
                                                         dataclasses.replace(policy, repeat=max(policy.repeat, 11)))
                        probes.append(kernels or [])
                return min(statistics.median([part(k) for k in probe] or [0.0]) for probe in probes) / mib
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
            if len(plan.steps) < 2:
                return 0.0  # nothing to cut: a model that computes nothing, or one step
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

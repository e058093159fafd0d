"""The measured cost model: stages timed on the real backend, priced as a plan runs them.

A stage is cut out of the graph (its external inputs become random tensors of the right
type), lowered to a plan and run by the same executor and backend the model will run on:
``warmup`` runs, then ``repeat`` timed runs, medians. Wrap the model in
:class:`opsched.cost.cached.StoredCostModel` so every figure lands in the profile store.

What a stage costs inside a plan is not what it costs alone. In a plan, consecutive stages of
one group run as one segment (:mod:`opsched.runtime.plan`): one backend call, and on ONNX
Runtime one session, whose tensors stay in ORT's blocked layout from kernel to kernel. Alone,
a stage also pays the call and, on ORT, the layout conversions at its session's edges: for an
Inception V3 average pool, 0.05 ms of kernel in 0.17 ms of call. And the figures drift: on a
shared 2-core machine one operator measured 0.07 ms, then 0.31 ms for seconds on end. A search
that compares prices taken at different moments then picks whatever was measured in a quiet
spell (a plan priced 68 ms against sequential's 83 ran within 1% of it). So prices are built
from per-node figures, and every choice between running nodes together or one after another
is timed as a pair, interleaved, so that drift moves both sides alike:

* a **node** costs its kernel time (on ORT, by ORT's own profiler, layout conversions and the
  call excluded; on torch, the call's time less an empty call's);
* a **stage of one group**, a stretch of a segment, costs the sum of its nodes;
* a **stage of several groups**, or a **merge**, is run interleaved with the same nodes run as
  one group, and costs the sum of its nodes times the ratio of the two, round by round, taken
  at the upper quartile (:data:`PAIR_QUANTILE`): it is priced below its serial twin only when
  it paid in most rounds. Run together, it is timed as a phase of its own: the call's wall
  time (lanes, threads, their sessions' layout conversions, the join). A merge is timed as
  the one step it is: its kernels and, on ORT, the conversions its split forces inside a
  segment (:meth:`MeasuredCostModel._merged_ms`; measured in one session, nine merges of
  GoogLeNet saved 0.6 ms of convolution and cost 2.3 ms of conversions and split). A stage of
  several groups never costs less than its dearest group (the model is monotone);
* what a stage of several groups costs the **segments around it** depends on what else is live
  there, so it is the search's to add (:meth:`MeasuredCostModel.segment_cut`): on ORT, the
  call of the segment that resumes, converting every value that crosses either cut out of the
  blocked layout and back, and per cut a residue measured on the model itself (fusions lost
  across the cut, threads woken again; :meth:`MeasuredCostModel.cut_residual_ms`).

Prices of parts and calibrations come through :meth:`MeasuredCostModel.use_store` (the profile
store), so a stage priced today agrees with the node prices the search already holds, and a
second search measures nothing.
"""

from __future__ import annotations

import os
import platform
import statistics
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from opsched.cost.base import SegmentCut
from opsched.cost.store import ProfileContext
from opsched.ir import Graph
from opsched.schedule.types import Schedule, Stage
from opsched.timing import interleave

if TYPE_CHECKING:
    from opsched.runtime.plan import Plan

__all__ = ["MeasuredCostModel", "StageTiming", "cpu_fingerprint", "cpu_model_name", "stage_plan", "random_inputs"]


def stage_plan(graph: Graph, stage: Stage) -> tuple[Graph, Plan]:
    """``stage`` cut out of ``graph`` as a graph of its own (its external inputs become graph
    inputs, its every node an output, so nothing is dead) and lowered to a plan."""
    from opsched.runtime.plan import lower

    sub = graph.subgraph(stage.nodes, name=f"{graph.name}.stage")
    sub = sub.replace(outputs=tuple(stage.nodes))
    return sub, lower(sub, Schedule(sub.structural_hash(), (stage,), graph_name=sub.name))


def random_inputs(graph: Graph, device: str | torch.device = "cpu", seed: int = 0) -> list[torch.Tensor]:
    """Reproducible random inputs of ``graph``'s input types on ``device``."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(i.type.shape, generator=gen).to(device, getattr(torch, i.type.dtype)) for i in graph.inputs]


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def cpu_fingerprint() -> str:
    return f"{cpu_model_name()} x{os.cpu_count()} threads={torch.get_num_threads()}"


#: Where among a pair's per-round ratios its price is taken: the upper quartile, so that running
#: nodes together (or merged) is priced below running them one after another only when it
#: paid in most rounds, not in a lucky one (see the module docstring).
PAIR_QUANTILE = 0.75


@dataclass(frozen=True, slots=True)
class StageTiming:
    """One stage's timed rounds, in ms; entry r of each is the r-th timed run."""

    wall_ms: tuple[float, ...]
    kernel_ms: tuple[float, ...] | None = None      # inside the kernels, layout conversions excluded (ORT)
    layout_in_ms: tuple[float, ...] | None = None   # converting into ORT's blocked layout (ORT)
    layout_out_ms: tuple[float, ...] | None = None  # converting out of it (ORT)


class MeasuredCostModel:
    """CPU stage latencies by measurement, priced as a plan runs the stage (module docstring)."""

    monotone = True  # physically: a stage with more work does not run faster (up to noise)

    def __init__(self, warmup: int = 2, repeat: int = 7, backend: str = "auto", cores: int | None = None) -> None:
        from opsched.runtime.module import resolve_backend

        self.warmup, self.repeat, self.cores = warmup, repeat, cores
        self.backend = resolve_backend(backend)
        self._device = cpu_fingerprint()
        self._parts: Callable[[Graph, Stage], float] = self.stage_latency
        self._known: dict[str, float] = {}
        self._remember: Callable[[str, Callable[[], float]], float] = self._remember_here
        self.measurements = 0  # stages (or pairs of stages) run and timed

    @property
    def device(self) -> str:
        return self._device

    @property
    def key(self) -> str:
        return (f"measured/v4/cpu-{self.backend}/{self._device}/{self.versions}/{self.warmup}x{self.repeat}"
                f"/cores={self.cores or 'all'}")

    @property
    def versions(self) -> str:
        if self.backend == "ort":
            import onnxruntime

            return f"torch={torch.__version__} onnxruntime={onnxruntime.__version__}"
        return f"torch={torch.__version__}"

    def context(self, batch: int) -> ProfileContext:
        # v4: sums exported as chains of Adds (v3: as Sum); v3: priced as the plan runs the
        # stage, relative to node prices (v2: each stage alone)
        backend = f"cpu-{self.backend}-v4" + (f"-{self.cores}core" if self.cores else "")
        return ProfileContext(self._device, backend, self.versions, batch)

    def use_store(self, price: Callable[[Graph, Stage], float],
                  remember: Callable[[str, Callable[[], float]], float]) -> None:
        """Take the prices of the nodes a stage's price is built from from ``price``, and keep
        calibrations with ``remember(name, measure)``: the profile store does this, so that those
        figures come from it and go to it."""
        self._parts, self._remember = price, remember

    def _remember_here(self, name: str, measure: Callable[[], float]) -> float:
        if name not in self._known:
            self._known[name] = measure()
        return self._known[name]

    def call_overhead_ms(self) -> float:
        """The cost of one backend call that computes (almost) nothing."""
        def measure() -> float:
            from opsched.ir import GraphBuilder

            b = GraphBuilder("empty_call")
            x = b.input("x", (1, 1))
            g = b.build([b.add("relu", [x], name="noop")])
            (timing,) = self.time_stages(g, [Stage((("noop",),))], repeat=max(self.repeat, 21))
            return statistics.median(timing.wall_ms)
        return self._remember("call_ms", measure)

    def layout_ms_per_mib(self) -> tuple[float, float]:
        """ONNX Runtime's conversion of a float tensor into its blocked layout and out of it, per
        MiB, from a 1x1 convolution over 64x56x56 (one segment's threads: all cores)."""
        probed: list[StageTiming] = []  # one probe answers both directions

        def rate(rounds_of: Callable[[StageTiming], tuple[float, ...] | None]) -> Callable[[], float]:
            def measure() -> float:
                if not probed:
                    from opsched.ir import GraphBuilder

                    b = GraphBuilder("layout_probe")
                    x = b.input("x", (1, 64, 56, 56))
                    w = b.param("w", torch.zeros(64, 64, 1, 1))
                    g = b.build([b.add("conv2d", [x], name="probe", params=[w])])
                    probed.extend(self.time_stages(g, [Stage((("probe",),))], repeat=max(self.repeat, 11)))
                return statistics.median(rounds_of(probed[0]) or (0.0,)) / (64 * 56 * 56 * 4 / 2**20)
            return measure
        return (self._remember("layout_in_ms_per_mib", rate(lambda t: t.layout_in_ms)),
                self._remember("layout_out_ms_per_mib", rate(lambda t: t.layout_out_ms)))

    def segment_cut(self, graph: Graph) -> SegmentCut | None:
        """On ONNX Runtime: converting each 4-D float value that crosses a cut out of (where a
        segment ends) or into (where one begins) the blocked layout, and per stage of several
        groups the call of the segment that resumes plus, at each of its two cuts, what cutting
        this model's segments costs beyond calls and conversions (:meth:`cut_residual_ms`).
        On torch kernels, segments cost nothing to cut."""
        if self.backend != "ort":
            return None
        leave, enter = self._conversions(graph)
        return SegmentCut(self.call_overhead_ms() + 2 * self.cut_residual_ms(graph), leave, enter)

    def _conversions(self, graph: Graph) -> tuple[dict[str, float], dict[str, float]]:
        to_in, to_out = self.layout_ms_per_mib()
        values = {i.name: i.type for i in graph.inputs} | {n.name: n.out for n in graph.nodes}
        mib = {v: t.nbytes / 2**20 for v, t in values.items() if len(t.shape) == 4 and t.dtype.startswith("float")}
        return {v: m * to_out for v, m in mib.items()}, {v: m * to_in for v, m in mib.items()}

    def cut_residual_ms(self, graph: Graph, cuts: int = 8) -> float:
        """What one cut of a segment of ``graph`` costs beyond a call and its conversions: fusions
        ONNX Runtime can no longer make across it, threads woken again. Measured on the model
        itself: its sequential plan raced against the same plan cut into ``cuts + 1`` segments
        (evenly), the difference per cut less the call and the conversions at those cuts.
        (NASNet-A mobile: plans whose concurrent phases were each priced below their serial
        twin ran 17-20% slower than sequential, and as fast once those phases were serialized.)"""
        def measure() -> float:
            from opsched.runtime.ort import OrtExecutor
            from opsched.runtime.plan import cut_segments, lower
            from opsched.schedule.cuts import live_values
            from opsched.schedule.sequential import sequential_stages

            sequential = Schedule(graph.structural_hash(), tuple(sequential_stages(graph)), graph_name=graph.name)
            plan = lower(graph, sequential)
            (lane,) = plan.phases[0].lanes
            k = max(1, min(cuts, len(lane) // 4))
            positions = [round(len(lane) * (j + 1) / (k + 1)) for j in range(k)]
            whole = OrtExecutor(graph, plan, self.cores)
            cut = OrtExecutor(graph, cut_segments(plan, positions), self.cores)
            inputs = random_inputs(graph)
            try:
                times = interleave({"whole": lambda: whole(inputs), "cut": lambda: cut(inputs)},
                                   max(self.repeat, 15), self.warmup)
            finally:
                whole.close()
                cut.close()
            diffs = [c - w for c, w in zip(times["cut"], times["whole"])]
            self.measurements += 1
            leave, enter = self._conversions(graph)
            done: set[str] = set()
            converted = 0.0
            for j, step in enumerate(lane):
                if j in positions:
                    converted += sum(leave.get(v, 0.0) + enter.get(v, 0.0) for v in live_values(graph, done))
                done.update(plan.steps[step].nodes)
            per_cut = statistics.median(diffs) / k
            return max(0.0, per_cut - self.call_overhead_ms() - converted / k)
        return self._remember(f"cut_residual_ms/{graph.structural_hash()}", measure)

    def stage_latency(self, graph: Graph, stage: Stage) -> float:
        nodes = stage.nodes
        if len(stage.groups) == 1 and stage.strategy == "parallel":
            if len(nodes) == 1:
                (alone,) = self.time_stages(graph, [stage])
                return statistics.median(self._serial_ms(alone))
            return self._sum(graph, nodes)
        serial = Stage((nodes,))  # the same nodes as one group: each group's chain, one after another
        together, apart = self.time_stages(graph, [stage, serial])
        ran = self._merged_ms(together) if stage.strategy == "merge" else self._together_ms(together)
        ratios = [a / max(b, 1e-6) for a, b in zip(ran, self._serial_ms(apart))]
        price = self._sum(graph, nodes) * float(np.quantile(ratios, PAIR_QUANTILE))
        if stage.strategy == "parallel":
            price = max(price, *(self._sum(graph, g) for g in stage.groups))
        return price

    def _sum(self, graph: Graph, nodes: tuple[str, ...]) -> float:
        return sum(self._parts(graph, Stage(((v,),))) for v in nodes)

    def _serial_ms(self, t: StageTiming) -> list[float]:
        """Per round, as a stretch of a segment: its kernels (ORT), or the call less an empty one (torch)."""
        if t.kernel_ms is not None:
            return list(t.kernel_ms)
        call = self.call_overhead_ms()
        return [max(w - call, 0.01 * w) for w in t.wall_ms]

    @staticmethod
    def _together_ms(t: StageTiming) -> list[float]:
        """Per round, as a phase of its own: the call's wall time (its lanes' sessions, their layout
        conversions, the join). What it costs the segments around it is :meth:`segment_cut`'s."""
        return list(t.wall_ms)

    def _merged_ms(self, t: StageTiming) -> list[float]:
        """Per round, a merged convolution in a segment. On ORT its output is split by an operator
        that has no blocked kernel: converted out (``layout_out_ms``, alone the merge's only
        conversion out) and, by its readers, back in (taken to cost as much)."""
        if t.layout_out_ms is None:
            return self._serial_ms(t)
        return [k + 2 * o for k, o in zip(self._serial_ms(t), t.layout_out_ms)]

    def time_stages(self, graph: Graph, stages: list[Stage], repeat: int | None = None) -> list[StageTiming]:
        """Run each of ``stages`` alone, interleaved (:func:`opsched.timing.interleave`), ``warmup +
        repeat`` times; on ORT with every step in a session, the sessions profile themselves and
        the kernel figures are ORT's. Entry r of every timing comes from round r."""
        from opsched.runtime.cpu import CpuExecutor
        from opsched.runtime.ort import OrtExecutor, kernel_times

        repeat = repeat or self.repeat
        self.measurements += 1
        with tempfile.TemporaryDirectory(prefix="opsched-ort-profile-") as profile_dir:
            runs = []
            for k, stage in enumerate(stages):
                sub, plan = stage_plan(graph, stage)
                if self.backend == "ort":
                    os.makedirs(own := os.path.join(profile_dir, str(k)))
                    executor = OrtExecutor(sub, plan, self.cores, profile_dir=own)
                else:
                    executor = CpuExecutor(plan, self.cores)
                runs.append((executor, random_inputs(sub)))
            threads = torch.get_num_threads()
            if self.cores:
                torch.set_num_threads(self.cores)
            try:
                walls = interleave({k: (lambda ex=ex, x=x: ex(x)) for k, (ex, x) in enumerate(runs)}, repeat,
                                   self.warmup)
            finally:
                for executor, _ in runs:
                    executor.close()
                torch.set_num_threads(threads)
            timings = []
            for k, (executor, _) in enumerate(runs):
                times = walls[k]
                program = executor.program
                if not program.sessions or None in program.sessions:
                    timings.append(StageTiming(tuple(times)))  # torch kernels (all or some): no kernel profile
                    continue
                per_session = [kernel_times(s)[self.warmup:] for s in program.sessions]

                def rounds(part: str) -> tuple[float, ...]:
                    return tuple(sum(getattr(p[r], part) for p in per_session) for r in range(repeat))
                timings.append(StageTiming(tuple(times), rounds("compute_ms"), rounds("layout_in_ms"),
                                           rounds("layout_out_ms")))
        return timings

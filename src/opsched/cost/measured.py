"""The measured cost model: a stage is run in isolation on the real backend and timed.

The stage is cut out of the graph (its external inputs become random tensors of the right
type), lowered to a plan and run by the same executor and backend the model will run on: ``warmup``
runs, then ``repeat`` timed runs; the answer is the median. Wrap it in
:class:`opsched.cost.cached.StoredCostModel` so every figure lands in the profile store.
"""

from __future__ import annotations

import os
import platform
import statistics
import time
from typing import TYPE_CHECKING

import torch

from opsched.cost.store import ProfileContext
from opsched.ir import Graph
from opsched.schedule.types import Schedule, Stage

if TYPE_CHECKING:
    from opsched.runtime.plan import Plan

__all__ = ["MeasuredCostModel", "cpu_fingerprint", "cpu_model_name", "stage_plan", "random_inputs"]


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


class MeasuredCostModel:
    """CPU stage latencies by measurement (median of ``repeat`` runs after ``warmup``)."""

    monotone = True  # physically: a stage with more work does not run faster (up to noise)

    def __init__(self, warmup: int = 2, repeat: int = 7, backend: str = "auto", cores: int | None = None) -> None:
        from opsched.runtime.module import resolve_backend

        self.warmup, self.repeat, self.cores = warmup, repeat, cores
        self.backend = resolve_backend(backend)
        self._device = cpu_fingerprint()
        self._call_ms: float | None = None

    @property
    def device(self) -> str:
        return self._device

    @property
    def key(self) -> str:
        return (f"measured/v2/cpu-{self.backend}/{self._device}/{self.versions}/{self.warmup}x{self.repeat}"
                f"/cores={self.cores or 'all'}")

    @property
    def versions(self) -> str:
        if self.backend == "ort":
            import onnxruntime

            return f"torch={torch.__version__} onnxruntime={onnxruntime.__version__}"
        return f"torch={torch.__version__}"

    def context(self, batch: int) -> ProfileContext:
        # v2: single-lane stages net of the call overhead (older entries were gross)
        backend = f"cpu-{self.backend}-v2" + (f"-{self.cores}core" if self.cores else "")
        return ProfileContext(self._device, backend, self.versions, batch)

    def call_overhead_ms(self) -> float:
        """The cost of one backend call that computes (almost) nothing."""
        if self._call_ms is None:
            from opsched.ir import GraphBuilder

            b = GraphBuilder("empty_call")
            x = b.input("x", (1, 1))
            g = b.build([b.add("relu", [x], name="noop")])
            self._call_ms = self._measure(g, Stage((("noop",),)), repeat=max(self.repeat, 21))
        return self._call_ms

    def stage_latency(self, graph: Graph, stage: Stage) -> float:
        measured = self._measure(graph, stage, self.repeat)
        if len(stage.groups) == 1 or stage.strategy == "merge":  # joins its neighbours' segment at run time
            return max(measured - self.call_overhead_ms(), 0.01 * measured)
        return measured

    def _measure(self, graph: Graph, stage: Stage, repeat: int) -> float:
        from opsched.runtime.module import make_executor

        sub, plan = stage_plan(graph, stage)
        executor = make_executor(sub, plan, self.backend, self.cores)
        inputs = random_inputs(sub)
        threads = torch.get_num_threads()
        if self.cores:
            torch.set_num_threads(self.cores)
        try:
            for _ in range(self.warmup):
                executor(inputs)
            times = []
            for _ in range(repeat):
                start = time.perf_counter()
                executor(inputs)
                times.append((time.perf_counter() - start) * 1e3)
        finally:
            executor.close()
            torch.set_num_threads(threads)
        return statistics.median(times)

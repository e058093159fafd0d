"""ScheduledModule: a drop-in ``nn.Module`` that runs a graph by its schedule."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from opsched.ir import Graph
from opsched.errors import OpschedError
from opsched.runtime.cpu import CpuExecutor, LaneExecutor, TraceEvent
from opsched.runtime.plan import Plan, lower
from opsched.runtime.reference import check_inputs
from opsched.schedule.types import Schedule

if TYPE_CHECKING:
    from opsched.runtime.cuda import CudaExecutor

__all__ = ["ScheduledModule", "BACKENDS", "make_executor", "resolve_backend"]

BACKENDS = ("auto", "ort", "torch")


def resolve_backend(backend: str) -> str:
    """``auto``: ONNX Runtime when it is installed (faster CPU kernels), else torch."""
    from opsched.runtime.ort import ort_available

    if backend not in BACKENDS:
        raise OpschedError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        return "ort" if ort_available() else "torch"
    if backend == "ort" and not ort_available():
        raise OpschedError("backend 'ort' needs onnxruntime: pip install onnxruntime")
    return backend


def make_executor(graph: Graph, plan: Plan, backend: str, cores: int | None = None, *,
                  device: str | torch.device = "cpu", graphs: bool = True,
                  channels_last: bool = False) -> LaneExecutor | CudaExecutor:
    """The executor of ``plan``: on a CUDA device the stream executor (captured into a CUDA graph
    unless ``graphs`` is false), on the CPU lanes on threads with ``backend``'s kernels."""
    if torch.device(device).type == "cuda":
        if backend not in ("auto", "torch"):
            raise OpschedError(f"backend {backend!r} runs on the CPU; on {device} the kernels are torch's (CUDA)")
        from opsched.runtime.cuda import CudaExecutor

        return CudaExecutor(graph, plan, device=device, graphs=graphs, channels_last=channels_last)
    if resolve_backend(backend) == "ort":
        from opsched.runtime.ort import OrtExecutor

        return OrtExecutor(graph, plan, cores, spin=True)  # a module that is one session spins, as ORT's own
    return CpuExecutor(plan, cores)


class ScheduledModule(nn.Module):
    """Returns exactly what the original model returns, computed by the schedule's plan.

    ``schedule`` is the schedule it runs; ``report()`` summarises it; ``save(path)`` writes it
    as JSON, to be reapplied with :func:`opsched.load`. Inputs must match the example inputs'
    shapes and dtypes (the schedule is specialised to them).
    """

    def __init__(self, graph: Graph, schedule: Schedule, *, backend: str = "auto", device: str | torch.device = "cpu",
                 graphs: bool = True, channels_last: bool = False, single_output: bool = True,
                 info: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.graph = graph
        self.schedule = schedule
        self.device = torch.device(device)
        self.backend = "cuda" if self.device.type == "cuda" else resolve_backend(backend)
        self.plan = lower(graph, schedule)
        self._executor = make_executor(graph, self.plan, backend, device=self.device, graphs=graphs,
                                       channels_last=channels_last)
        self._single = single_output and len(graph.outputs) == 1
        self.info: dict[str, Any] = dict(info or {})

    def forward(self, *inputs: torch.Tensor) -> Any:
        check_inputs(self.graph, inputs)
        outputs = self._executor(inputs)
        return outputs[0] if self._single else tuple(outputs)

    def profile(self, *inputs: torch.Tensor) -> list[TraceEvent]:
        """Run once, recording when each step ran on which lane (on ONNX Runtime, each kernel of
        each segment, by ORT's own profiler)."""
        check_inputs(self.graph, inputs)
        if self.backend == "ort":
            from opsched.runtime.ort import profiled_trace

            return profiled_trace(self.graph, self.plan, inputs)
        events: list[TraceEvent] = []
        self._executor(inputs, trace=events)
        return events

    def save(self, path: str | os.PathLike[str]) -> None:
        self.schedule.save(path)

    def report(self) -> str:
        s = self.schedule
        lanes = max(len(st.groups) for st in s.stages) if s.stages else len(s.lanes or ())
        lines = [f"{self.graph.name}: {len(self.graph.nodes)} operators, scheduled by {s.scheduler} "
                 f"for batch {s.batch} on {s.device}, running on the {self.backend} backend",
                 f"  {len(s.stages)} stages, {len(self.plan.phases)} phases, up to {lanes} concurrent groups, "
                 f"{sum(st.strategy == 'merge' for st in s.stages)} merged convolutions"]
        if s.estimated_ms is not None:
            lines.append(f"  cost model estimate: {s.estimated_ms:.3f} ms")
        capture_error = getattr(self._executor, "capture_error", None)
        if self.device.type == "cuda":
            captured = (f"not captured into a CUDA graph: {capture_error}" if capture_error
                        else "captured into one CUDA graph")
            lines.append(f"  {self._executor.program.n_streams} CUDA streams; {captured}")
        for key, value in self.info.items():
            lines.append(f"  {key}: {value}")
        if s.stats:
            st = s.stats
            lines.append(f"  search: {st.get('states')} states, {st.get('distinct_stages')} distinct stages priced, "
                         f"{st.get('seconds', 0.0):.2f} s")
        return "\n".join(lines)

    def __del__(self) -> None:
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.close()

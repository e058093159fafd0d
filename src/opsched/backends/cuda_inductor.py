"""The CUDA Inductor backend: Inductor-compiled segments on CUDA streams, the whole plan captured
into one CUDA graph.

Inductor fuses pointwise work into its neighbours but runs one stream; the ``cuda`` backend runs
a plan's lanes on streams but launches one torch kernel per step. This backend does both. Each
lane of each phase is cut into segments by the cut every compiling backend shares
(:mod:`.segments`: a step that waits on another lane starts a segment, a step another lane
waits for ends one), each segment is compiled by Inductor for the GPU (Triton kernels; its own
CUDA graphs off, since the executor captures the whole plan), and the CUDA executor launches
each segment at its first step on that step's stream, events and all, capturing the whole plan
into one CUDA graph (:class:`~.cuda_executor.CudaExecutor` with :class:`~.cuda_executor.FusedSegment` s).
Inductor's kernels launch on the current stream, which the executor sets per launch.

Compiling takes seconds per segment, so segments are compiled when the executor is prepared
(the time is in ``describe()``); Inductor's on-disk caches make the next process's compile of the
same segments fast. Stage timings compile each stage's segments the same way and time its
captured replays, like the ``cuda`` backend's, so the profile store keeps them under a tag of
their own.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import torch

from opsched.backends.base import register_backend
from opsched.backends.cuda import CudaBackend, gpu_versions
from opsched.backends.cuda_executor import CudaExecutor, FusedSegment
from opsched.backends.inductor import InductorSegments
from opsched.execution import RunOptions
from opsched.ir import Graph
from opsched.runtime import Plan

__all__ = ["CudaInductorBackend", "inductor_segments"]

#: Inductor's options for a segment on a GPU: no CUDA graphs of its own (the plan is one).
CUDA_OPTIONS: dict[str, Any] = {"triton.cudagraphs": False}


def inductor_segments(graph: Graph, plan: Plan, device: torch.device) -> tuple[list[FusedSegment], float]:
    """Every lane segment of ``plan`` compiled by Inductor for ``device``, and the seconds that took."""
    options = CUDA_OPTIONS if device.type == "cuda" else {}
    builder = InductorSegments(graph, plan, 1, device, options, frees=False)
    program = builder.build()
    segments = [FusedSegment(tuple(builder.members[item.id]), item.run, item.label, item.op)
                for phase in program.phases for lane in phase for item in lane]
    return segments, builder.compile_seconds


class CudaInductorExecutor(CudaExecutor):
    """A :class:`CudaExecutor` of Inductor-compiled segments (module docstring)."""

    def __init__(self, graph: Graph, plan: Plan, *, device: str | torch.device = "cuda", **options: Any) -> None:
        segments, self.compile_seconds = inductor_segments(graph, plan, torch.device(device))
        super().__init__(graph, plan, device=device, segments=segments, **options)

    def describe(self) -> str:
        return f"{super().describe()} (compiled in {self.compile_seconds:.1f} s)"


class CudaInductorBackend(CudaBackend):
    """Inductor-compiled lane segments on CUDA streams, captured into one CUDA graph."""

    name = "cuda-inductor"

    def unavailable(self) -> str | None:
        why = super().unavailable()
        if why is None and importlib.util.find_spec("triton") is None:
            why = "Inductor's GPU code generation needs Triton, which this torch installation lacks"
        return why

    def profile_tag(self, run: RunOptions) -> str:
        return "cuda-inductor-graph-v1" + ("-channels_last" if run.channels_last else "")

    def versions(self) -> str:
        return f"{gpu_versions()} inductor"

    def executor(self, graph: Graph, plan: Plan, device: torch.device, **options: Any) -> CudaExecutor:
        return CudaInductorExecutor(graph, plan, device=device, **options)


register_backend(CudaInductorBackend())

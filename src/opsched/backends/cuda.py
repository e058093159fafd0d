"""The CUDA backend: a plan's lanes on CUDA streams, the whole plan captured into one CUDA graph
by the executor of :mod:`.cuda_executor`.

Measuring (:class:`CudaBackend`): Python launch time is what a captured plan no longer pays, so
it must not be what a stage is priced by. A stage (cut out of the placed graph, lowered and run
by the same executor, streams, events and all) is captured once after a warm-up (cuDNN
autotuning is on), then each of ``repeat`` samples times ``inner`` back-to-back replays between
two CUDA events. Its price is the median sample less the cost of replaying a graph of one
trivial kernel timed the same way: inside the whole model's graph a stage pays no replay of its
own. Replays do not drift as CPU calls do, so stages are priced directly, not relative to a
serial twin.
"""

from __future__ import annotations

import functools
import statistics
import subprocess
from collections.abc import Sequence
from typing import Any

import torch

from opsched.backends.base import Executor, TorchKernels, register_backend
from opsched.backends.cuda_executor import CudaExecutor
from opsched.cost import DEVICES, DeviceSpec, SegmentCut, StageTiming, TimingPolicy
from opsched.cost.devices import gpu_spec_named_in
from opsched.cost.measured import Calibrations
from opsched.errors import CostModelError
from opsched.execution import RunOptions
from opsched.ir import Graph, GraphBuilder
from opsched.runtime import Plan, lower_stage, stage_inputs
from opsched.schedule import Stage
from opsched.timing import Clock, cuda_events_ms, synchronized

__all__ = ["CudaBackend", "cuda_available", "gpu_fingerprint", "gpu_versions", "gpu_preset"]


def cuda_available() -> bool:
    return torch.cuda.is_available()


def gpu_fingerprint(device: torch.device) -> str:
    p = torch.cuda.get_device_properties(device)
    return f"{p.name} sm_{p.major}{p.minor} {p.total_memory // 2**20} MiB x{p.multi_processor_count} SMs"


def gpu_versions() -> str:
    return (f"torch={torch.__version__} cuda={torch.version.cuda} cudnn={torch.backends.cudnn.version()} "
            f"driver={_driver_version()}")


@functools.cache
def _driver_version() -> str:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError, IndexError):
        return "unknown"


def gpu_preset(name: str) -> DeviceSpec:
    """The analytic preset whose name appears in a CUDA device name ("NVIDIA H100 80GB HBM3" -> H100)."""
    spec = gpu_spec_named_in(name)
    if spec is not None:
        return spec
    presets = ", ".join(k for k, s in DEVICES.items() if s.kind == "gpu")
    raise CostModelError(f"no analytic preset for the GPU {name!r} (presets: {presets}); use cost='measured'")


def _device(run: RunOptions) -> torch.device:
    d = run.device
    return torch.device("cuda", d.index if d.index is not None else torch.cuda.current_device())


class CudaBackend(TorchKernels):
    """Torch's CUDA kernels on streams, the plan captured into one CUDA graph (module docstring)."""

    name = "cuda"
    device_type = "cuda"
    relative_pricing = False
    threads_by_cores = False
    default_policy = TimingPolicy(warmup=3, repeat=7, inner=10)

    def unavailable(self) -> str | None:
        if not torch.cuda.is_available():
            return (f"CUDA is not available on this machine (torch {torch.__version__}, "
                    f"torch.cuda.is_available() is False)")
        return None

    def profile_tag(self, run: RunOptions) -> str:
        return "cuda-graph-v1" + ("-channels_last" if run.channels_last else "")

    def fingerprint(self, run: RunOptions) -> str:
        return gpu_fingerprint(_device(run))

    def versions(self) -> str:
        return gpu_versions()

    def clock(self, run: RunOptions) -> Clock:
        device = _device(run)
        return synchronized(lambda: torch.cuda.synchronize(device))

    def analytic_spec(self, run: RunOptions) -> DeviceSpec:
        return gpu_preset(torch.cuda.get_device_name(_device(run)))

    def prepare(self, graph: Graph, plan: Plan, run: RunOptions) -> Executor:
        return self.executor(graph, plan, run.device, graphs=run.graphs, channels_last=run.channels_last)

    def executor(self, graph: Graph, plan: Plan, device: torch.device, **options: Any) -> CudaExecutor:
        """The executor of ``plan`` on ``device`` (what calls and stage timings run)."""
        return CudaExecutor(graph, plan, device=device, **options)

    def segment_cut(self, graph: Graph, run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> SegmentCut | None:
        return None  # the whole plan is one CUDA graph: nothing is cut

    def time_stages(self, graph: Graph, stages: Sequence[Stage], run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> list[StageTiming]:
        replay = calibrations.remember("replay_ms", lambda: self._replay_overhead_ms(run, policy))
        out = []
        for stage in stages:
            samples = self._replays(graph, stage, run, policy)
            out.append(StageTiming(tuple(samples), tuple(max(t - replay, 0.01 * t) for t in samples)))
        return out

    def _replay_overhead_ms(self, run: RunOptions, policy: TimingPolicy) -> float:
        """One replay of a graph holding one trivial kernel, timed like a stage."""
        b = GraphBuilder("empty_replay")
        x = b.input("x", (1, 1))
        g = b.build([b.add("relu", [x], name="noop")])
        return statistics.median(self._replays(g, Stage((("noop",),)), run, policy))

    def _replays(self, graph: Graph, stage: Stage, run: RunOptions, policy: TimingPolicy) -> list[float]:
        """Per sample, the ms of one replay of ``stage``'s captured plan (``inner`` replays timed
        back to back between two CUDA events)."""
        device = _device(run)
        sub, plan = lower_stage(graph, stage)
        executor = self.executor(sub, plan, device, copy_outputs=False, channels_last=run.channels_last,
                                 warmup=policy.warmup)
        try:
            executor(stage_inputs(graph, sub, device))  # warm-up and capture
            if not executor.captured:
                raise CostModelError(f"stage {stage} of graph {graph.name!r} could not be captured into a CUDA "
                                     f"graph ({executor.capture_error}); the CUDA backend times captured stages only")
            def replays() -> None:
                for _ in range(policy.inner):
                    executor.replay()
            return [cuda_events_ms(replays) / policy.inner for _ in range(policy.repeat)]
        finally:
            executor.close()


register_backend(CudaBackend())

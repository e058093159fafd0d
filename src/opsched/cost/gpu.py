"""The measured cost model on a GPU: a stage is captured into a CUDA graph and its replays timed
with CUDA events.

Python launch time is what a captured plan no longer pays, so it must not be what a stage is
priced by: the stage (cut out of the placed graph, lowered and run by the same
:class:`~opsched.runtime.cuda.CudaExecutor` the model will run on, streams, events and all) is
captured once after a warm-up (cuDNN autotuning is on), then each of ``repeat`` samples times
``inner`` back-to-back replays between two CUDA events. The answer is the median sample less
the cost of replaying a graph of one trivial kernel timed the same way: inside the whole
model's graph a stage pays no replay of its own. Wrap it in
:class:`~opsched.cost.cached.StoredCostModel` so every figure lands in the profile store.
"""

from __future__ import annotations

import statistics

import torch

from opsched.cost.devices import DEVICES, DeviceSpec, gpu_spec_named_in
from opsched.cost.measured import random_inputs, stage_plan
from opsched.cost.store import ProfileContext
from opsched.errors import CostModelError
from opsched.ir import Graph, GraphBuilder
from opsched.schedule.types import Stage

__all__ = ["CudaMeasuredCostModel", "gpu_fingerprint", "gpu_versions", "gpu_preset"]


def gpu_fingerprint(device: torch.device) -> str:
    p = torch.cuda.get_device_properties(device)
    return f"{p.name} sm_{p.major}{p.minor} {p.total_memory // 2**20} MiB x{p.multi_processor_count} SMs"


def gpu_versions() -> str:
    return (f"torch={torch.__version__} cuda={torch.version.cuda} cudnn={torch.backends.cudnn.version()} "
            f"driver={_driver_version()}")


def _driver_version() -> str:
    try:
        import subprocess

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


class CudaMeasuredCostModel:
    """GPU stage latencies: captured-graph replays timed with CUDA events (see the module docstring)."""

    monotone = True

    def __init__(self, device: str | torch.device = "cuda", warmup: int = 3, repeat: int = 7, inner: int = 10,
                 channels_last: bool = False) -> None:
        if not torch.cuda.is_available():
            raise CostModelError("the CUDA cost model needs a GPU (torch.cuda.is_available() is False)")
        device = torch.device(device)
        self.device_ = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
        self.warmup, self.repeat, self.inner, self.channels_last = warmup, repeat, inner, channels_last
        self._device = gpu_fingerprint(self.device_)
        self._versions = gpu_versions()
        self._replay_ms: float | None = None

    @property
    def device(self) -> str:
        return self._device

    @property
    def versions(self) -> str:
        return self._versions

    @property
    def _backend(self) -> str:
        return "cuda-graph-v1" + ("-channels_last" if self.channels_last else "")

    @property
    def key(self) -> str:
        return f"measured/{self._backend}/{self._device}/{self._versions}/{self.warmup}x{self.repeat}x{self.inner}"

    def context(self, batch: int) -> ProfileContext:
        return ProfileContext(self._device, self._backend, self._versions, batch)

    def replay_overhead_ms(self) -> float:
        """One replay of a graph holding one trivial kernel, timed like a stage."""
        if self._replay_ms is None:
            b = GraphBuilder("empty_replay")
            x = b.input("x", (1, 1))
            g = b.build([b.add("relu", [x], name="noop")])
            self._replay_ms = self._time(g, Stage((("noop",),)))
        return self._replay_ms

    def stage_latency(self, graph: Graph, stage: Stage) -> float:
        measured = self._time(graph, stage)
        return max(measured - self.replay_overhead_ms(), 0.01 * measured)

    def _time(self, graph: Graph, stage: Stage) -> float:
        from opsched.runtime.cuda import CudaExecutor

        sub, plan = stage_plan(graph, stage)
        executor = CudaExecutor(sub, plan, device=self.device_, copy_outputs=False,
                                channels_last=self.channels_last, warmup=self.warmup)
        executor(random_inputs(sub, self.device_))  # warm-up and capture
        if not executor.captured:
            raise CostModelError(f"stage {stage} of graph {graph.name!r} could not be captured into a CUDA graph "
                                 f"({executor.capture_error}); the CUDA cost model times captured stages only")
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(self.repeat):
            start.record()
            for _ in range(self.inner):
                executor.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / self.inner)
        executor.close()
        return statistics.median(samples)

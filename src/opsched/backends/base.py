"""Backends: the protocol, the registry, and what every CPU backend shares.

A backend names a device kind and a kernel source. It says which ops it runs (and, for the
others, why not), the fingerprint and library versions that key its measurements in the
profile store, its clock, and how a segment cut is priced; it times stages for the measured
cost model (it is a :class:`~opsched.cost.measured.StageTimer`) and prepares an
:class:`Executor` for a plan. Adding a backend is one module with a class like these and one
:func:`register_backend` call (``tests/test_backends.py`` adds one that lives only there).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
import statistics
from collections.abc import Callable, Collection, Sequence
from typing import Protocol, runtime_checkable

import torch

from opsched.cost import DeviceSpec, SegmentCut, StageTiming, TimingPolicy, host_cpu_spec
from opsched.cost.measured import Calibrations
from opsched.errors import OpschedError
from opsched.execution import RunOptions
from opsched.ir import Graph, GraphBuilder
from opsched.ir.ops import op_def
from opsched.runtime import Plan, lower_stage, stage_inputs
from opsched.schedule import Stage
from opsched.timeline import TraceEvent
from opsched.timing import Clock, interleave, wall_ms

__all__ = ["Executor", "Backend", "TorchKernels", "CpuBackend", "register_backend", "get_backend", "backend_names",
           "resolve_backend", "cpu_model_name", "cpu_fingerprint"]


@runtime_checkable
class Executor(Protocol):
    """A plan bound to a backend's kernels, ready to run."""

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Run the plan on ``inputs``; returns its outputs."""

    def trace(self, inputs: Sequence[torch.Tensor]) -> list[TraceEvent]:
        """Run once, recording when each step (or kernel) ran on which lane."""

    def describe(self) -> str:
        """One line about how it runs the plan (sessions, streams, capture)."""

    def close(self) -> None:
        """Release threads, sessions and graphs."""


@runtime_checkable
class Backend(Protocol):
    """A device kind and a kernel source (see the module docstring)."""

    @property
    def name(self) -> str: ...

    @property
    def device_type(self) -> str:
        """The torch device type it runs on: ``"cpu"`` or ``"cuda"``."""

    @property
    def relative_pricing(self) -> bool: ...

    @property
    def threads_by_cores(self) -> bool:
        """Whether a plan's one lane runs on as many threads as its cores (:attr:`RunOptions.cores`):
        ONNX Runtime's sessions, whose intra-op threads they are. Where not, the cores matter only
        between lanes, and a plan on fewer is the same plan."""

    @property
    def default_policy(self) -> TimingPolicy: ...

    def unavailable(self) -> str | None:
        """Why it cannot run on this machine (a missing library, no GPU), or None."""

    def cannot_hold(self, dtypes: Collection[str]) -> str | None:
        """Why it cannot run a graph holding values of ``dtypes`` (``"bfloat16"``...), or None."""

    def supports(self, op: str) -> bool:
        """Whether it runs ``op`` with its own kernels."""

    def opt_out(self, op: str) -> str:
        """Why it does not run ``op`` itself, and what happens instead ("" where it does)."""

    def profile_tag(self, run: RunOptions) -> str: ...

    def fingerprint(self, run: RunOptions) -> str: ...

    def versions(self) -> str: ...

    def clock(self, run: RunOptions) -> Clock:
        """How to time one call of its executors, in ms (to its completion)."""

    def analytic_spec(self, run: RunOptions) -> DeviceSpec:
        """The analytic preset that models the device it runs on."""

    def prepare(self, graph: Graph, plan: Plan, run: RunOptions) -> Executor: ...

    def time_stages(self, graph: Graph, stages: Sequence[Stage], run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> list[StageTiming]: ...

    def segment_cut(self, graph: Graph, run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> SegmentCut | None: ...


_BACKENDS: dict[str, Backend] = {}


def register_backend(backend: Backend) -> Backend:
    if backend.name in _BACKENDS or backend.name == "auto":
        raise ValueError(f"backend name {backend.name!r} is taken")
    _BACKENDS[backend.name] = backend
    return backend


def backend_names() -> list[str]:
    return list(_BACKENDS)


def get_backend(name: str) -> Backend:
    try:
        return _BACKENDS[name]
    except KeyError:
        raise OpschedError(f"no backend {name!r}; available: auto, {', '.join(_BACKENDS)}") from None


#: What ``"auto"`` picks per device type, in order of preference.
AUTO: dict[str, tuple[str, ...]] = {"cpu": ("ort", "torch"), "cuda": ("cuda",)}


def resolve_backend(name: str, device: torch.device, dtypes: Collection[str] = ()) -> Backend:
    """The backend ``name`` for ``device``, checked to run there and to hold values of
    ``dtypes``; ``"auto"``: the preferred one that can (on a CPU, ONNX Runtime's faster kernels
    when it is installed, torch's for what ONNX Runtime cannot hold)."""
    if name == "auto":
        for candidate in AUTO.get(device.type, ()):
            backend = _BACKENDS.get(candidate)
            if backend is not None and backend.unavailable() is None and backend.cannot_hold(dtypes) is None:
                return backend
        held = f" holding {', '.join(sorted(dtypes))}" if dtypes else ""
        raise OpschedError(f"no backend is available for device {device}{held}")
    backend = get_backend(name)
    why = backend.cannot_hold(dtypes)
    if why is not None:
        others = [n for n in AUTO.get(device.type, ()) if _BACKENDS[n].cannot_hold(dtypes) is None]
        raise OpschedError(f"backend {name!r} cannot run a graph holding {', '.join(sorted(dtypes))}: {why}"
                           + (f"; backend={others[0]!r} can" if others else ""))
    if backend.device_type != device.type:
        raise OpschedError(f"backend {name!r} runs on {backend.device_type}, not on {device}: on {device.type} use "
                           f"{' or '.join(n for n, b in _BACKENDS.items() if b.device_type == device.type)}")
    why = backend.unavailable()
    if why is not None:
        raise OpschedError(f"backend {name!r} is not available here: {why}")
    return backend


def cpu_model_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def cpu_fingerprint() -> str:
    return f"{cpu_model_name()} x{os.cpu_count()} threads={torch.get_num_threads()}"


class TorchKernels:
    """What a backend answers that runs any graph, every op on torch's own kernel: no dtype it
    cannot hold, no op it leaves to another."""

    def cannot_hold(self, dtypes: Collection[str]) -> str | None:
        return None

    def supports(self, op: str) -> bool:
        return op_def(op).torch is not None

    def opt_out(self, op: str) -> str:
        return ""


class CpuBackend(TorchKernels):
    """What CPU backends share: the host's fingerprint and analytic preset, a wall clock, and
    stage timing as calls less an empty call. A subclass names itself and prepares executors;
    it overrides what it does differently (ONNX Runtime reads its own profiler)."""

    name = "cpu"
    device_type = "cpu"
    relative_pricing = True
    threads_by_cores = False
    default_policy = TimingPolicy(warmup=2, repeat=7)
    #: Bumped whenever what this backend's measurements mean changes (old ones are then not used).
    measure_version = 4

    def unavailable(self) -> str | None:
        return None

    def profile_tag(self, run: RunOptions) -> str:
        return f"cpu-{self.name}-v{self.measure_version}" + (f"-{run.cores}core" if run.cores else "")

    def fingerprint(self, run: RunOptions) -> str:
        return cpu_fingerprint()

    def versions(self) -> str:
        return f"torch={torch.__version__}"

    def clock(self, run: RunOptions) -> Clock:
        return wall_ms

    def analytic_spec(self, run: RunOptions) -> DeviceSpec:
        return host_cpu_spec()

    def prepare(self, graph: Graph, plan: Plan, run: RunOptions) -> Executor:
        raise NotImplementedError(f"backend {self.name!r} prepares no executor")

    def segment_cut(self, graph: Graph, run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> SegmentCut | None:
        return None

    def time_stages(self, graph: Graph, stages: Sequence[Stage], run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> list[StageTiming]:
        call = self.call_overhead_ms(run, policy, calibrations)
        walls = self.interleaved_walls(graph, stages, run, policy)
        return [StageTiming(tuple(w), tuple(max(t - call, 0.01 * t) for t in w)) for w in walls]

    def call_overhead_ms(self, run: RunOptions, policy: TimingPolicy, calibrations: Calibrations) -> float:
        """The cost of one call that computes (almost) nothing."""
        def measure() -> float:
            b = GraphBuilder("empty_call")
            x = b.input("x", (1, 1))
            g = b.build([b.add("relu", [x], name="noop")])
            (walls,) = self.interleaved_walls(g, [Stage((("noop",),))], run,
                                              dataclasses.replace(policy, repeat=max(policy.repeat, 21)))
            return statistics.median(walls)
        return calibrations.remember("call_ms", measure)

    def interleaved_walls(self, graph: Graph, stages: Sequence[Stage], run: RunOptions, policy: TimingPolicy,
                          prepare: Callable[[Graph, Plan, int], Executor] | None = None) -> list[list[float]]:
        """Each stage cut out of ``graph``, prepared (by ``prepare(sub, plan, k)``, default this
        backend's, never spinning) and run alone, all interleaved round by round: per stage,
        its timed calls' wall times."""
        quiet = dataclasses.replace(run, spin=False)
        make = prepare or (lambda sub, plan, k: self.prepare(sub, plan, quiet))
        runs = []
        try:
            for k, stage in enumerate(stages):
                sub, plan = lower_stage(graph, stage)
                runs.append((make(sub, plan, k), stage_inputs(graph, sub)))
            threads = torch.get_num_threads()
            if run.cores:
                torch.set_num_threads(run.cores)
            try:
                walls = interleave({k: functools.partial(ex, x) for k, (ex, x) in enumerate(runs)}, policy.repeat,
                                   policy.warmup)
            finally:
                torch.set_num_threads(threads)
        finally:
            for executor, _ in runs:
                executor.close()
        return [walls[k] for k in range(len(stages))]

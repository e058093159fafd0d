"""Backends, one module each, registered by name: ``ort`` (ONNX Runtime sessions per lane
segment, the CPU default), ``torch`` (eager torch kernels on CPU threads), ``inductor`` (each
lane segment compiled by TorchInductor, on CPU threads), ``cuda`` (CUDA streams, captured into one
CUDA graph), ``cuda-inductor`` (Inductor-compiled lane segments on CUDA streams, captured into one
CUDA graph) and ``units`` (placed plans, each lane on a unit of a platform). See :mod:`.base` for what a backend is."""

from opsched.backends import cuda, cuda_inductor, inductor, ort, torch_cpu, units
from opsched.backends.base import (
    Backend,
    CpuBackend,
    Executor,
    backend_names,
    cpu_fingerprint,
    cpu_model_name,
    get_backend,
    register_backend,
    resolve_backend,
)

__all__ = [
    "Backend", "CpuBackend", "Executor", "backend_names", "cpu_fingerprint", "cpu_model_name", "cuda", "cuda_inductor",
    "get_backend", "inductor", "ort", "register_backend", "resolve_backend", "torch_cpu", "units",
]

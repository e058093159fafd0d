"""opsched: inter-operator scheduling for DNN inference.

Independent operators of a model run at the same time (CUDA streams on a GPU, threads on a
CPU) instead of one after another. :func:`optimize` turns an ``nn.Module`` into a scheduled
module that returns the same outputs; :func:`from_torch` and :func:`from_onnx` import a model
as a :class:`Graph`; the model zoo is in :mod:`opsched.models`.

The names below are loaded on first use, so that ``import opsched`` (and the command line's
``--help`` and ``--version``) costs nothing until something is used.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "optimize": "opsched.api", "optimize_graph": "opsched.api", "load": "opsched.api", "load_graph": "opsched.api",
    "OpschedError": "opsched.errors",
    "from_onnx": "opsched.frontends", "from_torch": "opsched.frontends",
    "Graph": "opsched.ir", "Node": "opsched.ir", "TensorType": "opsched.ir",
    "ScheduledModule": "opsched.module",
    "optimize_per_shape": "opsched.buckets", "load_per_shape": "opsched.buckets", "ShapeBuckets": "opsched.buckets",
    "run_graph": "opsched.runtime",
    "place": "opsched.transforms.place",
}

__all__ = [
    "Graph", "Node", "OpschedError", "ScheduledModule", "ShapeBuckets", "TensorType", "__version__", "from_onnx",
    "from_torch", "load", "load_graph", "load_per_shape", "optimize", "optimize_graph", "optimize_per_shape", "place",
    "run_graph",
]

if TYPE_CHECKING:
    from opsched.api import load, load_graph, optimize, optimize_graph
    from opsched.buckets import ShapeBuckets, load_per_shape, optimize_per_shape
    from opsched.errors import OpschedError
    from opsched.frontends import from_onnx, from_torch
    from opsched.ir import Graph, Node, TensorType
    from opsched.module import ScheduledModule
    from opsched.runtime import run_graph
    from opsched.transforms.place import place


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'opsched' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))

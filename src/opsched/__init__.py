"""opsched: inter-operator scheduling for DNN inference.

Independent operators of a model run at the same time (CUDA streams on a GPU, threads on a
CPU) instead of one after another. Start with :func:`from_torch` or :func:`from_onnx` to get a
:class:`Graph`; the model zoo is in :mod:`opsched.models`.
"""

from opsched.api import load, optimize, optimize_graph
from opsched.errors import OpschedError
from opsched.frontends import from_onnx, from_torch
from opsched.ir import Graph, Node, TensorType
from opsched.runtime import run_graph
from opsched.runtime.module import ScheduledModule
from opsched.transforms.place import place

__version__ = "0.1.0"

__all__ = [
    "Graph", "Node", "OpschedError", "ScheduledModule", "TensorType", "__version__", "from_onnx", "from_torch",
    "load", "optimize", "optimize_graph", "place", "run_graph",
]

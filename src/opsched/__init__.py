"""opsched: inter-operator scheduling for DNN inference.

Independent operators of a model run at the same time (CUDA streams on a GPU, threads on a
CPU) instead of one after another. :func:`optimize` turns an ``nn.Module`` into a scheduled
module that returns the same outputs; :func:`from_torch` and :func:`from_onnx` import a model
as a :class:`Graph`; the model zoo is in :mod:`opsched.models`.
"""

from opsched import ops  # noqa: F401  (registers every op family before anything uses the IR)
from opsched.api import load, optimize, optimize_graph
from opsched.errors import OpschedError
from opsched.frontends import from_onnx, from_torch
from opsched.ir import Graph, Node, TensorType
from opsched.module import ScheduledModule
from opsched.runtime import run_graph
from opsched.transforms.place import place

__version__ = "0.1.0"

__all__ = [
    "Graph", "Node", "OpschedError", "ScheduledModule", "TensorType", "__version__", "from_onnx", "from_torch",
    "load", "optimize", "optimize_graph", "place", "run_graph",
]

"""The op table: per op kind, its schema, its torch kernel and its ONNX export, in one record.

Each family module (:mod:`opsched.ir.ops.conv`, :mod:`opsched.ir.ops.activation`, ...) registers its
ops with :func:`register`, which also registers the schema with the IR
(:func:`opsched.ir.register_op`). Backends find what they run here: the torch backends (CPU
and CUDA) and the reference interpreter bind :attr:`OpDef.torch`; the ONNX Runtime backend
exports with :attr:`OpDef.onnx`. An op without an ONNX export says why (:attr:`OpDef.no_onnx`):
the ONNX Runtime backend then runs it with torch between its sessions, which cuts them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from opsched.errors import ExecutionError, UnknownOpError
from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.schema import OpSchema, register_op

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__ = ["Kernel", "KernelFactory", "OnnxExport", "OpDef", "NotExportable", "register", "op_def", "op_defs",
           "torch_kernel"]

#: A node bound to its attributes and parameters: takes the input tensors, returns the output
#: (or, for a merged convolution, one output per member).
Kernel = Callable[..., Any]
KernelFactory = Callable[[Graph, Node], Kernel]
#: Adds the ONNX nodes computing a node to a builder; raises :class:`NotExportable` for a
#: configuration ONNX cannot express.
OnnxExport = Callable[["OnnxBuilder", Node], None]


class NotExportable(Exception):
    """An op's configuration that its ONNX export cannot express (internal signal: the step
    then runs with torch)."""


@dataclass(frozen=True, slots=True)
class OpDef:
    """Everything opsched knows about one op kind, kept by its family."""

    schema: OpSchema
    torch: KernelFactory
    onnx: OnnxExport | None = None
    no_onnx: str = ""  # why there is no ONNX export (required when ``onnx`` is None)

    def __post_init__(self) -> None:
        if self.onnx is None and not self.no_onnx:
            raise ValueError(f"op {self.schema.name!r} has no ONNX export and does not say why (no_onnx=)")

    @property
    def name(self) -> str:
        return self.schema.name

    @property
    def category(self) -> str:
        return self.schema.category


_DEFS: dict[str, OpDef] = {}


def register(opdef: OpDef) -> OpDef:
    """Register an op kind: its schema with the IR, its kernels and export here."""
    register_op(opdef.schema)
    _DEFS[opdef.name] = opdef
    return opdef


def op_def(op: str) -> OpDef:
    try:
        return _DEFS[op]
    except KeyError:
        raise UnknownOpError(f"unknown op kind {op!r}; registered: {', '.join(sorted(_DEFS))}") from None


def op_defs() -> tuple[OpDef, ...]:
    return tuple(_DEFS[k] for k in sorted(_DEFS))


def torch_kernel(graph: Graph, node: Node) -> Kernel:
    """``node`` bound to its attributes and parameters as a torch call."""
    try:
        return op_def(node.op).torch(graph, node)
    except UnknownOpError:
        raise ExecutionError(f"no kernel for op {node.op!r} (node {node.name!r})") from None


def params(graph: Graph, node: Node) -> list[torch.Tensor]:
    """The node's parameter tensors, in order."""
    return [graph.params[p] for p in node.params]

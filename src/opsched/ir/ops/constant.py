"""Constants (a parameter as a value) and opaque calls (a Python callable the importer could
not convert: it still runs, with torch, but cannot be merged, exported or priced analytically)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops._common import fail, zero_flops
from opsched.ir.ops.registry import Kernel, OpDef, params, register
from opsched.ir.schema import OpSchema
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__: list[str] = []


def _const_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    if len(params) != 1:
        raise fail("constant", "expects exactly one parameter")
    return params[0]


def _const_kernel(graph: Graph, node: Node) -> Kernel:
    (value,) = params(graph, node)
    return lambda: value


def _const_export(b: OnnxBuilder, n: Node) -> None:
    b.add("Identity", [b.param(n, 0)], n.name)


def _opaque_kernel(graph: Graph, node: Node) -> Kernel:
    return graph.callables[node.name]


register(OpDef(OpSchema("constant", "const", (0, 0), _const_infer, zero_flops, is_view=True), _const_kernel,
               _const_export))
register(OpDef(OpSchema("opaque", "opaque", (0, None), None, zero_flops), _opaque_kernel,
               no_onnx="an opaque node is a Python callable: there is nothing to export (the ONNX Runtime "
                       "backend runs it with torch between its sessions)"))

"""Fully connected layers (``y = x W^T + b``, over the last dimension)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch.nn.functional as F

from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops._common import fail
from opsched.ir.ops.activation import apply_activation, export_activation
from opsched.ir.ops.registry import Kernel, OpDef, params, register
from opsched.ir.schema import OpSchema
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__: list[str] = []


def _infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    w = params[0] if params else None
    if w is None or w.rank != 2 or x.shape[-1] != w.shape[1]:
        raise fail("linear", f"weight {w} does not fit input {x} (expected weight[out,{x.shape[-1]}])")
    return TensorType(x.shape[:-1] + (w.shape[0],), x.dtype)


def _flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType], out: TensorType) -> int:
    return 2 * out.numel * params[0].shape[1] + (out.numel if len(params) > 1 else 0)


def _kernel(graph: Graph, node: Node) -> Kernel:
    p = params(graph, node)
    weight, bias = p[0], (p[1] if len(p) > 1 else None)
    return apply_activation(lambda x: F.linear(x, weight, bias), node.attr("act", "none"))


def _export(b: OnnxBuilder, n: Node) -> None:
    """Gemm on a matrix; on a batch of them (a transformer's tokens), MatMul by the transposed
    weight and Add of the bias, which ONNX Runtime fuses into one kernel."""
    act = n.attr("act", "none")
    out = None if act != "none" else n.name
    if len(b.graph.types[n.inputs[0]].shape) == 2:
        y = b.add("Gemm", [n.inputs[0]] + [b.param(n, i) for i in range(len(n.params))], out, transB=1)
    else:
        weight_t = b.init(b.graph.params[n.params[0]].t().contiguous(), f"{n.name}_wT")
        y = b.add("MatMul", [n.inputs[0], weight_t], out if len(n.params) == 1 else None)
        if len(n.params) > 1:
            y = b.add("Add", [y, b.param(n, 1)], out)
    if act != "none":
        export_activation(b, y, act, n.name, n)


register(OpDef(OpSchema("linear", "gemm", (1, 1), _infer, _flops), _kernel, _export))

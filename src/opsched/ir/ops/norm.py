"""Inference batch normalisation (a per-channel affine map from running statistics)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch.nn.functional as F

from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops._common import fail, per_element
from opsched.ir.ops.registry import Kernel, OpDef, params, register
from opsched.ir.schema import OpSchema
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__: list[str] = []


def _infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    if len(params) != 4 or any(p.shape != (x.shape[1],) for p in params):
        raise fail("batch_norm", f"expects 4 parameters of shape ({x.shape[1]},) for input {x}")
    return x


def _kernel(graph: Graph, node: Node) -> Kernel:
    weight, bias, mean, var = params(graph, node)
    eps = node.attr("eps", 1e-5)
    return lambda x: F.batch_norm(x, mean, var, weight, bias, False, 0.0, eps)


def _export(b: OnnxBuilder, n: Node) -> None:
    b.add("BatchNormalization", [n.inputs[0]] + [b.param(n, i) for i in range(4)], n.name,
          epsilon=float(n.attr("eps", 1e-5)))


register(OpDef(OpSchema("batch_norm", "norm", (1, 1), _infer, per_element(2)), _kernel, _export))

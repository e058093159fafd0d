"""Reductions over axes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops._common import axis_of, reduce_flops
from opsched.ir.ops.registry import Kernel, OpDef, register
from opsched.ir.schema import OpSchema
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__: list[str] = []


def _mean_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    dims = {axis_of(d, x.rank) for d in attrs["dims"]}
    keep = attrs.get("keepdim", False)
    shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape) if keep or i not in dims)
    return TensorType(shape, x.dtype)


def _mean_kernel(graph: Graph, node: Node) -> Kernel:
    dims, keep = tuple(node.attr("dims")), node.attr("keepdim", False)
    return lambda x: x.mean(dims, keepdim=keep)


def _mean_export(b: OnnxBuilder, n: Node) -> None:
    axes = b.init(np.array([int(d) for d in n.attr("dims")], np.int64), f"{n.name}_axes")
    b.add("ReduceMean", [n.inputs[0], axes], n.name, keepdims=int(bool(n.attr("keepdim", False))))


register(OpDef(OpSchema("mean", "reduce", (1, 1), _mean_infer, reduce_flops), _mean_kernel, _mean_export))

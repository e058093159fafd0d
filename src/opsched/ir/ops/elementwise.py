"""Broadcasting arithmetic: n-ary sums and products, in the dtype torch promotes their inputs to
(``mask * x``: a bool mask times float32 values is float32; a sum or product of bools is their
logical or, and)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops._common import broadcast, per_element
from opsched.ir.ops.registry import Kernel, OpDef, register
from opsched.ir.schema import OpSchema
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__: list[str] = []


def _infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    return broadcast("add/mul", inputs)


def _add_kernel(graph: Graph, node: Node) -> Kernel:
    if len(node.inputs) == 2:
        return torch.add
    # where operands differ in dtype, the first two may promote to less than all of them
    dtype = getattr(torch, node.out.dtype) if len({graph.types[v].dtype for v in node.inputs}) > 1 else None

    def add(*xs: torch.Tensor) -> torch.Tensor:
        out = xs[0] + xs[1] if dtype is None else (xs[0] + xs[1]).to(dtype)
        for x in xs[2:]:
            out += x  # out is a fresh tensor here, so accumulating in place is safe
        return out
    return add


def _add_export(b: OnnxBuilder, n: Node) -> None:
    """A chain of binary Adds, not one Sum: ONNX Runtime folds an Add into the convolution that
    produces one of its inputs (and the ReLU after it), which it does not do for Sum (RandWire-
    small: 1.72 ms of kernels per run as Adds, 1.89 as Sums). Bools are summed by Or."""
    operands, op = b.promoted_inputs(n), "Or" if n.out.dtype == "bool" else "Add"
    acc = operands[0]
    for k, v in enumerate(operands[1:], start=2):
        acc = b.add(op, [acc, v], n.name if k == len(operands) else None)


def _mul_kernel(graph: Graph, node: Node) -> Kernel:
    return torch.mul


def _mul_export(b: OnnxBuilder, n: Node) -> None:
    b.add("And" if n.out.dtype == "bool" else "Mul", b.promoted_inputs(n), n.name)


register(OpDef(OpSchema("add", "elementwise", (2, None), _infer, per_element(1)), _add_kernel, _add_export))
register(OpDef(OpSchema("mul", "elementwise", (2, 2), _infer, per_element(1)), _mul_kernel, _mul_export))

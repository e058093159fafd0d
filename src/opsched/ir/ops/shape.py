"""Data movement and views: concatenation, padding, slicing, reshapes, identity."""

from __future__ import annotations

from collections.abc import Sequence
from math import prod
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops._common import axis_of, fail, promoted, same, zero_flops
from opsched.ir.ops.registry import Kernel, OpDef, register
from opsched.ir.schema import OpSchema
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__: list[str] = []


# --- concat -------------------------------------------------------------------------------
def _concat_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    axis = axis_of(attrs.get("axis", 1), inputs[0].rank)
    first = inputs[0]
    for t in inputs[1:]:
        if t.rank != first.rank or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis):
            raise fail("concat", f"inputs {[str(i) for i in inputs]} differ outside axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in inputs)
    return TensorType(tuple(shape), promoted(inputs))  # torch.cat promotes: an int64 and a float32 part, float32


def _concat_kernel(graph: Graph, node: Node) -> Kernel:
    axis = node.attr("axis", 1)
    return lambda *xs: torch.cat(xs, axis)


def _concat_export(b: OnnxBuilder, n: Node) -> None:
    b.add("Concat", b.promoted_inputs(n), n.name, axis=int(n.attr("axis", 1)))


# --- pad ----------------------------------------------------------------------------------
def _pad_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    pads = attrs["pads"]  # torch.nn.functional.pad order: last dim first, (before, after) pairs
    if len(pads) % 2 or len(pads) // 2 > x.rank:
        raise fail("pad", f"pads {pads} do not fit {x}")
    shape = list(x.shape)
    for i in range(len(pads) // 2):
        shape[x.rank - 1 - i] += pads[2 * i] + pads[2 * i + 1]
    return TensorType(tuple(shape), x.dtype)


def _pad_kernel(graph: Graph, node: Node) -> Kernel:
    pads, value = node.attr("pads"), node.attr("value", 0.0)
    return lambda x: F.pad(x, pads, value=value)


def _pad_export(b: OnnxBuilder, n: Node) -> None:
    pads = list(n.attr("pads"))
    rank = len(b.graph.types[n.inputs[0]].shape)
    begin, end = [0] * rank, [0] * rank
    for i in range(len(pads) // 2):
        begin[rank - 1 - i], end[rank - 1 - i] = pads[2 * i], pads[2 * i + 1]
    value = b.init(np.array(n.attr("value", 0.0), getattr(np, n.out.dtype)), "v")  # in the padded value's dtype
    b.add("Pad", [n.inputs[0], b.init(np.array(begin + end, np.int64), "p"), value], n.name, mode="constant")


# --- slice --------------------------------------------------------------------------------
def _slice_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    axis = axis_of(attrs["axis"], x.rank)
    start, end, step = slice(attrs["start"], attrs.get("end"), attrs.get("step", 1)).indices(x.shape[axis])
    shape = list(x.shape)
    shape[axis] = len(range(start, end, step))  # may be empty: a cache of no entries yet
    return TensorType(tuple(shape), x.dtype)


def _slice_kernel(graph: Graph, node: Node) -> Kernel:
    rank = len(graph.types[node.inputs[0]].shape)
    axis = node.attr("axis") % rank
    window = slice(node.attr("start"), node.attr("end"), node.attr("step", 1))
    index: tuple[Any, ...] = (slice(None),) * axis + (window,)
    return lambda x: x[index]


def _slice_export(b: OnnxBuilder, n: Node) -> None:
    rank = len(b.graph.types[n.inputs[0]].shape)
    axis = int(n.attr("axis")) % rank
    end = n.attr("end")
    end = np.iinfo(np.int64).max if end is None else int(end)
    arrays = [np.array([int(n.attr("start"))]), np.array([end]), np.array([axis]), np.array([int(n.attr("step", 1))])]
    b.add("Slice", [n.inputs[0]] + [b.init(a.astype(np.int64), "s") for a in arrays], n.name)


def _slice_extent(attrs: FrozenAttrs) -> FrozenAttrs:
    """A slice's attrs without its start and end: where its window lies, not how wide it is
    (its output type) or how it strides."""
    return FrozenAttrs({k: v for k, v in attrs.items() if k not in ("start", "end")})


# --- reshapes -----------------------------------------------------------------------------
def _flatten_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    start = axis_of(attrs.get("start_dim", 1), x.rank)
    end = axis_of(attrs.get("end_dim", -1), x.rank)
    return TensorType(x.shape[:start] + (prod(x.shape[start:end + 1]),) + x.shape[end + 1:], x.dtype)


def _flatten_kernel(graph: Graph, node: Node) -> Kernel:
    start, end = node.attr("start_dim", 1), node.attr("end_dim", -1)
    return lambda x: torch.flatten(x, start, end)


def _reshape_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    shape = tuple(attrs["shape"])
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise fail("reshape", f"target shape {shape} is not a valid reshape")
    known = prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or x.numel % known:
            raise fail("reshape", f"cannot reshape {x} to {shape}")
        shape = tuple(x.numel // known if d == -1 else d for d in shape)
    if prod(shape) != x.numel:
        raise fail("reshape", f"cannot reshape {x} ({x.numel} elements) to {shape}")
    return TensorType(shape, x.dtype)


def _reshape_kernel(graph: Graph, node: Node) -> Kernel:
    shape = tuple(node.out.shape)
    return lambda x: x.reshape(shape)


def _reshape_export(b: OnnxBuilder, n: Node) -> None:
    b.add("Reshape", [n.inputs[0], b.init(np.array(n.out.shape, np.int64), "shape")], n.name)


# --- identity -----------------------------------------------------------------------------
def _identity_kernel(graph: Graph, node: Node) -> Kernel:
    return lambda x: x


def _identity_export(b: OnnxBuilder, n: Node) -> None:
    b.add("Identity", [n.inputs[0]], n.name)


register(OpDef(OpSchema("concat", "data", (1, None), _concat_infer, zero_flops), _concat_kernel, _concat_export))
register(OpDef(OpSchema("pad", "data", (1, 1), _pad_infer, zero_flops), _pad_kernel, _pad_export))
register(OpDef(OpSchema("slice", "view", (1, 1), _slice_infer, zero_flops, is_view=True, positions=_slice_extent),
               _slice_kernel, _slice_export))
register(OpDef(OpSchema("flatten", "view", (1, 1), _flatten_infer, zero_flops, is_view=True), _flatten_kernel,
               _reshape_export))
register(OpDef(OpSchema("reshape", "view", (1, 1), _reshape_infer, zero_flops, is_view=True), _reshape_kernel,
               _reshape_export))
register(OpDef(OpSchema("identity", "view", (1, 1), same, zero_flops, is_view=True), _identity_kernel,
               _identity_export))

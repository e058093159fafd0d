"""The op registry: for each op kind, its shape rule, FLOPs, bytes moved and category.

An op kind is a plain string (``"conv2d"``); its :class:`OpSchema` is found with
:func:`op_schema`. Frontends, the verifier, cost models and the runtime all consult this one
table, so adding an op means registering one schema here and one kernel in
:mod:`opsched.runtime.kernels`.

Conventions: tensors are NCHW; ``out`` includes the batch dimension; FLOPs count a
multiply-accumulate as two operations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from math import prod
from typing import TYPE_CHECKING

from opsched.errors import ShapeMismatchError, UnknownOpError
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    from opsched.ir.node import Node

__all__ = [
    "OpSchema",
    "ACTIVATIONS",
    "CATEGORIES",
    "register_op",
    "op_schema",
    "registered_ops",
    "infer_type",
    "node_flops",
    "node_bytes",
    "conv_output_hw",
    "pool_output_hw",
]

#: Activations that may stand alone or be fused into a conv2d / linear (attr ``act``).
ACTIVATIONS: tuple[str, ...] = ("relu", "relu6", "sigmoid", "tanh", "gelu", "silu", "hardswish")

#: What an op mostly does; cost models and pictures group by it.
CATEGORIES: tuple[str, ...] = (
    "conv", "gemm", "norm", "activation", "elementwise", "pool", "reduce", "data", "view",
    "const", "opaque",
)

ShapeRule = Callable[[Sequence[TensorType], FrozenAttrs, Sequence[TensorType]], TensorType]
FlopRule = Callable[[Sequence[TensorType], FrozenAttrs, Sequence[TensorType], TensorType], int]


@dataclass(frozen=True, slots=True)
class OpSchema:
    """What opsched knows about one op kind.

    ``infer`` maps (input types, attrs, parameter types) to the output type, raising
    :class:`ShapeMismatchError` when the inputs do not fit; ``None`` means the op carries its
    output type itself (opaque calls). ``is_view`` ops move no bytes (they alias their input).
    """

    name: str
    category: str
    arity: tuple[int, int | None]
    infer: ShapeRule | None
    flops: FlopRule
    is_view: bool = False


_REGISTRY: dict[str, OpSchema] = {}


def register_op(schema: OpSchema) -> OpSchema:
    if schema.name in _REGISTRY:
        raise ValueError(f"op {schema.name!r} is registered twice")
    if schema.category not in CATEGORIES:
        raise ValueError(f"op {schema.name!r}: unknown category {schema.category!r}")
    _REGISTRY[schema.name] = schema
    return schema


def op_schema(op: str) -> OpSchema:
    try:
        return _REGISTRY[op]
    except KeyError:
        raise UnknownOpError(f"unknown op kind {op!r}; registered: {', '.join(sorted(_REGISTRY))}") from None


def registered_ops() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def infer_type(op: str, inputs: Sequence[TensorType], attrs: FrozenAttrs,
               params: Sequence[TensorType] = ()) -> TensorType | None:
    """The output type of ``op`` on these inputs, or ``None`` for ops without a shape rule."""
    schema = op_schema(op)
    lo, hi = schema.arity
    if len(inputs) < lo or (hi is not None and len(inputs) > hi):
        want = f"{lo}" if lo == hi else f"{lo}..{hi if hi is not None else 'n'}"
        raise ShapeMismatchError(f"op {op!r} takes {want} inputs, got {len(inputs)}")
    return schema.infer(inputs, attrs, params) if schema.infer else None


def node_flops(node: Node, inputs: Sequence[TensorType], params: Sequence[TensorType]) -> int:
    return op_schema(node.op).flops(inputs, node.attrs, params, node.out)


def node_bytes(node: Node, inputs: Sequence[TensorType], params: Sequence[TensorType]) -> int:
    """Bytes read and written by the node's kernel (zero for views)."""
    if op_schema(node.op).is_view:
        return 0
    return sum(t.nbytes for t in inputs) + sum(p.nbytes for p in params) + node.out.nbytes


# --- helpers ------------------------------------------------------------------------------
def _fail(op: str, why: str) -> ShapeMismatchError:
    return ShapeMismatchError(f"{op}: {why}")


def _pair(value: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    a, b = value
    return (int(a), int(b))


def _window(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p:  # the last window must start inside the input
        out -= 1
    return out


def conv_output_hw(h: int, w: int, attrs: FrozenAttrs, kernel: tuple[int, int]) -> tuple[int, int]:
    sh, sw = _pair(attrs.get("stride", 1))
    ph, pw = _pair(attrs.get("padding", 0))
    dh, dw = _pair(attrs.get("dilation", 1))
    return _window(h, kernel[0], sh, ph, dh, False), _window(w, kernel[1], sw, pw, dw, False)


def pool_output_hw(h: int, w: int, attrs: FrozenAttrs) -> tuple[int, int]:
    kh, kw = _pair(attrs["kernel"])
    sh, sw = _pair(attrs.get("stride", attrs["kernel"]))
    ph, pw = _pair(attrs.get("padding", 0))
    dh, dw = _pair(attrs.get("dilation", 1))
    ceil = bool(attrs.get("ceil_mode", False))
    return _window(h, kh, sh, ph, dh, ceil), _window(w, kw, sw, pw, dw, ceil)


def _broadcast(op: str, types: Sequence[TensorType]) -> TensorType:
    rank = max(t.rank for t in types)
    dims = []
    for i in range(rank):
        sizes = {t.shape[i - rank + t.rank] for t in types if i - rank + t.rank >= 0} - {1}
        if len(sizes) > 1:
            raise _fail(op, f"cannot broadcast shapes {[t.shape for t in types]}")
        dims.append(sizes.pop() if sizes else 1)
    return TensorType(tuple(dims), types[0].dtype)


def _axis(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


# --- shape and FLOP rules -----------------------------------------------------------------
def _conv_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    if x.rank != 4:
        raise _fail("conv2d", f"expects an NCHW input, got {x}")
    if not params:
        raise _fail("conv2d", "has no weight parameter")
    w = params[0]
    groups = attrs.get("groups", 1)
    if w.rank != 4 or w.shape[1] * groups != x.shape[1]:
        raise _fail("conv2d", f"weight {w} with groups={groups} does not fit input {x} "
                              f"(expected weight[:,{x.shape[1] // max(groups, 1)},kh,kw])")
    if len(params) > 1 and params[1].shape != (w.shape[0],):
        raise _fail("conv2d", f"bias {params[1]} does not match {w.shape[0]} output channels")
    act = attrs.get("act", "none")
    if act != "none" and act not in ACTIVATIONS:
        raise _fail("conv2d", f"unknown fused activation {act!r}")
    h, wd = conv_output_hw(x.shape[2], x.shape[3], attrs, (w.shape[2], w.shape[3]))
    if h <= 0 or wd <= 0:
        raise _fail("conv2d", f"output would be empty for input {x} and kernel {w.shape[2:]}")
    return TensorType((x.shape[0], w.shape[0], h, wd), x.dtype)


def _conv_flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType],
                out: TensorType) -> int:
    w = params[0]
    macs = out.numel * w.shape[1] * w.shape[2] * w.shape[3]
    return 2 * macs + (out.numel if len(params) > 1 else 0)


def _linear_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    w = params[0] if params else None
    if w is None or w.rank != 2 or x.shape[-1] != w.shape[1]:
        raise _fail("linear", f"weight {w} does not fit input {x} (expected weight[out,{x.shape[-1]}])")
    return TensorType(x.shape[:-1] + (w.shape[0],), x.dtype)


def _linear_flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType],
                  out: TensorType) -> int:
    return 2 * out.numel * params[0].shape[1] + (out.numel if len(params) > 1 else 0)


def _batch_norm_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    if len(params) != 4 or any(p.shape != (x.shape[1],) for p in params):
        raise _fail("batch_norm", f"expects 4 parameters of shape ({x.shape[1]},) for input {x}")
    return x


def _same(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    return inputs[0]


def _sum_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    return _broadcast("add/mul", inputs)


def _concat_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    axis = _axis(attrs.get("axis", 1), inputs[0].rank)
    first = inputs[0]
    for t in inputs[1:]:
        if t.rank != first.rank or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis):
            raise _fail("concat", f"inputs {[str(i) for i in inputs]} differ outside axis {axis}")
    shape = list(first.shape)
    shape[axis] = sum(t.shape[axis] for t in inputs)
    return TensorType(tuple(shape), first.dtype)


def _slice_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    axis = _axis(attrs["axis"], x.rank)
    start, end, step = slice(attrs["start"], attrs.get("end"), attrs.get("step", 1)).indices(x.shape[axis])
    size = len(range(start, end, step))
    if size == 0:
        raise _fail("slice", f"slice {attrs['start']}:{attrs.get('end')} of axis {axis} of {x} is empty")
    shape = list(x.shape)
    shape[axis] = size
    return TensorType(tuple(shape), x.dtype)


def _pad_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    pads = attrs["pads"]  # torch.nn.functional.pad order: last dim first, (before, after) pairs
    if len(pads) % 2 or len(pads) // 2 > x.rank:
        raise _fail("pad", f"pads {pads} do not fit {x}")
    shape = list(x.shape)
    for i in range(len(pads) // 2):
        shape[x.rank - 1 - i] += pads[2 * i] + pads[2 * i + 1]
    return TensorType(tuple(shape), x.dtype)


def _pool_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    if x.rank != 4:
        raise _fail("pool", f"expects an NCHW input, got {x}")
    h, w = pool_output_hw(x.shape[2], x.shape[3], attrs)
    if h <= 0 or w <= 0:
        raise _fail("pool", f"output would be empty for input {x} and kernel {attrs['kernel']}")
    return TensorType((x.shape[0], x.shape[1], h, w), x.dtype)


def _pool_flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType],
                out: TensorType) -> int:
    kh, kw = _pair(attrs["kernel"])
    return out.numel * kh * kw


def _adaptive_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    oh, ow = _pair(attrs["output_size"])
    return TensorType((x.shape[0], x.shape[1], oh, ow), x.dtype)


def _mean_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    dims = {_axis(d, x.rank) for d in attrs["dims"]}
    keep = attrs.get("keepdim", False)
    shape = tuple(1 if i in dims else s for i, s in enumerate(x.shape) if keep or i not in dims)
    return TensorType(shape, x.dtype)


def _flatten_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    start = _axis(attrs.get("start_dim", 1), x.rank)
    end = _axis(attrs.get("end_dim", -1), x.rank)
    return TensorType(x.shape[:start] + (prod(x.shape[start:end + 1]),) + x.shape[end + 1:], x.dtype)


def _reshape_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    shape = tuple(attrs["shape"])
    if shape.count(-1) > 1 or any(d < -1 for d in shape):
        raise _fail("reshape", f"target shape {shape} is not a valid reshape")
    known = prod(d for d in shape if d != -1)
    if -1 in shape:
        if known == 0 or x.numel % known:
            raise _fail("reshape", f"cannot reshape {x} to {shape}")
        shape = tuple(x.numel // known if d == -1 else d for d in shape)
    if prod(shape) != x.numel:
        raise _fail("reshape", f"cannot reshape {x} ({x.numel} elements) to {shape}")
    return TensorType(shape, x.dtype)


def _const_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    if len(params) != 1:
        raise _fail("constant", "expects exactly one parameter")
    return params[0]


def _per_element(cost: int) -> FlopRule:
    def flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType],
              out: TensorType) -> int:
        return cost * out.numel * max(1, len(inputs) - 1)
    return flops


def _zero(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType],
          out: TensorType) -> int:
    return 0


def _reduce_flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType],
                  out: TensorType) -> int:
    return inputs[0].numel


# --- the table ----------------------------------------------------------------------------
register_op(OpSchema("conv2d", "conv", (1, 1), _conv_infer, _conv_flops))
register_op(OpSchema("linear", "gemm", (1, 1), _linear_infer, _linear_flops))
register_op(OpSchema("batch_norm", "norm", (1, 1), _batch_norm_infer, _per_element(2)))
for _act, _cost in zip(ACTIVATIONS, (1, 2, 4, 4, 8, 5, 5)):
    register_op(OpSchema(_act, "activation", (1, 1), _same, _per_element(_cost)))
register_op(OpSchema("add", "elementwise", (2, None), _sum_infer, _per_element(1)))
register_op(OpSchema("mul", "elementwise", (2, 2), _sum_infer, _per_element(1)))
register_op(OpSchema("concat", "data", (1, None), _concat_infer, _zero))
register_op(OpSchema("pad", "data", (1, 1), _pad_infer, _zero))
register_op(OpSchema("slice", "view", (1, 1), _slice_infer, _zero, is_view=True))
register_op(OpSchema("max_pool2d", "pool", (1, 1), _pool_infer, _pool_flops))
register_op(OpSchema("avg_pool2d", "pool", (1, 1), _pool_infer, _pool_flops))
register_op(OpSchema("adaptive_avg_pool2d", "reduce", (1, 1), _adaptive_infer, _reduce_flops))
register_op(OpSchema("mean", "reduce", (1, 1), _mean_infer, _reduce_flops))
register_op(OpSchema("softmax", "activation", (1, 1), _same, _per_element(5)))
register_op(OpSchema("flatten", "view", (1, 1), _flatten_infer, _zero, is_view=True))
register_op(OpSchema("reshape", "view", (1, 1), _reshape_infer, _zero, is_view=True))
register_op(OpSchema("identity", "view", (1, 1), _same, _zero, is_view=True))
register_op(OpSchema("constant", "const", (0, 0), _const_infer, _zero, is_view=True))
register_op(OpSchema("opaque", "opaque", (0, None), None, _zero))

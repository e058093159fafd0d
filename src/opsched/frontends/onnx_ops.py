"""The ONNX converter table: one converter per op type and opset (constant folding's NumPy rules
are :mod:`opsched.frontends.onnx_fold`'s).

Each converter receives the conversion context, the ONNX node, its inputs (graph value names,
or NumPy arrays for constants) and its attributes, and returns the value name(s) it defines.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
from onnx import helper

from opsched.frontends._common import Unsupported
from opsched.frontends.onnx_fold import FOLDABLE, as_ints, optional_ints, reshape_dims
from opsched.ir.ops.onnx_builder import ONNX_DTYPES
from opsched.ir.types import TensorType

if TYPE_CHECKING:
    from opsched.frontends.onnx import _OnnxConverter

__all__ = ["Value", "OnnxConverter", "converter_for", "onnx_converter", "supported_onnx_ops"]

Value = Any  # str (a tensor of the graph) or np.ndarray (a constant)
OnnxConverter = Callable[["_OnnxConverter", onnx.NodeProto, list[Value], dict[str, Any]], Value | list[Value]]

_CONVERTERS: dict[str, list[tuple[int, OnnxConverter]]] = {}


def onnx_converter(op_type: str, since: int = 1) -> Callable[[OnnxConverter], OnnxConverter]:
    """Register a converter for ``op_type`` from opset ``since`` on."""
    def deco(fn: OnnxConverter) -> OnnxConverter:
        _CONVERTERS.setdefault(op_type, []).append((since, fn))
        _CONVERTERS[op_type].sort(key=lambda e: e[0])
        return fn
    return deco


def converter_for(op_type: str, opset: int) -> OnnxConverter | None:
    """The converter of ``op_type`` for a model of ``opset``: the latest registered at or before it."""
    best = None
    for since, fn in _CONVERTERS.get(op_type, []):
        if since <= opset:
            best = fn
    return best


def supported_onnx_ops() -> list[str]:
    return sorted(set(_CONVERTERS) | set(FOLDABLE))


# --- converters ---------------------------------------------------------------------------
def _sym_pads(c: _OnnxConverter, x: str, pads: tuple[int, ...]) -> tuple[str, tuple[int, int]]:
    """ONNX 2-D pads are (top, left, bottom, right); asymmetric ones become an explicit pad node."""
    top, left, bottom, right = pads
    if (top, left) == (bottom, right):
        return x, (top, left)
    common = (min(top, bottom), min(left, right))
    extra = (left - common[1], right - common[1], top - common[0], bottom - common[0])
    x = c.ctx.add("pad", [x], name=c.out_name() + "_pad", pads=extra, value=0.0)
    return x, common


def _auto_pads(c: _OnnxConverter, x: str, a: dict[str, Any], kernel: Sequence[int], strides: Sequence[int],
               dilations: Sequence[int]) -> tuple[int, ...]:
    mode = a.get("auto_pad", "NOTSET")
    if mode == "NOTSET":
        return tuple(a.get("pads", (0, 0, 0, 0)))
    if mode == "VALID":
        return (0, 0, 0, 0)
    _, _, h, w = c.ctx.type(x).shape
    pads = []
    for size, k, s, d in zip((h, w), kernel, strides, dilations):
        total = max((-(-size // s) - 1) * s + (k - 1) * d + 1 - size, 0)
        small, large = total // 2, total - total // 2
        pads.append((small, large) if mode == "SAME_UPPER" else (large, small))
    return (pads[0][0], pads[1][0], pads[0][1], pads[1][1])


@onnx_converter("Conv")
def _conv(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    x = c.tensor(ins[0])
    w = ins[1]
    if not isinstance(w, np.ndarray) or w.ndim != 4:
        raise Unsupported("only 2-D convolutions with constant weights")
    strides, dil = tuple(a.get("strides", (1, 1))), tuple(a.get("dilations", (1, 1)))
    x, padding = _sym_pads(c, x, _auto_pads(c, x, a, w.shape[2:], strides, dil))
    params = [c.param(w, n.input[1])]
    if len(ins) > 2 and ins[2] is not None:
        params.append(c.param(ins[2], n.input[2]))
    return c.ctx.add("conv2d", [x], name=c.out_name(), params=params, stride=strides, padding=padding,
                     dilation=dil, groups=int(a.get("group", 1)), act="none")


@onnx_converter("Gemm")
def _gemm(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
        raise Unsupported("only Gemm with transA=0, alpha=beta=1")
    w = ins[1]
    if not isinstance(w, np.ndarray):
        raise Unsupported("Gemm with a non-constant B")
    w = w if a.get("transB", 0) else w.T
    params = [c.param(np.ascontiguousarray(w), n.input[1])]
    if len(ins) > 2 and ins[2] is not None:
        params.append(c.param(np.broadcast_to(ins[2], (w.shape[0],)), n.input[2]))
    return c.ctx.add("linear", [c.tensor(ins[0])], name=c.out_name(), params=params, act="none")


@onnx_converter("MatMul")
def _matmul(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    w = ins[1]
    if not isinstance(w, np.ndarray) or w.ndim != 2:
        raise Unsupported("MatMul with a non-constant or non-2-D right operand")
    return c.ctx.add("linear", [c.tensor(ins[0])], name=c.out_name(),
                     params=[c.param(np.ascontiguousarray(w.T), n.input[1])], act="none")


@onnx_converter("BatchNormalization")
def _batch_norm(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    if a.get("training_mode", 0):  # normalised by the batch's own statistics (weight standardisation)
        raise Unsupported("BatchNormalization in training mode (the batch's statistics, not the running ones)")
    params = [c.param(v, hint) for v, hint in zip(ins[1:5], n.input[1:5])]
    return c.ctx.add("batch_norm", [c.tensor(ins[0])], name=c.out_name(), params=params,
                     eps=float(a.get("epsilon", 1e-5)))


def _unary(op: str) -> OnnxConverter:
    def convert(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
        return c.ctx.add(op, [c.tensor(ins[0])], name=c.out_name())
    return convert


for _t, _op in (("Relu", "relu"), ("Sigmoid", "sigmoid"), ("Tanh", "tanh"), ("Identity", "identity"),
                ("Dropout", "identity")):
    onnx_converter(_t)(_unary(_op))
onnx_converter("HardSwish", 14)(_unary("hardswish"))


@onnx_converter("Gelu", 20)
def _gelu(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    approx = a.get("approximate", "none")
    attrs = {} if approx == "none" else {"approximate": approx}
    return c.ctx.add("gelu", [c.tensor(ins[0])], name=c.out_name(), **attrs)


def _clip(c: _OnnxConverter, x: Value, lo: float | None, hi: float | None) -> str:
    if lo == 0.0 and hi == 6.0:
        return c.ctx.add("relu6", [c.tensor(x)], name=c.out_name())
    if lo == 0.0 and hi is None:
        return c.ctx.add("relu", [c.tensor(x)], name=c.out_name())
    raise Unsupported(f"Clip({lo}, {hi}): only Clip(0, 6) (ReLU6) and Clip(0, inf) (ReLU)")


@onnx_converter("Clip", 6)
def _clip_v6(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    return _clip(c, ins[0], a.get("min"), a.get("max"))


@onnx_converter("Clip", 11)
def _clip_v11(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    def bound(i: int) -> float | None:
        return float(ins[i]) if len(ins) > i and ins[i] is not None else None
    return _clip(c, ins[0], bound(1), bound(2))


@onnx_converter("Add")
@onnx_converter("Sum")
def _add(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    if len(ins) == 1:
        return c.ctx.add("identity", [c.tensor(ins[0])], name=c.out_name())
    return c.ctx.add("add", [c.tensor(v, f"{n.output[0]}_c{i}") for i, v in enumerate(ins)], name=c.out_name())


@onnx_converter("Mul")
def _mul(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    return c.ctx.add("mul", [c.tensor(v, f"{n.output[0]}_c{i}") for i, v in enumerate(ins)], name=c.out_name())


@onnx_converter("Concat")
def _concat(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> Value:
    parts = [v for v in ins if not (isinstance(v, np.ndarray) and v.size == 0)]  # empty pieces add nothing
    if len(parts) == 1:
        return parts[0]
    return c.ctx.add("concat", [c.tensor(v) for v in parts], name=c.out_name(), axis=int(a["axis"]))


def _empty(t: TensorType, axis: int) -> np.ndarray:
    """A piece of a value of type ``t`` empty along ``axis``, as a constant: the IR has no empty
    tensors, and a Concat drops it (the channels a rotary embedding that rotates all of them
    passes through: a Split's or Slice's empty piece)."""
    shape = [0 if k == axis else d for k, d in enumerate(t.shape)]
    return np.zeros(shape, helper.tensor_dtype_to_np_dtype(ONNX_DTYPES[t.dtype]))


def _split(c: _OnnxConverter, n: onnx.NodeProto, x: str, axis: int, sizes: Sequence[int] | None) -> list[Value]:
    t = c.ctx.type(x)
    axis = axis + t.rank if axis < 0 else axis
    dim = t.shape[axis]
    if sizes is None:
        k = len(n.output)
        step = -(-dim // k)
        sizes = [min(step, dim - i * step) for i in range(k)]
    outs: list[Value] = []
    start = 0
    for i, s in enumerate(sizes):
        if int(s) == 0:
            outs.append(_empty(t, axis))
        elif int(s) == dim:  # the whole of x, beside empty pieces
            outs.append(x)
        else:
            outs.append(c.ctx.add("slice", [x], name=c.out_name(i), axis=axis, start=start, end=start + int(s)))
        start += int(s)
    return outs


@onnx_converter("Split", 2)
def _split_v2(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> list[Value]:
    return _split(c, n, c.tensor(ins[0]), int(a.get("axis", 0)), a.get("split"))


@onnx_converter("Split", 13)
def _split_v13(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> list[Value]:
    sizes = optional_ints(ins, 1)
    return _split(c, n, c.tensor(ins[0]), int(a.get("axis", 0)), sizes)


def _slice(c: _OnnxConverter, x: str, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None,
           steps: Sequence[int] | None) -> Value:
    """``x`` sliced; an empty slice is an empty constant (:func:`_empty`)."""
    rank = c.ctx.type(x).rank
    axes = axes if axes is not None else range(len(starts))
    steps = steps if steps is not None else [1] * len(starts)
    out = x
    for i, (s, e, ax, st) in enumerate(zip(starts, ends, axes, steps)):
        if st <= 0:
            raise Unsupported("negative slice steps")
        ax = ax + rank if ax < 0 else ax
        dim = c.ctx.type(out).shape[ax]
        if not range(*slice(s, e, st).indices(dim)):
            return _empty(c.ctx.type(out), ax)
        end = None if e >= dim else e
        if s == 0 and end is None and st == 1:
            continue
        out = c.ctx.add("slice", [out], name=c.out_name() + (f"_{i}" if i else ""), axis=ax, start=s, end=end, step=st)
    return out if out != x else c.ctx.add("identity", [x], name=c.out_name())


@onnx_converter("Slice", 1)
def _slice_v1(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> Value:
    return _slice(c, c.tensor(ins[0]), a["starts"], a["ends"], a.get("axes"), None)


@onnx_converter("Slice", 10)
def _slice_v10(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> Value:
    return _slice(c, c.tensor(ins[0]), as_ints(ins[1]), as_ints(ins[2]), optional_ints(ins, 3), optional_ints(ins, 4))


def _pool(op: str) -> OnnxConverter:
    def convert(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
        x = c.tensor(ins[0])
        kernel = tuple(a["kernel_shape"])
        strides, dil = tuple(a.get("strides", (1, 1))), tuple(a.get("dilations", (1, 1)))
        if len(kernel) != 2:
            raise Unsupported("only 2-D pooling")
        pads = _auto_pads(c, x, a, kernel, strides, dil)
        sizes = c.ctx.type(x).shape[2:]
        if any(n + pads[i] + pads[i + 2] < d * (k - 1) + 1 for i, (n, k, d) in enumerate(zip(sizes, kernel, dil))):
            # a window larger than its padded input (an exporter's kernel from a wrong shape
            # inference): ONNX Runtime clips it and makes one output, which PyTorch refuses
            raise Unsupported("a window larger than its padded input")
        extra: dict[str, Any] = {"ceil_mode": bool(a.get("ceil_mode", 0))}
        if op == "max_pool2d":
            if len(n.output) > 1 and n.output[1]:
                raise Unsupported("MaxPool with an indices output")
            if pads[:2] != pads[2:]:
                raise Unsupported("asymmetric max-pool padding")
            extra["dilation"] = dil
        else:
            if dil != (1, 1) or pads[:2] != pads[2:]:
                raise Unsupported("dilated or asymmetric average pooling")
            extra["count_include_pad"] = bool(a.get("count_include_pad", 0))
        return c.ctx.add(op, [x], name=c.out_name(), kernel=kernel, stride=strides, padding=pads[:2], **extra)
    return convert


onnx_converter("MaxPool")(_pool("max_pool2d"))
onnx_converter("AveragePool")(_pool("avg_pool2d"))


@onnx_converter("GlobalAveragePool")
def _global_avg(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    x = c.tensor(ins[0])
    if len(c.ctx.type(x).shape) != 4:
        raise Unsupported("only 2-D global pooling")
    return c.ctx.add("adaptive_avg_pool2d", [x], name=c.out_name(), output_size=(1, 1))


@onnx_converter("Flatten")
def _flatten(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    x = c.tensor(ins[0])
    shape = c.ctx.type(x).shape
    axis = int(a.get("axis", 1))
    axis = axis + len(shape) if axis < 0 else axis
    lead = int(np.prod(shape[:axis], dtype=np.int64))
    return c.ctx.add("reshape", [x], name=c.out_name(), shape=(lead, -1))


@onnx_converter("Reshape", 5)
def _reshape(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    x = c.tensor(ins[0])
    if not isinstance(ins[1], np.ndarray):
        raise Unsupported("Reshape to a shape computed at run time")
    shape = reshape_dims(c.ctx.type(x).shape, ins[1], a)
    return c.ctx.add("reshape", [x], name=c.out_name(), shape=shape)


@onnx_converter("Softmax", 1)
def _softmax_v1(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    x = c.tensor(ins[0])
    rank = c.ctx.type(x).rank
    axis = int(a.get("axis", 1))
    if axis % rank != rank - 1:
        raise Unsupported("Softmax before opset 13 on an axis other than the last")
    return c.ctx.add("softmax", [x], name=c.out_name(), axis=-1)


@onnx_converter("Softmax", 13)
def _softmax_v13(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    return c.ctx.add("softmax", [c.tensor(ins[0])], name=c.out_name(), axis=int(a.get("axis", -1)))


@onnx_converter("Pad", 11)
def _pad(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    if a.get("mode", "constant") != "constant" or not isinstance(ins[1], np.ndarray):
        raise Unsupported("only constant-mode Pad with constant pads")
    if len(ins) > 3 and ins[3] is not None:
        raise Unsupported("Pad with an axes input")
    x = c.tensor(ins[0])
    pads = as_ints(ins[1])
    rank = len(pads) // 2
    torch_pads: list[int] = []
    for d in range(rank - 1, -1, -1):  # torch order: last dimension first, (before, after)
        torch_pads += [pads[d], pads[d + rank]]
    value = float(ins[2]) if len(ins) > 2 and ins[2] is not None and np.asarray(ins[2]).size else 0.0
    return c.ctx.add("pad", [x], name=c.out_name(), pads=tuple(torch_pads), value=value)


def _reduce_mean(c: _OnnxConverter, x: str, axes: Sequence[int] | None, keep: bool) -> str:
    if axes is None:
        axes = tuple(range(c.ctx.type(x).rank))
    return c.ctx.add("mean", [x], name=c.out_name(), dims=tuple(axes), keepdim=keep)


@onnx_converter("ReduceMean", 1)
def _reduce_mean_v1(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    return _reduce_mean(c, c.tensor(ins[0]), a.get("axes"), bool(a.get("keepdims", 1)))


@onnx_converter("ReduceMean", 18)
def _reduce_mean_v18(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    axes = optional_ints(ins, 1)
    return _reduce_mean(c, c.tensor(ins[0]), axes, bool(a.get("keepdims", 1)))

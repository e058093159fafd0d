"""Constant folding at ONNX import: a NumPy rule per op type, for the shape arithmetic exporters
emit around reshapes (Shape, Gather, Concat, Range, ...), evaluated when every input is a constant.

Each rule gives what ONNX defines, in ONNX's types (``tests/test_frontends.py`` holds each to
``onnx.reference``): a float32 ``Range`` stays float32, an integer ``Div`` rounds toward zero, a 0
in a ``Reshape``'s shape keeps the input's size. An op without a rule is folded by ONNX's
reference implementation (:meth:`opsched.frontends.onnx._OnnxConverter._fold`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from onnx import helper, numpy_helper

from opsched.frontends._common import Unsupported

if TYPE_CHECKING:
    from opsched.frontends.onnx import _OnnxConverter

__all__ = ["FOLDABLE", "as_ints", "optional_ints", "reshape_dims"]

#: Ops evaluated with NumPy when every input is a constant.
FOLDABLE: dict[str, Callable[..., np.ndarray]] = {}


def _fold(op_type: str) -> Callable[[Callable[..., np.ndarray]], Callable[..., np.ndarray]]:
    def deco(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        FOLDABLE[op_type] = fn
        return fn
    return deco


def as_ints(v: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in np.asarray(v).reshape(-1))


def optional_ints(ins: list[Any], i: int) -> tuple[int, ...] | None:
    """Input ``i`` as ints, or None where it is absent (optional ONNX inputs)."""
    return as_ints(ins[i]) if len(ins) > i and ins[i] is not None else None


@_fold("Constant")
def _f_constant(c: _OnnxConverter, ins: list[Any], a: dict[str, Any]) -> np.ndarray:
    if "value" in a:
        return numpy_helper.to_array(a["value"])
    for key in ("value_float", "value_int"):
        if key in a:
            return np.array(a[key])
    for key in ("value_floats", "value_ints"):
        if key in a:
            return np.array(list(a[key]))
    raise Unsupported("Constant without a tensor or numeric value")


_fold("Gather")(lambda c, ins, a: np.take(ins[0], ins[1], axis=a.get("axis", 0)))
_fold("Cast")(lambda c, ins, a: ins[0].astype(helper.tensor_dtype_to_np_dtype(a["to"])))
_fold("Concat")(lambda c, ins, a: np.concatenate([np.atleast_1d(i) for i in ins], axis=a["axis"]))


@_fold("Div")
def _f_div(c: _OnnxConverter, ins: list[Any], a: dict[str, Any]) -> np.ndarray:
    x, y = ins
    if x.dtype.kind not in "iu":
        return np.asarray(x / y, dtype=x.dtype)
    # ONNX divides integers as C does, rounding toward zero; NumPy's // rounds toward -infinity
    q = x // y
    return np.asarray(q + ((q < 0) & (q * y != x)), dtype=x.dtype)


_fold("Sub")(lambda c, ins, a: ins[0] - ins[1])
_fold("Floor")(lambda c, ins, a: np.floor(ins[0]))


@_fold("Range")
def _f_range(c: _OnnxConverter, ins: list[Any], a: dict[str, Any]) -> np.ndarray:
    # in the inputs' type (np.arange of 0-d arrays makes float64 or int64 whatever they are): YOLOv8's
    # anchor grid, folded once its input size is fixed, is float32 and must stay so
    start, limit, delta = (np.asarray(v).reshape(()) for v in ins)
    count = max(int(np.ceil((float(limit) - float(start)) / float(delta))), 0)
    return np.asarray(start + np.arange(count, dtype=start.dtype) * delta, dtype=start.dtype)


_fold("ConstantOfShape")(lambda c, ins, a: np.full(as_ints(ins[0]), numpy_helper.to_array(a["value"])[0]
                                                   if "value" in a else 0.0, dtype=np.float32 if "value" not in a
                                                   else numpy_helper.to_array(a["value"]).dtype))


_fold("Add")(lambda c, ins, a: ins[0] + ins[1])
_fold("Mul")(lambda c, ins, a: ins[0] * ins[1])
_fold("Transpose")(lambda c, ins, a: np.transpose(ins[0], a.get("perm")))


@_fold("Reshape")
def _f_reshape(c: _OnnxConverter, ins: list[Any], a: dict[str, Any]) -> np.ndarray:
    return np.asarray(ins[0].reshape(reshape_dims(ins[0].shape, ins[1], a)))


def reshape_dims(source: Sequence[int], shape: Any, a: dict[str, Any]) -> tuple[int, ...]:
    """A Reshape's target ``shape`` of an input of shape ``source``: a 0 keeps the input's size
    there (unless ``allowzero``), a -1 is left to be inferred."""
    dims = as_ints(shape)
    return dims if a.get("allowzero", 0) else tuple(source[i] if d == 0 else d for i, d in enumerate(dims))


@_fold("Slice")
def _f_slice(c: _OnnxConverter, ins: list[Any], a: dict[str, Any]) -> np.ndarray:
    if "starts" in a:  # opset < 10
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        starts, ends, axes, steps = as_ints(ins[1]), as_ints(ins[2]), optional_ints(ins, 3), optional_ints(ins, 4)
    index = [slice(None)] * ins[0].ndim
    for i, (s, e) in enumerate(zip(starts, ends)):
        ax = axes[i] if axes is not None else i
        index[ax] = slice(s, e, steps[i] if steps is not None else 1)
    return np.asarray(ins[0][tuple(index)])


@_fold("Unsqueeze")
def _f_unsqueeze(c: _OnnxConverter, ins: list[Any], a: dict[str, Any]) -> np.ndarray:
    axes = optional_ints(ins, 1)
    axes = tuple(a["axes"]) if axes is None else axes
    out = ins[0]
    for ax in sorted(x + out.ndim + len(axes) if x < 0 else x for x in axes):
        out = np.expand_dims(out, ax)
    return np.asarray(out)


@_fold("Squeeze")
def _f_squeeze(c: _OnnxConverter, ins: list[Any], a: dict[str, Any]) -> np.ndarray:
    axes = optional_ints(ins, 1)
    axes = tuple(a.get("axes", ())) if axes is None else axes
    return np.asarray(np.squeeze(ins[0], axis=axes or None))

"""What several op families share: window arithmetic, broadcasting, simple FLOP rules."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from opsched.errors import ShapeMismatchError
from opsched.ir.schema import FlopRule
from opsched.ir.types import FrozenAttrs, TensorType

__all__ = ["fail", "pair", "window", "broadcast", "promoted", "axis_of", "same", "per_element", "zero_flops",
           "reduce_flops"]


def fail(op: str, why: str) -> ShapeMismatchError:
    return ShapeMismatchError(f"{op}: {why}")


def pair(value: int | Sequence[int]) -> tuple[int, int]:
    if isinstance(value, int):
        return (value, value)
    a, b = value
    return (int(a), int(b))


def window(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """Output length of a sliding window (convolution, pooling) along one axis."""
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil else span // s) + 1
    if ceil and (out - 1) * s >= size + p:  # the last window must start inside the input
        out -= 1
    return out


def broadcast(op: str, types: Sequence[TensorType]) -> TensorType:
    rank = max(t.rank for t in types)
    dims = []
    for i in range(rank):
        sizes = {t.shape[i - rank + t.rank] for t in types if i - rank + t.rank >= 0} - {1}
        if len(sizes) > 1:
            raise fail(op, f"cannot broadcast shapes {[t.shape for t in types]}")
        dims.append(sizes.pop() if sizes else 1)
    return TensorType(tuple(dims), promoted(types))


def promoted(types: Sequence[TensorType]) -> str:
    """The dtype torch computes ``types`` in, as arithmetic on them: ``bool * float32`` is
    float32, and a 0-d tensor (a scalar) takes part only where its kind (bool, integer, float)
    is higher than every other's (``float16 * float32 scalar`` is float16)."""
    if len({t.dtype for t in types}) == 1:
        return types[0].dtype
    result = torch.empty(types[0].shape, dtype=getattr(torch, types[0].dtype), device="meta")
    for t in types[1:]:
        dtype = torch.result_type(result, torch.empty(t.shape, dtype=getattr(torch, t.dtype), device="meta"))
        result = torch.empty(result.shape if result.dim() else t.shape, dtype=dtype, device="meta")
    return str(result.dtype).removeprefix("torch.")


def axis_of(axis: int, rank: int) -> int:
    return axis + rank if axis < 0 else axis


def same(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    """The shape rule of ops whose output is typed like their first input."""
    return inputs[0]


def per_element(cost: int) -> FlopRule:
    """``cost`` FLOPs per output element (and per extra input, for n-ary ops)."""
    def flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType],
              out: TensorType) -> int:
        return cost * out.numel * max(1, len(inputs) - 1)
    return flops


def zero_flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType],
               out: TensorType) -> int:
    return 0


def reduce_flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType],
                 out: TensorType) -> int:
    return inputs[0].numel

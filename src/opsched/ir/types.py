"""Tensor types and frozen attribute maps: the leaf records of the IR."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from math import prod
from typing import Any

__all__ = ["TensorType", "FrozenAttrs", "DTYPE_BYTES", "COMPLEX_PARTS"]

#: Bytes per element of each dtype name the IR knows. Complex values are held (FNet's Fourier
#: mixing, rotary embeddings written as complex products): ONNX Runtime's kernels take none, so
#: a segment holds one only as its pairs of parts, in the few ops that have a form on them
#: (:mod:`opsched.ir.ops.fourier`); the rest run on torch kernels.
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float16": 2,
    "bfloat16": 2,
    "float64": 8,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "complex64": 8,
    "complex128": 16,
}

#: Each complex dtype and the dtype of its parts.
COMPLEX_PARTS: dict[str, str] = {"complex64": "float32", "complex128": "float64"}


@dataclass(frozen=True, slots=True)
class TensorType:
    """Static shape (batch dimension included) and dtype name of one tensor value."""

    shape: tuple[int, ...]
    dtype: str = "float32"

    def __post_init__(self) -> None:
        if self.dtype not in DTYPE_BYTES:
            raise ValueError(f"unknown dtype {self.dtype!r}; expected one of {sorted(DTYPE_BYTES)}")
        if any(not isinstance(d, int) or d < 0 for d in self.shape):
            raise ValueError(f"shape must be non-negative ints, got {self.shape}")

    @property
    def numel(self) -> int:
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __str__(self) -> str:
        short = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "complex64": "c64",
                 "complex128": "c128"}
        return f"{short.get(self.dtype, self.dtype)}[{','.join(map(str, self.shape))}]"


class FrozenAttrs(Mapping[str, Any]):
    """An immutable, hashable, picklable mapping of attribute names to scalars and tuples."""

    __slots__ = ("_items", "_hash")

    def __init__(self, items: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        merged = dict(items or {}, **kwargs)
        for key, value in merged.items():
            merged[key] = _freeze(value, key)
        self._items: dict[str, Any] = dict(sorted(merged.items()))
        self._hash: int | None = None

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(tuple(self._items.items()))
        return self._hash

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenAttrs):
            return self._items == other._items
        if isinstance(other, Mapping):
            return self._items == dict(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"FrozenAttrs({self._items!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenAttrs, (self._items,))

    def replace(self, **changes: Any) -> FrozenAttrs:
        return FrozenAttrs(self._items, **changes)


def _freeze(value: Any, key: str) -> Any:
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v, key) for v in value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"attribute {key!r} must be a scalar or a tuple of scalars, got {type(value).__name__}")

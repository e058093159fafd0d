"""The op schema registry: for each op kind, its shape rule, FLOPs, bytes moved and category.

An op kind is a plain string (``"conv2d"``); its :class:`OpSchema` is found with
:func:`op_schema`. The verifier, cost models and schedulers consult this one table. The schemas
themselves are registered by the op families in :mod:`opsched.ir.ops` (each family keeps its
schema beside its kernels and its ONNX export); importing :mod:`opsched` registers them all.

Conventions: tensors are NCHW; ``out`` includes the batch dimension; FLOPs count a
multiply-accumulate as two operations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opsched.errors import ShapeMismatchError, UnknownOpError
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    from opsched.ir.node import Node

__all__ = [
    "OpSchema", "CATEGORIES", "ShapeRule", "FlopRule", "register_op", "op_schema", "registered_ops", "infer_type",
    "node_flops", "node_bytes",
]

#: What an op mostly does; cost models, pictures and schedulers group by it.
CATEGORIES: tuple[str, ...] = (
    "conv", "gemm", "norm", "activation", "elementwise", "pool", "reduce", "data", "view",
    "const", "opaque",
)

ShapeRule = Callable[[Sequence[TensorType], FrozenAttrs, Sequence[TensorType]], TensorType]
FlopRule = Callable[[Sequence[TensorType], FrozenAttrs, Sequence[TensorType], TensorType], int]


@dataclass(frozen=True, slots=True)
class OpSchema:
    """What the IR knows about one op kind.

    ``infer`` maps (input types, attrs, parameter types) to the output type, raising
    :class:`ShapeMismatchError` when the inputs do not fit; ``None`` means the op carries its
    output type itself (opaque calls). ``is_view`` ops move no bytes (they alias their input).
    ``positions``, for a view, maps its attrs to those without what only says *where* in its
    input it reads (a select's index, a slice's start and end: its extent is in its output
    type), which its cost does not depend on (:func:`opsched.ir.hashing.cost_signature`); not a
    transpose's dimensions or a slice's step, which set the strides its readers pay for.
    """

    name: str
    category: str
    arity: tuple[int, int | None]
    infer: ShapeRule | None
    flops: FlopRule
    is_view: bool = False
    positions: Callable[[FrozenAttrs], FrozenAttrs] | None = None


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

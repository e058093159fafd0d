"""Whether a generic ONNX node of a newer ``ai.onnx`` opset means the same at the opset segments
are exported at (:data:`~opsched.ir.ops.onnx_builder.OPSET`), so that it can join a segment.

Files exported by recent PyTorch declare opset 18 or later, and the version converter cannot bring
most of them down (it has no down-adapter for ``ReduceMean``'s axes input). Their generic nodes
would then each run in a one-node session of their own, cutting ONNX Runtime's segments at
every ``MatMul`` and ``Transpose``. Most such nodes are of ops whose definition did not change
after the segments' opset, or changed only by admitting more element types. A node joins a
segment where, going by ``onnx.defs``:

- its op's schema in force at the node's opset is the one in force at the segments' opset; or
- the node fits the older schema: every attribute it sets exists there, its input and output
  counts are within the older bounds, and its element types are among those the older schema
  admits; the node's opset is one whose changes are known here (up to :data:`CHECKED_THROUGH`),
  and it uses none of the attribute values the newer versions added (:data:`_ADDED_VALUES`),
  nor is its op one whose meaning moved in a way no signature shows (:data:`_MOVED`).

Custom domains are never re-declared: their nodes keep one-node sessions.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import onnx
import onnx.defs

from opsched.ir.types import TensorType

__all__ = ["CHECKED_THROUGH", "refusal_at"]

#: The newest opset whose changes (against opset 17) were read for this module.
CHECKED_THROUGH = 22

#: Attribute values that later versions gave meaning to, under unchanged attribute names.
_ADDED_VALUES: dict[str, dict[str, frozenset[bytes]]] = {
    "Resize": {"coordinate_transformation_mode": frozenset({b"half_pixel_symmetric"})},  # 19
    "ScatterElements": {"reduction": frozenset({b"max", b"min"})},  # 18
    "ScatterND": {"reduction": frozenset({b"max", b"min"})},  # 18
    "Pad": {"mode": frozenset({b"wrap"})},  # 19
    "GridSample": {"mode": frozenset({b"linear", b"cubic"})},  # 20 renamed bilinear and bicubic
}

#: Ops whose later versions mean something else with the same inputs and attributes: DFT 20
#: takes its axis as an input, defaulting to -2, where 17's attribute defaults to 1.
_MOVED = frozenset({"DFT"})


def refusal_at(opset: int, op_type: str, node_opset: int, attributes: Sequence[onnx.AttributeProto],
               n_inputs: int, n_outputs: int, input_types: Sequence[TensorType | None],
               output_type: TensorType | None, output_index: int) -> str | None:
    """Why a node of ``op_type`` at ``node_opset`` cannot be declared at ``opset``, or ``None``
    where it means the same there. ``input_types``: per ONNX input, its type (``None`` for an
    optional input left out)."""
    if node_opset == opset:
        return None
    try:
        old = onnx.defs.get_schema(op_type, opset)
        new = onnx.defs.get_schema(op_type, node_opset)
    except onnx.defs.SchemaError:
        return f"{op_type} has no ai.onnx schema at opset {opset}"
    if old.since_version == new.since_version:
        return None
    if node_opset < opset:
        return f"{op_type} of opset {node_opset} changed by opset {opset} (version {old.since_version})"
    where = f"{op_type} changed after opset {opset} (version {new.since_version})"
    if node_opset > CHECKED_THROUGH or op_type in _MOVED:
        return where
    known = {a.name for a in attributes}
    if extra := sorted(known - set(old.attributes)):
        return f"{where}: attribute {extra[0]!r} is newer"
    for a in attributes:
        added = _ADDED_VALUES.get(op_type, {}).get(a.name, frozenset())
        if a.type == onnx.AttributeProto.STRING and a.s in added:
            return f"{where}: {a.name}={a.s.decode()!r} is newer"
    if not old.min_input <= n_inputs <= old.max_input or not old.min_output <= n_outputs <= old.max_output:
        return f"{where}: {n_inputs} inputs and {n_outputs} outputs do not fit version {old.since_version}"
    allowed = _allowed(op_type, opset)
    for k, t in enumerate(input_types):
        if t is not None and _type_string(t) not in allowed[0][min(k, len(allowed[0]) - 1)]:
            return f"{where}: input {k} of type {t.dtype} is newer"
    if output_type is not None and _type_string(output_type) not in allowed[1][min(output_index, len(allowed[1]) - 1)]:
        return f"{where}: output of type {output_type.dtype} is newer"
    return None


@functools.cache
def _allowed(op_type: str, opset: int) -> tuple[tuple[frozenset[str], ...], tuple[frozenset[str], ...]]:
    """Per formal input and output of the schema in force at ``opset``: the type strings it admits."""
    schema = onnx.defs.get_schema(op_type, opset)
    constraints = {c.type_param_str: frozenset(c.allowed_type_strs) for c in schema.type_constraints}

    def types(formals: Sequence[onnx.defs.OpSchema.FormalParameter]) -> tuple[frozenset[str], ...]:
        return tuple(constraints.get(f.type_str, frozenset({f.type_str})) for f in formals) or (frozenset(),)
    return types(schema.inputs), types(schema.outputs)


def _type_string(t: TensorType) -> str:
    from opsched.ir.ops.onnx_builder import ONNX_DTYPES

    code = ONNX_DTYPES.get(t.dtype)
    return f"tensor({onnx.TensorProto.DataType.Name(code).lower()})" if code is not None else t.dtype

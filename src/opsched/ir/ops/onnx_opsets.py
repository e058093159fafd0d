"""Whether a generic ONNX node of a newer ``ai.onnx`` opset means the same at the opset segments
are exported at (:data:`~opsched.ir.ops.onnx_builder.OPSET`), so that it can join a segment.

A file newer than that opset (21 and up, as newer exporters and ONNX's own tools write them)
mostly cannot be converted down by the version converter, which lacks most down-adapters. Its
generic nodes would then each run in a one-node session of their own, cutting ONNX Runtime's
segments at every ``MatMul`` and ``Transpose``. Most such nodes are of ops whose definition did
not change after the segments' opset, or changed only by admitting more element types. A node
joins a segment where, going by ``onnx.defs``:

- its op's schema in force at the node's opset is the one in force at the segments' opset; or
- the node fits the older schema once restated there: attributes the newer versions added are
  dropped where the node leaves them at their default (Resize's ``antialias=0``), an input that
  was an attribute before (the Reduce ops' ``axes`` from opset 18) becomes that attribute again
  where it is a constant; then its input and output counts are within the older bounds, and its
  element types are among those the older schema admits; the node's opset is one whose changes
  are known here (up to :data:`CHECKED_THROUGH`), and it uses none of the attribute values the
  newer versions added (:data:`_ADDED_VALUES`), nor is its op one whose meaning moved in a way no
  signature shows (:data:`_MOVED`).

Nodes of other operator sets (``com.microsoft``, as ONNX Runtime's transformer optimizer writes
them) are not restated: a segment imports their set at the file's version
(:meth:`~opsched.ir.ops.onnx_builder.OnnxBuilder.declare`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
import onnx.defs
from onnx import helper, numpy_helper

from opsched.ir.ops.registry import NotExportable
from opsched.ir.types import TensorType

__all__ = ["CHECKED_THROUGH", "OLDEST", "Declaration", "declaration_at", "declared_oldest", "lacks"]

#: The newest opset whose changes were read for this module (from ONNX's changelog and release
#: notes, with the schemas' signatures compared version by version through ``onnx.defs``).
CHECKED_THROUGH = 23

#: The opset a segment is declared at where each of its nodes means the same there: ONNX Runtime's
#: kernels for some ops' newer versions are slower (its CPU AveragePool-19, which added
#: ``dilations``, runs a generic loop instead of MLAS, on a tensor whose channels miss the blocked
#: layout: ``benchmarks/onnx_forms.py``; NASNet-A mobile's plans paid it, ``benchmarks/cpu.py``).
#: 18 keeps what segments were moved to newer opsets for (Col2Im, GroupNormalization 18, the
#: Reduce ops' ``axes`` inputs); a segment with a node only 19 or 20 has (Gelu) stays at its opset.
OLDEST = 18

#: Attribute values that a later version gave meaning to, under unchanged attribute names, with
#: that version: a node using one cannot be declared at an older version.
_ADDED_VALUES: dict[str, dict[str, dict[bytes, int]]] = {
    "Resize": {"coordinate_transformation_mode": {b"half_pixel_symmetric": 19}},
    "ScatterElements": {"reduction": {b"max": 18, b"min": 18}},
    "ScatterND": {"reduction": {b"max": 18, b"min": 18}},
    "Pad": {"mode": {b"wrap": 19}},
    "GridSample": {"mode": {b"linear": 20, b"cubic": 20}},  # renamed bilinear and bicubic
}

#: Ops whose meaning moved at the version given, in a way their signatures do not show: DFT 20
#: takes its axis as an input, defaulting to -2, where 17's attribute defaults to 1;
#: GroupNormalization 21 takes a scale and bias per channel, where 18's are per group (its only
#: new attribute, ``stash_type``, has a default that the restatement would drop).
_MOVED: dict[str, int] = {"DFT": 20, "GroupNormalization": 21}


@dataclass(frozen=True)
class Declaration:
    """A node as declared at the segments' opset: its attributes, and which of its inputs it keeps
    (by position)."""

    attributes: tuple[onnx.AttributeProto, ...]
    inputs: tuple[int, ...]


def declaration_at(opset: int, op_type: str, node_opset: int, attributes: Sequence[onnx.AttributeProto],
                   input_types: Sequence[TensorType | None], constants: Mapping[int, np.ndarray],
                   n_outputs: int, output_type: TensorType | None, output_index: int) -> Declaration:
    """How a node of ``op_type`` at ``node_opset`` is declared at ``opset`` to mean the same, or
    :class:`NotExportable` saying why it cannot be. ``input_types``: per ONNX input, its type
    (``None`` for an optional input left out); ``constants``: the values of those inputs that are
    constants (an ``axes`` input that became an attribute again is read from there)."""
    as_is = Declaration(tuple(attributes), tuple(range(len(input_types))))
    if node_opset == opset:
        return as_is
    try:
        old = onnx.defs.get_schema(op_type, opset)
        new = onnx.defs.get_schema(op_type, node_opset)
    except onnx.defs.SchemaError:
        raise NotExportable(f"{op_type} has no ai.onnx schema at opset {opset}") from None
    if old.since_version == new.since_version:
        return as_is
    if node_opset < opset:
        raise NotExportable(f"{op_type} of opset {node_opset} changed by opset {opset} (version {old.since_version})")
    where = f"{op_type} changed after opset {opset} (version {new.since_version})"
    if node_opset > CHECKED_THROUGH or lacks(opset, op_type, node_opset):
        raise NotExportable(where)
    declared = _restated(old, new, where, attributes, input_types, constants)
    _check_fits(old, _allowed(op_type, opset), where, declared, input_types, n_outputs, output_type, output_index)
    return declared


def lacks(opset: int, op_type: str, node_opset: int) -> bool:
    """Whether ``opset`` has nothing that means what ``op_type`` means at ``node_opset``: the op
    is newer, or its meaning moved in between (:data:`_MOVED`). False for an op ``onnx.defs``
    does not know at ``node_opset``."""
    try:
        new = onnx.defs.get_schema(op_type, node_opset)
    except onnx.defs.SchemaError:
        return False
    try:
        old = onnx.defs.get_schema(op_type, opset)
    except onnx.defs.SchemaError:
        return True
    return bool(old.since_version < _MOVED.get(op_type, 0) <= new.since_version)


def _restated(old: onnx.defs.OpSchema, new: onnx.defs.OpSchema, where: str,
              attributes: Sequence[onnx.AttributeProto], input_types: Sequence[TensorType | None],
              constants: Mapping[int, np.ndarray]) -> Declaration:
    """The node in the older schema's terms: newer attributes at their default dropped, inputs
    that were attributes made attributes again; :class:`NotExportable` where that cannot be."""
    declared = [a for a in attributes if a.name in old.attributes]
    for a in attributes:
        if a.name in old.attributes:
            continue
        default = new.attributes[a.name].default_value if a.name in new.attributes else None
        if default is None or default.type == onnx.AttributeProto.UNDEFINED or \
                helper.get_attribute_value(a) != helper.get_attribute_value(default):
            raise NotExportable(f"{where}: attribute {a.name!r} is newer")  # set to what the old op cannot do
    kept = list(range(len(input_types)))
    for name in _inputs_now_attributes(old, new):  # e.g. the Reduce ops' axes, an input from 18
        k = next(i for i, f in enumerate(new.inputs) if f.name == name)
        if k >= len(input_types) or input_types[k] is None:
            continue
        if k != len(input_types) - 1 or k not in constants:
            raise NotExportable(f"{where}: input {name!r} is {'computed' if k not in constants else 'not last'}; "
                                f"version {old.since_version} takes it as an attribute")
        declared.append(helper.make_attribute(name, [int(v) for v in np.asarray(constants[k]).reshape(-1)]))
        kept.remove(k)
    for a in declared:
        added = _ADDED_VALUES.get(old.name, {}).get(a.name, {})
        if a.type == onnx.AttributeProto.STRING and added.get(a.s, 0) > old.since_version:
            raise NotExportable(f"{where}: {a.name}={a.s.decode()!r} is newer")
    return Declaration(tuple(declared), tuple(kept))


def _check_fits(old: onnx.defs.OpSchema, allowed: tuple[tuple[frozenset[str], ...], tuple[frozenset[str], ...]],
                where: str, declared: Declaration, input_types: Sequence[TensorType | None], n_outputs: int,
                output_type: TensorType | None, output_index: int) -> None:
    """:class:`NotExportable` unless the restated node's arity and element types fit ``old``."""
    n_inputs = len(declared.inputs)
    if not old.min_input <= n_inputs <= old.max_input or not old.min_output <= n_outputs <= old.max_output:
        raise NotExportable(f"{where}: {n_inputs} inputs and {n_outputs} outputs do not fit version "
                            f"{old.since_version}")
    for k in declared.inputs:
        t = input_types[k]
        if t is not None and _type_string(t) not in allowed[0][min(k, len(allowed[0]) - 1)]:
            raise NotExportable(f"{where}: input {k} of type {t.dtype} is newer")
    if output_type is not None and _type_string(output_type) not in allowed[1][min(output_index, len(allowed[1]) - 1)]:
        raise NotExportable(f"{where}: output of type {output_type.dtype} is newer")


def _inputs_now_attributes(old: onnx.defs.OpSchema, new: onnx.defs.OpSchema) -> list[str]:
    """Inputs of the newer schema that the older one took as attributes of the same name."""
    return [f.name for f in new.inputs if f.name in old.attributes and f.name not in new.attributes]


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


def declared_oldest(model: onnx.ModelProto, opset: int, oldest: int = OLDEST) -> onnx.ModelProto:
    """``model``, written at ai.onnx ``opset``, declared at ``oldest`` where every node means the
    same there (as :func:`declaration_at` restates a node, its element types found by ONNX's shape
    inference); else ``model`` itself. Nodes with sub-graphs keep a segment at ``opset`` (their
    inner nodes would move with it), and so does any value whose type inference leaves unknown."""
    from opsched.ir.ops.onnx_node import subgraphs

    nodes = model.graph.node
    if any(subgraphs(n) for n in nodes):
        return model
    newer = []
    for n in nodes:
        if n.domain not in ("", "ai.onnx"):
            continue
        try:
            since = onnx.defs.get_schema(n.op_type, opset).since_version
        except onnx.defs.SchemaError:
            return model
        if since > oldest:
            newer.append(n)
    if newer:
        types = _value_types(model)
        small = {t.name: t for t in model.graph.initializer if int(np.prod(t.dims)) <= 64}
        declared = []
        for n in newer:
            ins = [types.get(v) if v else None for v in n.input]
            out = types.get(n.output[0]) if n.output and n.output[0] else None
            if any(v and t is None for v, t in zip(n.input, ins)) or out is None:
                return model
            constants = {j: numpy_helper.to_array(small[v]) for j, v in enumerate(n.input) if v in small}
            try:
                declared.append(declaration_at(oldest, n.op_type, opset, n.attribute, ins, constants, len(n.output),
                                               out, 0))
            except NotExportable:
                return model
        for n, d in zip(newer, declared):
            kept = [n.input[j] for j in d.inputs]
            del n.input[:], n.attribute[:]
            n.input.extend(kept)
            n.attribute.extend(d.attributes)
    opsets = [helper.make_opsetid("", oldest) if o.domain in ("", "ai.onnx") else o for o in model.opset_import]
    del model.opset_import[:]
    model.opset_import.extend(opsets)
    model.ir_version = helper.find_min_ir_version_for(opsets, True)
    return model


def _value_types(model: onnx.ModelProto) -> dict[str, TensorType]:
    """Every value's element type (shapes left out), by ONNX's shape inference over the graph
    without its weights' contents (their types are all it needs)."""
    from opsched.ir.ops.onnx_builder import ONNX_DTYPES

    names = {code: name for name, code in ONNX_DTYPES.items()}
    g = model.graph
    weights = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.initializer]
    light = helper.make_model(helper.make_graph(g.node, g.name, [*g.input, *weights], g.output),
                              opset_imports=model.opset_import, ir_version=model.ir_version)
    inferred = onnx.shape_inference.infer_shapes(light).graph
    out = {}
    for v in (*inferred.input, *inferred.value_info, *inferred.output):
        code = v.type.tensor_type.elem_type if v.type.HasField("tensor_type") else 0
        if code in names:
            out[v.name] = TensorType((), names[code])
    return out

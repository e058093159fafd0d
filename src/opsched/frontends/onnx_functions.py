"""Nodes of ops that the segments' opset lacks, replaced by the ONNX functions that define them.

ONNX defines many of its newer ops as functions of older ones (``onnx.defs``: a function body, or
one made for the node's attributes and input types). A file of opset 23 as ``torch.onnx`` writes
it has ``Attention`` and ``RMSNormalization`` nodes, which do not exist at the segments' opset
(:data:`~opsched.ir.ops.onnx_builder.OPSET`); the version converter then cannot bring the file
down, and each such node would run in an ONNX Runtime session of its own (a decoder's export: 8
sessions). :func:`expand_functions` puts each in its function body instead, in the ops the
segments have, so that the converter can bring the file down and the body joins the segments;
it is what ONNX Runtime itself does with a function op it has no kernel for.

A node is expanded only where its op does not exist at the segments' opset, or means something
else there (:func:`~opsched.ir.ops.onnx_opsets.lacks`), and where its function's body is written
in ops that mean at the file's opset what they meant at the body's, without sub-graphs; anything
else is left as it is (and runs in a session of its own).
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import onnx
import onnx.defs
from onnx import helper

from opsched.frontends.onnx_file import OnnxFile, with_nodes
from opsched.ir.ops.onnx_builder import OPSET
from opsched.ir.ops.onnx_opsets import CHECKED_THROUGH, lacks

__all__ = ["expand_functions"]

#: Rounds of expansion: a body may itself use an op the segments' opset lacks.
_ROUNDS = 4


def expand_functions(file: OnnxFile) -> OnnxFile:
    """``file`` with every node that :data:`OPSET` lacks and ONNX defines as a function replaced
    by that function's body (``file`` itself where there is none)."""
    model, changed = file.model, False
    fresh = itertools.count()  # numbers that make the inlined values' names unique
    for _ in range(_ROUNDS):
        expanded = _expanded_once(model, file.opset, fresh)
        if expanded is None:
            break
        model, changed = expanded, True
    return dataclasses.replace(file, model=model) if changed else file


def _expanded_once(model: onnx.ModelProto, opset: int, fresh: itertools.count[int]) -> onnx.ModelProto | None:
    """``model`` with each node that can be expanded replaced by its body; None where none can."""
    types: dict[str, onnx.TypeProto] | None = None
    nodes: list[onnx.NodeProto] = []
    expanded_any = False
    for node in model.graph.node:
        body = None
        if node.domain in ("", "ai.onnx") and lacks(OPSET, node.op_type, opset):
            types = types if types is not None else _value_types(model)
            body = _body(node, opset, types)
        if body is None:
            nodes.append(node)
        else:
            nodes.extend(_inlined(node, body, fresh, _defaults(node.op_type, opset)))
            expanded_any = True
    return with_nodes(model, nodes) if expanded_any else None


def _body(node: onnx.NodeProto, opset: int, types: dict[str, onnx.TypeProto]) -> onnx.FunctionProto | None:
    """The function that defines ``node`` at ``opset``, in ops that mean at ``opset`` what they
    mean at the function's own; None where ONNX defines none (or only a body we cannot inline)."""
    schema: Any = onnx.defs.get_schema(node.op_type, opset)  # onnx's stubs lack its function accessors
    if schema.has_function:
        versions, make = schema.function_opset_versions, None
    elif schema.has_context_dependent_function:
        versions = schema.context_dependent_function_opset_versions
        make = schema.get_context_dependent_function_with_opset_version
        if any(i and i not in types for i in node.input):
            return None  # a type the function needs is unknown
    else:
        return None
    usable = [v for v in versions if v <= opset]
    if not usable:
        return None
    version = max(usable)
    body: onnx.FunctionProto
    if make is None:
        body = onnx.FunctionProto.FromString(schema.get_function_with_opset_version(version))
    else:
        inputs = [types[i].SerializeToString() if i else onnx.TypeProto().SerializeToString() for i in node.input]
        body = onnx.FunctionProto.FromString(make(version, node.SerializeToString(), inputs))
    if not all(_same_meaning(n, version, opset) for n in body.node):
        return None
    return body


def _defaults(op_type: str, opset: int) -> dict[str, onnx.AttributeProto]:
    """The attributes of ``op_type``'s schema at ``opset`` that have a default, at their default."""
    schema = onnx.defs.get_schema(op_type, opset)
    return {name: a.default_value for name, a in schema.attributes.items()
            if a.default_value.type != onnx.AttributeProto.UNDEFINED}


def _same_meaning(node: onnx.NodeProto, version: int, opset: int) -> bool:
    """Whether a body node written at ``version`` means the same in a file of ``opset``: its op
    exists at ``version`` and did not move in between, where the changes up to ``opset`` were
    read (:data:`~opsched.ir.ops.onnx_opsets.CHECKED_THROUGH`; most only admit more types),
    or its schema is the same at both."""
    if node.domain not in ("", "ai.onnx") or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                                                  for a in node.attribute):
        return False
    try:
        written = onnx.defs.get_schema(node.op_type, version)
        read = onnx.defs.get_schema(node.op_type, opset)
    except onnx.defs.SchemaError:
        return False
    if written.since_version == read.since_version:
        return True
    return opset <= CHECKED_THROUGH and not lacks(version, node.op_type, opset)


def _inlined(node: onnx.NodeProto, body: onnx.FunctionProto, fresh: itertools.count[int],
             defaults: dict[str, onnx.AttributeProto]) -> list[onnx.NodeProto]:
    """``body``'s nodes wired to ``node``'s inputs (an optional one it leaves out: absent) and
    outputs, its own values under fresh names, attribute references resolved against ``node``'s
    attributes, or its op's ``defaults`` where it leaves one out."""
    label = node.name or node.output[0]
    names = {formal: node.input[k] if k < len(node.input) else "" for k, formal in enumerate(body.input)}
    names.update(zip(body.output, node.output))
    given = {**defaults, **{a.name: a for a in node.attribute}}

    def renamed(value: str) -> str:
        if value and value not in names:
            names[value] = f"{label}/{value}#{next(fresh)}"
        return names.get(value, "")

    nodes = []
    for k, n in enumerate(body.node):
        inlined = helper.make_node(n.op_type, [renamed(i) for i in n.input], [renamed(o) for o in n.output],
                                   name=f"{label}/{n.name or n.op_type}_{k}", domain=n.domain)
        for a in n.attribute:
            if not a.ref_attr_name:
                inlined.attribute.append(a)
            elif a.ref_attr_name in given:
                resolved = onnx.AttributeProto()
                resolved.CopyFrom(given[a.ref_attr_name])
                resolved.name = a.name
                inlined.attribute.append(resolved)
        nodes.append(inlined)
    return nodes


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Every value's type that ``onnx.shape_inference`` finds, by name."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    types = {v.name: v.type for v in [*g.input, *g.value_info, *g.output]}
    types.update({t.name: helper.make_tensor_type_proto(t.data_type, list(t.dims)) for t in g.initializer})
    return types


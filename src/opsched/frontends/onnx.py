"""ONNX import: opset-versioned converters, constant folding of shape arithmetic, one error
listing every unsupported op.

A converter is registered for an op type and the first opset its form applies to; for a model
of opset v the converter with the largest ``since <= v`` is used (ONNX changed, for example,
Split, Slice, Clip and ReduceMean from attributes to inputs over its versions). Values are
either graph tensors (names) or compile-time constants (NumPy arrays): initializers, Constant
nodes, and any foldable op whose inputs are all constants (the Shape/Gather/Concat arithmetic
exporters emit around reshapes).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from opsched.errors import FrontendError, MalformedModelError, UnsupportedOpError
from opsched.frontends._common import ConversionContext, Unsupported, report_opaque
from opsched.frontends.onnx_ops import FOLDABLE, Value, converter_for, supported_onnx_ops
from opsched.ir import Graph
from opsched.transforms import canonicalize

__all__ = ["from_onnx", "supported_onnx_ops"]

def from_onnx(model: str | os.PathLike[str] | onnx.ModelProto, *, name: str | None = None,
              input_shapes: Mapping[str, Sequence[int]] | None = None, canonical: bool = True) -> Graph:
    """Import an ONNX model (a path or a loaded ``ModelProto``) as a :class:`~opsched.ir.Graph`.

    Dynamic input dimensions must be fixed with ``input_shapes={"input": (1, 3, 224, 224)}``.
    Raises :class:`MalformedModelError` for a file that is missing, truncated or invalid, and
    :class:`UnsupportedOpError` listing every op the model uses that opsched cannot convert.
    """
    source = "<ModelProto>"
    if not isinstance(model, onnx.ModelProto):
        source = os.fspath(model)
        model = _load(source)
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise MalformedModelError(f"{source}: not a valid ONNX model: {e}") from e
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        raise MalformedModelError(f"{source}: the model imports no default-domain opset")
    name = name or model.graph.name or "onnx_model"
    initializers = {init.name for init in model.graph.initializer}
    real_inputs = [i.name for i in model.graph.input if i.name not in initializers]
    unknown = sorted(set(input_shapes or {}) - set(real_inputs))
    if unknown:
        raise FrontendError(f"{source}: input_shapes names {', '.join(map(repr, unknown))}, but the model's inputs are "
                            f"{', '.join(map(repr, real_inputs))}")
    _check_supported(model, opset, source)
    graph = _OnnxConverter(model.graph, opset, name, source, dict(input_shapes or {})).run().verify()
    if canonical:
        graph = canonicalize(graph)
    report_opaque(graph, f"from_onnx({source})")
    return graph


def _load(path: str) -> onnx.ModelProto:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise MalformedModelError(f"cannot read ONNX file {path!r}: {e.strerror}") from e
    if not data:
        raise MalformedModelError(f"{path}: the file is empty")
    try:
        model = onnx.load_model_from_string(data)
    except Exception as e:
        raise MalformedModelError(f"{path}: not an ONNX protobuf, or truncated ({len(data)} bytes): {e}") from e
    if not model.graph.node and not model.graph.output:
        raise MalformedModelError(f"{path}: parsed as an empty model: truncated, or not an ONNX file")
    return model


def _check_supported(model: onnx.ModelProto, opset: int, source: str) -> None:
    missing: Counter[str] = Counter()
    examples: dict[str, str] = {}
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            key = f"{node.domain}::{node.op_type}"
        elif converter_for(node.op_type, opset) is None and node.op_type not in FOLDABLE:
            key = node.op_type
        else:
            continue
        missing[key] += 1
        examples.setdefault(key, node.name or node.output[0])
    if missing:
        listing = "; ".join(f"{op} x{k} (e.g. node {examples[op]!r})" for op, k in sorted(missing.items()))
        raise UnsupportedOpError(
            f"{source}: {len(missing)} op type(s) at opset {opset} have no opsched converter: {listing}. "
            f"Supported: {', '.join(supported_onnx_ops())}", sorted(missing))


_SAFE = re.compile(r"[^A-Za-z0-9_]")


class _OnnxConverter:
    def __init__(self, g: onnx.GraphProto, opset: int, name: str, source: str,
                 input_shapes: dict[str, Sequence[int]]) -> None:
        self.g, self.opset, self.source = g, opset, source
        self.ctx = ConversionContext(name)
        self.env: dict[str, Value] = {}
        self.input_shapes = input_shapes

    def value_name(self, onnx_name: str) -> str:
        return _SAFE.sub("_", onnx_name) or "v"

    def run(self) -> Graph:
        for init in self.g.initializer:
            self.env[init.name] = numpy_helper.to_array(init)
        for inp in self.g.input:
            if inp.name in self.env:
                continue  # an initializer listed as an input (old exporters)
            self.env[inp.name] = self.ctx.b.input(self.value_name(inp.name), self._input_shape(inp), _dtype(inp))
        for node in self.g.node:
            self._convert(node)
        outputs = []
        for out in self.g.output:
            v = self.env[out.name]
            if not isinstance(v, str):
                v = self._const_node(v, out.name)
            outputs.append(v)
        return self.ctx.b.build(outputs)

    def _input_shape(self, inp: onnx.ValueInfoProto) -> tuple[int, ...]:
        if inp.name in self.input_shapes:
            return tuple(int(d) for d in self.input_shapes[inp.name])
        dims = inp.type.tensor_type.shape.dim
        shape = []
        for d in dims:
            if not d.HasField("dim_value"):
                raise FrontendError(f"{self.source}: input {inp.name!r} has a dynamic dimension "
                                    f"{d.dim_param or '?'!r}; fix it with input_shapes={{{inp.name!r}: (...)}}")
            shape.append(int(d.dim_value))
        return tuple(shape)

    def _convert(self, node: onnx.NodeProto) -> None:
        ins = [self.env[i] if i else None for i in node.input]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        where = f"{self.source}: node {node.name or node.output[0]!r} ({node.op_type})"
        if node.op_type in FOLDABLE and all(i is None or isinstance(i, np.ndarray) for i in ins):
            try:
                out = FOLDABLE[node.op_type](self, ins, attrs)
            except Exception as e:
                raise FrontendError(f"{where}: constant folding failed: {e}") from e
            self.env[node.output[0]] = out
            return
        if node.op_type == "Shape":
            x = ins[0]
            shape = np.array(x.shape if isinstance(x, np.ndarray) else self.ctx.type(self.tensor(x)).shape, np.int64)
            start, end = attrs.get("start", 0), attrs.get("end")
            self.env[node.output[0]] = shape[start:end]
            return
        conv = converter_for(node.op_type, self.opset)
        if conv is None:  # a foldable op reached with tensor inputs
            raise UnsupportedOpError(f"{where}: only supported on constant inputs here", [node.op_type])
        self._node = node
        try:
            made = conv(self, node, ins, attrs)
        except Unsupported as e:
            raise UnsupportedOpError(f"{where}: this form is not supported{': ' + str(e) if str(e) else ''}",
                                     [node.op_type]) from None
        outs = made if isinstance(made, list) else [made]
        for oname, v in zip(node.output, outs):
            self.env[oname] = v

    # helpers for converters
    def out_name(self, i: int = 0) -> str:
        return self.value_name(self._node.output[i])

    def tensor(self, v: Value, hint: str = "const") -> str:
        if isinstance(v, str):
            return v
        if isinstance(v, np.ndarray):
            return self._const_node(v, hint)
        raise Unsupported("a required input is missing")

    def _const_node(self, arr: np.ndarray, hint: str) -> str:
        t = torch.from_numpy(np.ascontiguousarray(arr).copy())
        name = self.value_name(hint)
        return self.ctx.add("constant", [], name=name, params=[self.ctx.param(name, t)])

    def param(self, v: Value, hint: str) -> str:
        if not isinstance(v, np.ndarray):
            raise Unsupported(f"{hint} must be a constant (an initializer)")
        return self.ctx.param(self.value_name(hint), torch.from_numpy(np.ascontiguousarray(v).copy()))


_DTYPES: dict[int, str] = {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
                           onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.INT64: "int64",
                           onnx.TensorProto.BFLOAT16: "bfloat16"}


def _dtype(inp: onnx.ValueInfoProto) -> str:
    return _DTYPES.get(int(inp.type.tensor_type.elem_type), "float32")


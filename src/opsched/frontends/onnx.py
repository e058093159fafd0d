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
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import torch
from onnx import helper, numpy_helper

from opsched.errors import FrontendError, MalformedModelError, UnsupportedOpError
from opsched.frontends._common import ConversionContext, Unsupported, report_opaque
from opsched.ir import Graph
from opsched.transforms import canonicalize

__all__ = ["from_onnx", "onnx_converter", "supported_onnx_ops"]

Value = Any  # str (a tensor of the graph) or np.ndarray (a constant)
OnnxConverter = Callable[["_OnnxConverter", onnx.NodeProto, list[Value], dict[str, Any]], Value | list[Value]]

_CONVERTERS: dict[str, list[tuple[int, OnnxConverter]]] = {}

#: Ops evaluated with NumPy when every input is a constant.
_FOLDABLE: dict[str, Callable[..., np.ndarray]] = {}


def onnx_converter(op_type: str, since: int = 1) -> Callable[[OnnxConverter], OnnxConverter]:
    def deco(fn: OnnxConverter) -> OnnxConverter:
        _CONVERTERS.setdefault(op_type, []).append((since, fn))
        _CONVERTERS[op_type].sort(key=lambda e: e[0])
        return fn
    return deco


def _converter(op_type: str, opset: int) -> OnnxConverter | None:
    best = None
    for since, fn in _CONVERTERS.get(op_type, []):
        if since <= opset:
            best = fn
    return best


def supported_onnx_ops() -> list[str]:
    return sorted(set(_CONVERTERS) | set(_FOLDABLE))


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
        elif _converter(node.op_type, opset) is None and node.op_type not in _FOLDABLE:
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
        if node.op_type in _FOLDABLE and all(i is None or isinstance(i, np.ndarray) for i in ins):
            try:
                out = _FOLDABLE[node.op_type](self, ins, attrs)
            except Exception as e:
                raise FrontendError(f"{where}: constant folding failed: {e}") from e
            self.env[node.output[0]] = out
            return
        if node.op_type == "Shape":
            shape = np.array(self.ctx.type(ins[0]).shape, dtype=np.int64)
            start, end = attrs.get("start", 0), attrs.get("end", None)
            self.env[node.output[0]] = shape[start:end]
            return
        conv = _converter(node.op_type, self.opset)
        if conv is None:  # a foldable op reached with tensor inputs
            raise UnsupportedOpError(f"{where}: only supported on constant inputs here", [node.op_type])
        self._node = node
        try:
            out = conv(self, node, ins, attrs)
        except Unsupported as e:
            raise UnsupportedOpError(f"{where}: this form is not supported{': ' + str(e) if str(e) else ''}",
                                     [node.op_type]) from None
        outs = out if isinstance(out, list) else [out]
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


def _dtype(inp: onnx.ValueInfoProto) -> str:
    elem = inp.type.tensor_type.elem_type
    return {onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
            onnx.TensorProto.DOUBLE: "float64", onnx.TensorProto.INT64: "int64",
            onnx.TensorProto.BFLOAT16: "bfloat16"}.get(elem, "float32")


def _ints(v: Any) -> tuple[int, ...]:
    return tuple(int(x) for x in np.asarray(v).reshape(-1))


# --- constant folding ---------------------------------------------------------------------
def _fold(op_type: str) -> Callable[[Callable[..., np.ndarray]], Callable[..., np.ndarray]]:
    def deco(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
        _FOLDABLE[op_type] = fn
        return fn
    return deco


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
_fold("Div")(lambda c, ins, a: (ins[0] // ins[1]) if ins[0].dtype.kind == "i" else ins[0] / ins[1])
_fold("Sub")(lambda c, ins, a: ins[0] - ins[1])
_fold("Floor")(lambda c, ins, a: np.floor(ins[0]))
_fold("Range")(lambda c, ins, a: np.arange(ins[0], ins[1], ins[2]))
_fold("ConstantOfShape")(lambda c, ins, a: np.full(_ints(ins[0]), numpy_helper.to_array(a["value"])[0]
                                                   if "value" in a else 0.0, dtype=np.float32 if "value" not in a
                                                   else numpy_helper.to_array(a["value"]).dtype))


_fold("Add")(lambda c, ins, a: ins[0] + ins[1])
_fold("Mul")(lambda c, ins, a: ins[0] * ins[1])
_fold("Transpose")(lambda c, ins, a: np.transpose(ins[0], a.get("perm")))
_fold("Reshape")(lambda c, ins, a: ins[0].reshape(_ints(ins[1])))


@_fold("Slice")
def _f_slice(c: _OnnxConverter, ins: list[Any], a: dict[str, Any]) -> np.ndarray:
    if "starts" in a:  # opset < 10
        starts, ends, axes, steps = a["starts"], a["ends"], a.get("axes"), None
    else:
        opt = lambda i: _ints(ins[i]) if len(ins) > i and ins[i] is not None else None  # noqa: E731
        starts, ends, axes, steps = _ints(ins[1]), _ints(ins[2]), opt(3), opt(4)
    index = [slice(None)] * ins[0].ndim
    for i, (s, e) in enumerate(zip(starts, ends)):
        ax = axes[i] if axes is not None else i
        index[ax] = slice(s, e, steps[i] if steps is not None else 1)
    return ins[0][tuple(index)]


@_fold("Unsqueeze")
def _f_unsqueeze(c: _OnnxConverter, ins: list[Any], a: dict[str, Any]) -> np.ndarray:
    axes = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else tuple(a["axes"])
    out = ins[0]
    for ax in sorted(x + out.ndim + len(axes) if x < 0 else x for x in axes):
        out = np.expand_dims(out, ax)
    return out


@_fold("Squeeze")
def _f_squeeze(c: _OnnxConverter, ins: list[Any], a: dict[str, Any]) -> np.ndarray:
    axes = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else tuple(a.get("axes", ()))
    return np.squeeze(ins[0], axis=axes or None)


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
    return c.ctx.add("gelu", [c.tensor(ins[0])], name=c.out_name(), **({} if approx == "none" else {"approximate": approx}))


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
    bound = lambda i: float(ins[i]) if len(ins) > i and ins[i] is not None else None  # noqa: E731
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
def _concat(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    return c.ctx.add("concat", [c.tensor(v) for v in ins], name=c.out_name(), axis=int(a["axis"]))


def _split(c: _OnnxConverter, n: onnx.NodeProto, x: str, axis: int, sizes: Sequence[int] | None) -> list[str]:
    dim = c.ctx.type(x).shape[axis]
    if sizes is None:
        k = len(n.output)
        step = -(-dim // k)
        sizes = [min(step, dim - i * step) for i in range(k)]
    outs, start = [], 0
    for i, s in enumerate(sizes):
        outs.append(c.ctx.add("slice", [x], name=c.out_name(i), axis=axis, start=start, end=start + int(s)))
        start += int(s)
    return outs


@onnx_converter("Split", 2)
def _split_v2(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> list[str]:
    return _split(c, n, c.tensor(ins[0]), int(a.get("axis", 0)), a.get("split"))


@onnx_converter("Split", 13)
def _split_v13(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> list[str]:
    sizes = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else None
    return _split(c, n, c.tensor(ins[0]), int(a.get("axis", 0)), sizes)


def _slice(c: _OnnxConverter, x: str, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int] | None,
           steps: Sequence[int] | None) -> str:
    rank = c.ctx.type(x).rank
    axes = axes if axes is not None else range(len(starts))
    steps = steps if steps is not None else [1] * len(starts)
    out = x
    for i, (s, e, ax, st) in enumerate(zip(starts, ends, axes, steps)):
        if st <= 0:
            raise Unsupported("negative slice steps")
        ax = ax + rank if ax < 0 else ax
        dim = c.ctx.type(out).shape[ax]
        end = None if e >= dim else e
        if s == 0 and end is None and st == 1:
            continue
        out = c.ctx.add("slice", [out], name=c.out_name() + (f"_{i}" if i else ""), axis=ax, start=s, end=end, step=st)
    return out if out != x else c.ctx.add("identity", [x], name=c.out_name())


@onnx_converter("Slice", 1)
def _slice_v1(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    return _slice(c, c.tensor(ins[0]), a["starts"], a["ends"], a.get("axes"), None)


@onnx_converter("Slice", 10)
def _slice_v10(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    opt = lambda i: _ints(ins[i]) if len(ins) > i and ins[i] is not None else None  # noqa: E731
    return _slice(c, c.tensor(ins[0]), _ints(ins[1]), _ints(ins[2]), opt(3), opt(4))


def _pool(op: str) -> OnnxConverter:
    def convert(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
        x = c.tensor(ins[0])
        kernel = tuple(a["kernel_shape"])
        strides, dil = tuple(a.get("strides", (1, 1))), tuple(a.get("dilations", (1, 1)))
        if len(kernel) != 2:
            raise Unsupported("only 2-D pooling")
        pads = _auto_pads(c, x, a, kernel, strides, dil)
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
    return c.ctx.add("adaptive_avg_pool2d", [c.tensor(ins[0])], name=c.out_name(), output_size=(1, 1))


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
    src = c.ctx.type(x).shape
    shape = tuple(src[i] if d == 0 and not a.get("allowzero", 0) else d for i, d in enumerate(_ints(ins[1])))
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
    pads = _ints(ins[1])
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
    axes = _ints(ins[1]) if len(ins) > 1 and ins[1] is not None else None
    return _reduce_mean(c, c.tensor(ins[0]), axes, bool(a.get("keepdims", 1)))

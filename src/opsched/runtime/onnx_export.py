"""Export a segment of a graph (an ordered list of nodes or merged convolutions) to ONNX.

Used by the ONNX Runtime backend: each lane of a plan becomes one ONNX model whose inputs are
the values it reads from elsewhere and whose outputs are the values read elsewhere. Every ONNX
node and value made for a step is named after the step (its node, or ``merge(a,b)``), so that
ORT's profile, whose kernels carry such names even after ORT fused or converted them, can be
read back per step (:func:`opsched.runtime.ort.profiled_trace`). One
exporter per op kind, in a registry; an op without one (opaque calls, adaptive pooling to a size
other than 1x1) raises :class:`NotExportable`, and the backend runs that step with torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from opsched.ir import Graph, Node
from opsched.runtime.plan import step_label
from opsched.schedule.merge import merged_conv, merged_parameters

__all__ = ["NotExportable", "export_segment", "exportable"]

OPSET = 17


class NotExportable(Exception):
    pass


_ONNX_DTYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "float64": TensorProto.DOUBLE,
               "int64": TensorProto.INT64, "bfloat16": TensorProto.BFLOAT16}
_ACT = {"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "hardswish": "HardSwish"}


class _Builder:
    """Collects ONNX nodes and initializers; a ``dry_run`` builder only checks exportability
    (no weights are copied)."""

    def __init__(self, graph: Graph, dry_run: bool = False) -> None:
        self.graph = graph
        self.dry_run = dry_run
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0
        self.owner = ""  # the step being exported: a prefix of every name made for it

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{self.owner}/{hint}__{self._n}"

    def init(self, value: np.ndarray | torch.Tensor, hint: str) -> str:
        name = self.fresh(hint)
        if self.dry_run:
            return name
        arr = value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def param(self, node: Node, i: int) -> str:
        return self.init(self.graph.params[node.params[i]], f"{node.name}_p{i}")

    def add(self, op: str, inputs: Sequence[str], output: str | None = None, **attrs: object) -> str:
        out = output or self.fresh(op)
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=self.fresh(op), **attrs))
        return out

    def activation(self, x: str, act: str, out: str) -> str:
        if act == "none":
            return self.add("Identity", [x], out)
        if act == "relu6":
            lo, hi = self.init(np.array(0.0, np.float32), "lo"), self.init(np.array(6.0, np.float32), "hi")
            return self.add("Clip", [x, lo, hi], out)
        if act == "silu":
            return self.add("Mul", [x, self.add("Sigmoid", [x])], out)
        if act == "gelu":
            raise NotExportable("gelu")
        return self.add(_ACT[act], [x], out)


Exporter = Callable[[_Builder, Node], None]
_EXPORTERS: dict[str, Exporter] = {}


def _exporter(*ops: str) -> Callable[[Exporter], Exporter]:
    def deco(fn: Exporter) -> Exporter:
        for op in ops:
            _EXPORTERS[op] = fn
        return fn
    return deco


def _pair(v: object) -> list[int]:
    return [int(v), int(v)] if isinstance(v, int) else [int(x) for x in v]  # type: ignore[union-attr]


@_exporter("conv2d")
def _conv(b: _Builder, n: Node) -> None:
    pad = _pair(n.attr("padding", 0))
    inputs = [n.inputs[0]] + [b.param(n, i) for i in range(len(n.params))]
    kernel = list(b.graph.param_types[n.params[0]].shape[2:])
    act = n.attr("act", "none")
    y = b.add("Conv", inputs, None if act != "none" else n.name, kernel_shape=kernel,
              strides=_pair(n.attr("stride", 1)), pads=pad + pad, dilations=_pair(n.attr("dilation", 1)),
              group=int(n.attr("groups", 1)))
    if act != "none":
        b.activation(y, act, n.name)


@_exporter("linear")
def _linear(b: _Builder, n: Node) -> None:
    if len(b.graph.types[n.inputs[0]].shape) != 2:
        raise NotExportable("linear on a non-2-D input")
    inputs = [n.inputs[0]] + [b.param(n, i) for i in range(len(n.params))]
    act = n.attr("act", "none")
    y = b.add("Gemm", inputs, None if act != "none" else n.name, transB=1)
    if act != "none":
        b.activation(y, act, n.name)


@_exporter("batch_norm")
def _bn(b: _Builder, n: Node) -> None:
    b.add("BatchNormalization", [n.inputs[0]] + [b.param(n, i) for i in range(4)], n.name,
          epsilon=float(n.attr("eps", 1e-5)))


@_exporter("relu", "relu6", "sigmoid", "tanh", "silu", "hardswish", "gelu")
def _act(b: _Builder, n: Node) -> None:
    if n.attrs:
        raise NotExportable(f"{n.op} with {dict(n.attrs)}")
    b.activation(n.inputs[0], n.op, n.name)


@_exporter("add")
def _add(b: _Builder, n: Node) -> None:
    """A chain of binary Adds, not one Sum: ONNX Runtime folds an Add into the convolution that
    produces one of its inputs (and the ReLU after it), which it does not do for Sum (RandWire-
    small: 1.72 ms of kernels per run as Adds, 1.89 as Sums)."""
    acc = n.inputs[0]
    for k, v in enumerate(n.inputs[1:], start=2):
        acc = b.add("Add", [acc, v], n.name if k == len(n.inputs) else None)


@_exporter("mul")
def _mul(b: _Builder, n: Node) -> None:
    b.add("Mul", list(n.inputs), n.name)


@_exporter("concat")
def _concat(b: _Builder, n: Node) -> None:
    b.add("Concat", list(n.inputs), n.name, axis=int(n.attr("axis", 1)))


@_exporter("slice")
def _slice(b: _Builder, n: Node) -> None:
    rank = len(b.graph.types[n.inputs[0]].shape)
    axis = int(n.attr("axis")) % rank
    end = n.attr("end")
    end = np.iinfo(np.int64).max if end is None else int(end)
    arrays = [np.array([int(n.attr("start"))]), np.array([end]), np.array([axis]), np.array([int(n.attr("step", 1))])]
    b.add("Slice", [n.inputs[0]] + [b.init(a.astype(np.int64), "s") for a in arrays], n.name)


@_exporter("pad")
def _pad(b: _Builder, n: Node) -> None:
    pads = list(n.attr("pads"))
    rank = len(b.graph.types[n.inputs[0]].shape)
    begin, end = [0] * rank, [0] * rank
    for i in range(len(pads) // 2):
        begin[rank - 1 - i], end[rank - 1 - i] = pads[2 * i], pads[2 * i + 1]
    value = b.init(np.array(float(n.attr("value", 0.0)), np.float32), "v")
    b.add("Pad", [n.inputs[0], b.init(np.array(begin + end, np.int64), "p"), value], n.name, mode="constant")


@_exporter("max_pool2d", "avg_pool2d")
def _pool(b: _Builder, n: Node) -> None:
    pad = _pair(n.attr("padding", 0))
    attrs: dict[str, object] = dict(kernel_shape=_pair(n.attr("kernel")),
                                    strides=_pair(n.attr("stride", n.attr("kernel"))),
                                    pads=pad + pad, ceil_mode=int(bool(n.attr("ceil_mode", False))))
    if n.op == "max_pool2d":
        attrs["dilations"] = _pair(n.attr("dilation", 1))
        b.add("MaxPool", [n.inputs[0]], n.name, **attrs)
    else:
        b.add("AveragePool", [n.inputs[0]], n.name, count_include_pad=int(bool(n.attr("count_include_pad", True))),
              **attrs)


@_exporter("adaptive_avg_pool2d")
def _adaptive(b: _Builder, n: Node) -> None:
    if _pair(n.attr("output_size")) != [1, 1]:
        raise NotExportable("adaptive pooling to a size other than 1x1")
    b.add("GlobalAveragePool", [n.inputs[0]], n.name)


@_exporter("mean")
def _mean(b: _Builder, n: Node) -> None:
    b.add("ReduceMean", [n.inputs[0]], n.name, axes=[int(d) for d in n.attr("dims")],
          keepdims=int(bool(n.attr("keepdim", False))))


@_exporter("softmax")
def _softmax(b: _Builder, n: Node) -> None:
    b.add("Softmax", [n.inputs[0]], n.name, axis=int(n.attr("axis", -1)))


@_exporter("flatten", "reshape")
def _reshape(b: _Builder, n: Node) -> None:
    b.add("Reshape", [n.inputs[0], b.init(np.array(n.out.shape, np.int64), "shape")], n.name)


@_exporter("identity")
def _identity(b: _Builder, n: Node) -> None:
    b.add("Identity", [n.inputs[0]], n.name)


@_exporter("constant")
def _constant(b: _Builder, n: Node) -> None:
    b.add("Identity", [b.param(n, 0)], n.name)


def exportable(graph: Graph, node: Node) -> bool:
    if node.op not in _EXPORTERS or node.out.dtype not in _ONNX_DTYPE:
        return False
    try:
        _EXPORTERS[node.op](_Builder(graph, dry_run=True), node)
    except NotExportable:
        return False
    return True


def _merged(b: _Builder, names: tuple[str, ...]) -> None:
    spec = merged_conv(b.graph, names)
    weight, bias = merged_parameters(b.graph, spec)
    first = b.graph.node(names[0])
    inputs = [first.inputs[0], b.init(weight, "merged_w")] + ([b.init(bias, "merged_b")] if bias is not None else [])
    pad = list(spec.padding)
    y = b.add("Conv", inputs, kernel_shape=list(spec.kernel), strides=list(spec.stride), pads=pad + pad,
              dilations=list(spec.dilation))
    if spec.act != "none":
        y = b.activation(y, spec.act, b.fresh("act"))
    sizes = b.init(np.array([c1 - c0 for c0, c1 in spec.channels], np.int64), "split")
    b.nodes.append(helper.make_node("Split", [y, sizes], list(names), name=b.fresh("Split"), axis=1))


def export_segment(graph: Graph, items: Sequence[tuple[str, ...]], inputs: Sequence[str],
                   outputs: Sequence[str]) -> onnx.ModelProto:
    """``items``: per step, its node names (one, or several for a merged convolution)."""
    b = _Builder(graph)
    for names in items:
        b.owner = step_label(names)
        if len(names) > 1:
            _merged(b, names)
        else:
            _EXPORTERS[graph.node(names[0]).op](b, graph.node(names[0]))

    def info(v: str) -> onnx.ValueInfoProto:
        t = graph.types[v]
        return helper.make_tensor_value_info(v, _ONNX_DTYPE[t.dtype], list(t.shape))

    g = helper.make_graph(b.nodes, "segment", [info(v) for v in inputs], [info(v) for v in outputs], b.inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=8)

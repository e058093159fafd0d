"""Generic ONNX nodes: an operator of an imported ONNX file that no family of ours models.

A generic node keeps the ONNX node itself (its type, domain, opset and attributes, serialised as
``proto``), how its ONNX inputs map to the node's inputs and parameters (``slots``: ``("t", k)``
the k-th input, ``("p", k)`` the k-th parameter, ``("-",)`` an optional input left out) and which
of its outputs it is (``index``). A node with sub-graphs (If, Loop, Scan) lists the outer values
its sub-graphs read (``captures``, by their names in the file), each with a slot after its own
inputs': wherever the node is exported, the sub-graphs' references are renamed to those slots.
Where ONNX Runtime's shape inference fails inside its sub-graphs at fixed input sizes though the
node runs (Silero VAD's ``If``, as the file is once its input's size is given), it is marked
``open_shapes``: it runs alone, in a session that declares its inputs' sizes open, as the file did.
Its type comes from ONNX shape inference (or from running it once; a node with sub-graphs is always
run, since inference takes their declared outputs at their word), its FLOPs are an estimate by
category (:func:`_estimate`), its bytes from the types.

It runs through ONNX Runtime everywhere: on the ONNX Runtime backend it is spliced into the
segment's model like any exported op; on the torch backends its kernel is a one-node ONNX
Runtime session on the CPU (a tensor on a GPU is copied there and back, so a graph with one
cannot be captured in a CUDA graph).

One op kind per category (``onnx.elementwise``, ``onnx.norm``, ...), as for generic ATen nodes,
so that costs and pictures treat an ``Erf`` as elementwise and a ``LayerNormalization`` as a norm.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops.registry import Kernel, NotExportable, OpDef, register
from opsched.ir.schema import OpSchema
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    import onnx
    import onnxruntime

    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__ = ["ONNX_GENERIC_OPS", "captured", "encode_proto", "onnx_category", "one_node_model", "one_node_session",
           "ort_errors", "subgraphs", "with_captures"]

#: Generic op kinds, by the category each is costed and drawn as.
ONNX_GENERIC_OPS: dict[str, str] = {
    category: f"onnx.{category}"
    for category in ("conv", "gemm", "norm", "activation", "elementwise", "pool", "reduce", "data", "view")
}

_CATEGORIES: dict[str, frozenset[str]] = {
    "conv": frozenset({"Conv", "ConvTranspose", "ConvInteger", "QLinearConv", "DeformConv"}),
    "gemm": frozenset({"MatMul", "Gemm", "MatMulInteger", "QLinearMatMul", "Einsum", "Attention",
                       "MultiHeadAttention"}),
    "norm": frozenset({"LayerNormalization", "InstanceNormalization", "GroupNormalization", "LpNormalization",
                       "BatchNormalization", "MeanVarianceNormalization", "RMSNormalization",
                       "SkipLayerNormalization", "SimplifiedLayerNormalization"}),
    "activation": frozenset({"Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "Gelu", "Sigmoid", "HardSigmoid",
                             "HardSwish", "Softplus", "Softsign", "Tanh", "Mish", "ThresholdedRelu", "Erf",
                             "FastGelu", "QuickGelu", "BiasGelu"}),
    "pool": frozenset({"MaxPool", "AveragePool", "GlobalMaxPool", "GlobalAveragePool", "LpPool", "GlobalLpPool",
                       "MaxRoiPool", "RoiAlign", "MaxUnpool"}),
    "reduce": frozenset({"ReduceMax", "ReduceMin", "ReduceMean", "ReduceSum", "ReduceProd", "ReduceL1", "ReduceL2",
                         "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin", "Softmax",
                         "LogSoftmax", "Hardmax", "CumSum", "TopK"}),
    "view": frozenset({"Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity"}),
    "elementwise": frozenset({"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Abs", "Neg", "Exp", "Log", "Sqrt",
                              "Reciprocal", "Ceil", "Floor", "Round", "Sign", "Sin", "Cos", "Clip", "Min", "Max",
                              "Sum", "Mean", "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not",
                              "And", "Or", "Xor", "Where", "Cast", "CastLike", "IsNaN", "IsInf", "BitShift"}),
}


def onnx_category(op_type: str) -> str:
    """What an ONNX op type mostly does (``"data"`` for movement and everything unlisted)."""
    return next((c for c, ops in _CATEGORIES.items() if op_type in ops), "data")


def _estimate(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType],
              out: TensorType) -> int:
    """FLOPs, estimated: a matrix product 2·|out|·K (K the first operand's last dimension), a
    convolution 2·|out|·|weight|/out-channels, anything else one per output element (none for
    views and data movement)."""
    category = onnx_category(attrs["op_type"])
    operands = [*inputs, *params]
    if category == "gemm" and operands and operands[0].shape:
        return 2 * out.numel * operands[0].shape[-1]
    if category == "conv" and len(operands) >= 2 and out.shape and len(out.shape) >= 2 and out.shape[1]:
        return 2 * out.numel * operands[1].numel // out.shape[1]
    return 0 if category in ("view", "data") else out.numel


# --- the one-node model and its session ---------------------------------------------------------
def one_node_model(attrs: FrozenAttrs, types: Sequence[TensorType]) -> onnx.ModelProto:
    """The node alone as a model: inputs ``in0, in1, ...`` (its inputs, then its parameters, of
    ``types``), every output of the node computed, output ``index`` the model's output."""
    import onnx
    from onnx import helper

    from opsched.ir.ops.onnx_builder import ONNX_DTYPES

    node = onnx.NodeProto.FromString(bytes.fromhex(attrs["proto"]))
    n_inputs = len({s[1] for s in attrs["slots"] if s[0] == "t"})
    offset = {"t": 0, "p": n_inputs}
    names = [f"in{offset[tag] + k[0]}" if tag != "-" else "" for tag, *k in attrs["slots"]]
    captures = attrs.get("captures", ())
    node.input.extend(names[:len(names) - len(captures)])
    if captures:
        node = with_captures(node, dict(zip(captures, names[len(names) - len(captures):])))
    outputs = [f"out{i}" if out else "" for i, out in enumerate(node.output)]
    del node.output[:]
    node.output.extend(outputs)

    def dims(i: int, t: TensorType) -> list[int | str]:
        return [f"in{i}_{k}" for k in range(len(t.shape))] if attrs.get("open_shapes") else list(t.shape)

    graph = helper.make_graph(
        [node], "one_node",
        [helper.make_tensor_value_info(f"in{i}", ONNX_DTYPES[t.dtype], dims(i, t)) for i, t in enumerate(types)],
        [onnx.ValueInfoProto(name=f"out{attrs['index']}")])  # its type: whatever ONNX Runtime infers
    opsets = [helper.make_opsetid("", attrs["opset"])]
    if attrs["domain"]:
        opsets.append(helper.make_opsetid(attrs["domain"], attrs["domain_version"]))
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets, True))


@functools.lru_cache(maxsize=512)
def _session(attrs: FrozenAttrs, types: tuple[TensorType, ...]) -> onnxruntime.InferenceSession:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 1  # one node among many: the schedule, not the node, spreads the work
    options.log_severity_level = 4  # what fails is raised, and reported as the node's failure
    return onnxruntime.InferenceSession(one_node_model(attrs, types).SerializeToString(), options,
                                        providers=["CPUExecutionProvider"])


@functools.cache
def ort_errors() -> tuple[type[Exception], ...]:
    """What ONNX Runtime raises for a node it cannot load or run."""
    from onnxruntime.capi import onnxruntime_pybind11_state as state

    return tuple(v for v in vars(state).values() if isinstance(v, type) and issubclass(v, Exception))


def one_node_session(attrs: FrozenAttrs, types: Sequence[TensorType]) -> onnxruntime.InferenceSession:
    """An ONNX Runtime session of :func:`one_node_model` (cached per node signature); raises
    what ONNX Runtime raises for a node it cannot run."""
    return _session(attrs, tuple(types))


def _bound(graph: Graph, node: Node) -> Kernel:
    types = [*(graph.types[v] for v in node.inputs), *(graph.param_types[p] for p in node.params)]
    session = one_node_session(node.attrs, types)
    names = [f"in{i}" for i in range(len(types))]
    params = [graph.params[p].detach().cpu().numpy() for p in node.params]

    def call(*inputs: torch.Tensor) -> torch.Tensor:
        feed = dict(zip(names, [*(np.asarray(t.detach().cpu().numpy(), order="C") for t in inputs), *params]))
        (out,) = session.run(None, feed)
        result = torch.from_numpy(np.asarray(out))
        device = inputs[0].device if inputs else next((p.device for p in graph.params.values()), result.device)
        return result.to(device)
    call.__qualname__ = f"onnx::{node.attrs['op_type']}"
    return call


# --- sub-graphs: the outer values they read --------------------------------------------------------
def captured(node: onnx.NodeProto) -> list[str]:
    """The values from outside a node that its sub-graphs read (an If branch's use of the
    model's input), in order of first use; empty for a node without sub-graphs."""
    found: list[str] = []
    for graph in subgraphs(node):
        found += [v for v in _free(graph) if v not in found]
    return found


def with_captures(node: onnx.NodeProto, names: dict[str, str]) -> onnx.NodeProto:
    """A copy of ``node`` whose sub-graphs read each outer value ``v`` as ``names[v]``."""
    import onnx

    copy = onnx.NodeProto()
    copy.CopyFrom(node)
    for graph in subgraphs(copy):
        _rename_free(graph, names)
    return copy


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs ``node``'s attributes hold (an If's branches, a Loop's body); empty for most nodes."""
    return [g for a in node.attribute for g in ([a.g] if a.HasField("g") else []) + list(a.graphs)]


def _free(graph: onnx.GraphProto) -> list[str]:
    """Names ``graph`` reads but does not define (its inputs, initializers and nodes' outputs)."""
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    free: list[str] = []
    for n in graph.node:
        free += [v for v in (*n.input, *captured(n)) if v and v not in defined and v not in free]
        defined.update(n.output)
    return free + [o.name for o in graph.output if o.name not in defined and o.name not in free]


def _rename_free(graph: onnx.GraphProto, names: dict[str, str]) -> None:
    defined = {v.name for v in graph.input} | {t.name for t in graph.initializer}
    for n in graph.node:
        n.input[:] = [names[v] if v in names and v not in defined else v for v in n.input]
        for inner in subgraphs(n):
            _rename_free(inner, {k: v for k, v in names.items() if k not in defined})
        defined.update(n.output)
    for o in graph.output:
        if o.name in names and o.name not in defined:
            o.name = names[o.name]


def _export(b: OnnxBuilder, node: Node) -> None:
    import onnx

    from opsched.ir.ops.onnx_builder import OPSET
    from opsched.ir.ops.onnx_opsets import Declaration, declaration_at

    attrs = node.attrs
    proto = onnx.NodeProto.FromString(bytes.fromhex(attrs["proto"]))
    g = b.graph
    captures = attrs.get("captures", ())
    own_slots = attrs["slots"][:len(attrs["slots"]) - len(captures)]
    outer = attrs["slots"][len(own_slots):]
    if subgraphs(proto) and attrs["opset"] != OPSET:  # their nodes mean what they mean at the file's opset
        raise NotExportable(f"{attrs['op_type']}'s sub-graphs are of opset {attrs['opset']}; segments are "
                            f"exported at ai.onnx opset {OPSET}")
    if attrs.get("open_shapes"):
        raise NotExportable(f"ONNX Runtime's shape inference fails in {attrs['op_type']}'s sub-graphs at the "
                            f"fixed sizes of a segment's values")
    if captures:
        proto = with_captures(proto, {c: b.operand(node, ref) for c, ref in zip(captures, outer)})
    types = [b.operand_type(node, ref) for ref in own_slots]
    if attrs["domain"]:  # an operator set of its own (com.microsoft): the segment imports it as the file did
        b.declare(attrs["domain"], attrs["domain_version"])
        declared = Declaration(tuple(proto.attribute), tuple(range(len(types))))
    else:
        constants = {j: g.params[node.params[k[0]]].detach().cpu().numpy()
                     for j, (tag, *k) in enumerate(own_slots) if tag == "p"}
        try:
            declared = declaration_at(OPSET, attrs["op_type"], attrs["opset"], proto.attribute, types, constants,
                                      len(proto.output), node.out, attrs["index"])
        except NotExportable as e:
            raise NotExportable(f"{e}; segments are exported at ai.onnx opset {OPSET}") from None
    ins = [b.operand(node, own_slots[j]) for j in declared.inputs]
    outs = [node.name if i == attrs["index"] else (b.fresh(f"{attrs['op_type']}_out{i}") if o else "")
            for i, o in enumerate(proto.output)]
    b.add_multi(attrs["op_type"], ins, outs)
    b.nodes[-1].domain = attrs["domain"]
    b.nodes[-1].attribute.extend(declared.attributes)


for _category, _kind in ONNX_GENERIC_OPS.items():
    register(OpDef(OpSchema(_kind, _category, (0, None), None, _estimate, is_view=False), _bound, _export))


def encode_proto(node: onnx.NodeProto) -> str:
    """The node's type, domain, attributes and output count, as a hex string (the ``proto`` attribute)."""
    import onnx

    kept = onnx.NodeProto(op_type=node.op_type, domain=node.domain)
    kept.attribute.extend(node.attribute)
    kept.output.extend("o" if o else "" for o in node.output)
    return bytes(kept.SerializeToString(deterministic=True)).hex()

"""Generic ATen operators: any operator ``torch.export`` records that no family of ours models.

A generic node names its ATen overload (``target="aten::gelu.default"``) and its arguments as
attributes (:func:`encode_args`): the node's inputs and parameters by position, every other
argument (ints, floats, lists, strings, dtypes, devices) by value. Its output type comes from the
frontend (fake-tensor propagation), its FLOPs from PyTorch's own flop counter where it has a
rule (an ``flops`` attribute, computed at import), its bytes from the types. It runs as the
ATen overload itself on the torch backends (CPU and CUDA, capturable in a CUDA graph), and it
exports to ONNX as :mod:`opsched.ir.ops.aten_export` says: through an ONNX form of ours
(:mod:`opsched.ir.ops.aten_onnx`) where the overload has one, else through torch.onnx's own
symbolic for it, checked against the overload.

One op kind per category (``aten.elementwise``, ``aten.gemm``, ...), so that cost models,
schedulers and pictures treat a generic matrix product as a matrix product; the category comes
from the overload's tags and name (:func:`category_of`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops.registry import Kernel, OpDef, register
from opsched.ir.schema import OpSchema
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__ = ["GENERIC_OPS", "SDPA", "arguments", "category_of", "decode_arg", "encode_args", "encoded_arguments",
           "generic_kind", "overload",
           "run_on", "target_of"]

#: Generic op kinds, by the category each is costed and drawn as.
GENERIC_OPS: dict[str, str] = {
    category: f"aten.{category}"
    for category in ("conv", "gemm", "norm", "activation", "elementwise", "pool", "reduce", "data", "view")
}

#: Attention, which transforms and forms of ours rewrite (masks, grouped-query heads).
SDPA = "aten::scaled_dot_product_attention.default"
_GEMM = frozenset({"mm", "bmm", "addmm", "baddbmm", "matmul", "linear", "einsum", "scaled_dot_product_attention",
                   "_scaled_dot_product_flash_attention_for_cpu", "addbmm", "addmv", "mv", "dot"})
_ACTIVATIONS = frozenset({"relu", "relu6", "gelu", "silu", "sigmoid", "tanh", "hardswish", "hardsigmoid",
                          "hardtanh", "leaky_relu", "elu", "selu", "celu", "mish", "softplus", "prelu",
                          "log_sigmoid", "softsign", "tanhshrink", "threshold"})


def target_of(op: torch._ops.OpOverload) -> str:
    """``torch.ops.aten.gelu.default`` -> ``"aten::gelu.default"``."""
    return f"{op._schema.name}.{op._schema.overload_name or 'default'}"


@functools.cache
def overload(target: str) -> torch._ops.OpOverload:
    """The ATen overload a target names (:func:`target_of`'s inverse)."""
    namespace, rest = target.split("::", 1)
    name, _, which = rest.rpartition(".")
    op: torch._ops.OpOverload = getattr(getattr(getattr(torch.ops, namespace), name), which)
    return op


def category_of(op: torch._ops.OpOverload) -> str:
    """What an overload mostly does, from its tags and its name."""
    name = op._schema.name.split("::")[-1].removesuffix("_")
    if op.is_view:
        return "view"
    if "conv" in name:
        return "conv"
    if name in _GEMM:
        return "gemm"
    if "norm" in name:
        return "norm"
    if "pool" in name:
        return "pool"
    if name in _ACTIVATIONS:
        return "activation"
    if torch.Tag.pointwise in op.tags:
        return "elementwise"
    if torch.Tag.reduction in op.tags or name in ("softmax", "_softmax", "log_softmax", "_log_softmax", "cumsum"):
        return "reduce"
    return "data"


def generic_kind(op: torch._ops.OpOverload) -> str:
    return GENERIC_OPS[category_of(op)]


# --- arguments as attributes ---------------------------------------------------------------------
#: An argument, encoded: ("t", k) the node's k-th input, ("p", k) its k-th parameter,
#: ("dtype" | "device" | "layout" | "memory_format", name), ("list", items), ("v", a scalar,
#: a string or None).
_ENUMS = {"dtype": torch.dtype, "layout": torch.layout, "memory_format": torch.memory_format}


def encode_args(value: Any, tensors: dict[int, tuple[str, int]]) -> Any:
    """``value`` (an argument, with tensors already replaced by ``("t", k)``/``("p", k)``
    markers through ``tensors``, keyed by ``id``) as a frozen attribute."""
    if id(value) in tensors:
        return tensors[id(value)]
    if isinstance(value, (list, tuple)):
        return ("list", tuple(encode_args(v, tensors) for v in value))
    if isinstance(value, torch.device):
        return ("device", str(value))
    for tag, kind in _ENUMS.items():
        if isinstance(value, kind):
            return (tag, str(value).removeprefix("torch."))
    if value is None or isinstance(value, (bool, int, float, str)):
        return ("v", value)
    raise TypeError(f"an argument of type {type(value).__name__} cannot be an attribute")


_NOT_A_VALUE = object()


def _value(enc: Any) -> Any:
    """An encoded argument that is a value (a scalar, a string, None, a list of them), decoded."""
    tag, value = enc
    if tag == "v":
        return value
    if tag == "list":
        items = [_value(v) for v in value]
        return _NOT_A_VALUE if any(v is _NOT_A_VALUE for v in items) else items
    return _NOT_A_VALUE


def encoded_arguments(node: Node) -> dict[str, Any]:
    """A generic node's arguments as encoded (:func:`encode_args`), by their schema names: the
    positional ones and the keywords given."""
    names = [a.name for a in overload(node.attrs["target"])._schema.arguments]
    return {**dict(zip(names, node.attrs["args"])), **dict(node.attrs["kwargs"])}


def arguments(node: Node) -> dict[str, Any]:
    """A generic node's arguments that are values (scalars, strings, None, lists of them), by
    their schema names; tensors, dtypes and devices left out."""
    return {k: v for k, enc in encoded_arguments(node).items() if (v := _value(enc)) is not _NOT_A_VALUE}


def decode_arg(enc: Any, inputs: Sequence[Any], params: Sequence[Any], device: torch.device,
            floating: torch.dtype | None) -> Any:
    tag, value = enc
    if tag == "t":
        return inputs[value]
    if tag == "p":
        return params[value]
    if tag == "list":
        return [decode_arg(v, inputs, params, device, floating) for v in value]
    if tag == "device":
        return device  # wherever the graph was placed
    if tag == "dtype":
        dtype: torch.dtype = getattr(torch, value)
        return floating if floating is not None and dtype.is_floating_point else dtype
    if tag in _ENUMS:
        return getattr(torch, value)
    return value


def run_on(node: Node, inputs: Sequence[torch.Tensor]) -> Any:
    """A parameterless generic node's overload run on ``inputs`` in place of its tensors, as
    they are (device, dtype): what the call does to other values than the graph's."""
    args = [decode_arg(a, inputs, (), torch.device("cpu"), None) for a in node.attrs["args"]]
    kwargs = {k: decode_arg(v, inputs, (), torch.device("cpu"), None) for k, v in node.attrs["kwargs"]}
    out = overload(node.attrs["target"])(*args, **kwargs)
    return out if node.attrs.get("index") is None else out[node.attrs["index"]]


def _placement(graph: Graph, node: Node) -> tuple[torch.device, torch.dtype | None]:
    """Where the graph runs and its floating precision: a generic node creating a tensor
    creates it there (a graph placed in float16 computes in float16)."""
    device = next((p.device for p in graph.params.values()), torch.device("cpu"))
    types = [node.out, *(graph.types[v] for v in node.inputs)]
    floating = next((getattr(torch, t.dtype) for t in types if getattr(torch, t.dtype).is_floating_point), None)
    return device, floating


def _bound(graph: Graph, node: Node) -> Kernel:
    if node.attrs["target"] == SDPA and _repeats_heads_itself(graph, node):
        return _heads_repeated(graph, node)
    return _overload_call(graph, node)


def _overload_call(graph: Graph, node: Node) -> Kernel:
    op = overload(node.attrs["target"])
    params = [graph.params[p] for p in node.params]
    device, floating = _placement(graph, node)
    args_enc, kwargs_enc, index = node.attrs["args"], node.attrs["kwargs"], node.attrs.get("index")

    def call(*inputs: torch.Tensor) -> Any:
        args = [decode_arg(a, inputs, params, device, floating) for a in args_enc]
        kwargs = {k: decode_arg(v, inputs, params, device, floating) for k, v in kwargs_enc}
        out = op(*args, **kwargs)
        return out if index is None else out[index]
    call.__qualname__ = node.attrs["target"]
    return call


def _repeats_heads_itself(graph: Graph, node: Node) -> bool:
    """Whether a grouped-query attention call (``enable_gqa``) is better run on key and value
    heads repeated first: on a GPU, where no fused kernel takes the call as it is, PyTorch runs
    its unfused math kernel (a float32 call, a masked one, heads over 256 wide, a GPU before
    sm80), several times slower than a fused kernel on repeated heads. On a CPU the call as it is
    runs faster (1.11-1.15x on Llama-like models here)."""
    device, floating = _placement(graph, node)
    bound = encoded_arguments(node)
    if device.type != "cuda" or bound.get("enable_gqa") != ("v", True) or any(
            bound[name][0] != "t" for name in ("query", "key", "value")):
        return False
    width = graph.types[node.inputs[bound["query"][1]]].shape[-1]
    fused = (floating in (torch.float16, torch.bfloat16) and bound.get("attn_mask", ("v", None)) == ("v", None)
             and width <= 256 and torch.cuda.get_device_capability(device) >= (8, 0))
    return not fused


def _heads_repeated(graph: Graph, node: Node) -> Kernel:
    """The call on key and value heads repeated for their groups of query heads
    (``repeat_interleave``, the operator's own reading), without ``enable_gqa``."""
    args = node.attrs["args"]
    query, key, value = (graph.types[node.inputs[args[p][1]]] for p in range(3))
    groups = query.shape[-3] // key.shape[-3]
    plain = _overload_call(graph, node.replace(attrs={**node.attrs, "kwargs": tuple(
        (k, ("v", False) if k == "enable_gqa" else v) for k, v in node.attrs["kwargs"])}))
    heads = {args[1][1], args[2][1]}

    def call(*inputs: torch.Tensor) -> Any:
        return plain(*[t.repeat_interleave(groups, dim=-3) if k in heads else t for k, t in enumerate(inputs)])
    call.__qualname__ = f"{SDPA} (heads repeated)"
    return call


def _flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType], out: TensorType) -> int:
    flops: int = attrs.get("flops", 0)
    return flops


def _export(b: OnnxBuilder, node: Node) -> None:
    """The call in ONNX (:mod:`opsched.ir.ops.aten_export`, imported here: it builds on this module)."""
    from opsched.ir.ops.aten_export import export_call

    export_call(b, node)


#: A view's arguments that say only where in its input it reads, by overload: its extent is in its
#: output type, and its cost (none on torch, a copy of its extent elsewhere) is the same wherever it lies.
_POSITIONS: dict[str, frozenset[str]] = {
    "aten::select.int": frozenset({"index"}),
    "aten::slice.Tensor": frozenset({"start", "end"}),
    "aten::narrow.default": frozenset({"start"}),
}


def _view_positions(attrs: FrozenAttrs) -> FrozenAttrs:
    """A view's attrs with its position arguments (:data:`_POSITIONS`) blanked."""
    names = _POSITIONS.get(attrs.get("target", ""))
    if names is None:
        return attrs
    schema = overload(attrs["target"])._schema.arguments
    blank = ("position", None)
    args = tuple(blank if k < len(schema) and schema[k].name in names else a for k, a in enumerate(attrs["args"]))
    kwargs = tuple((key, blank if key in names else v) for key, v in attrs.get("kwargs", ()))
    return FrozenAttrs({**attrs, "args": args, "kwargs": kwargs})


for _category, _kind in GENERIC_OPS.items():
    register(OpDef(OpSchema(_kind, _category, (0, None), None, _flops, is_view=_category == "view",
                            positions=_view_positions if _category == "view" else None), _bound, _export))

"""Activations: the one table of them (torch function, FLOPs, ONNX form, the torch spellings
the importer maps to them), each registered as an op of its own; and softmax.

An activation may also be fused into the convolution or linear layer that feeds it (the
producer's ``act`` attribute, :mod:`opsched.transforms.fuse_activation`); those kernels and
exports apply it with :func:`apply_activation` and :func:`export_activation`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops._common import per_element, same
from opsched.ir.ops.registry import Kernel, OpDef, register
from opsched.ir.schema import OpSchema

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__ = ["Activation", "ACTIVATIONS", "activation", "apply_activation", "export_activation"]

OnnxForm = Callable[["OnnxBuilder", str, str, Node], str]


def _const(b: OnnxBuilder, value: float, like: Node, hint: str) -> str:
    """A scalar constant in the node's floating dtype (an ONNX op's inputs must share one)."""
    return b.init(np.array(value, getattr(np, like.out.dtype)), hint)


def _simple(op_type: str) -> OnnxForm:
    return lambda b, x, out, node: b.add(op_type, [x], out)


def _relu6(b: OnnxBuilder, x: str, out: str, node: Node) -> str:
    return b.add("Clip", [x, _const(b, 0.0, node, "lo"), _const(b, 6.0, node, "hi")], out)


def _silu(b: OnnxBuilder, x: str, out: str, node: Node) -> str:
    return b.add("Mul", [x, b.add("Sigmoid", [x])], out)


def _hardsigmoid(b: OnnxBuilder, x: str, out: str, node: Node) -> str:
    return b.add("HardSigmoid", [x], out, alpha=1.0 / 6.0, beta=0.5)


def _gelu(b: OnnxBuilder, x: str, out: str, node: Node) -> str:
    """ONNX's Gelu (opset 20): ONNX Runtime's kernel computes the tanh form several times faster
    than the formula spelled out in elementwise nodes, which it does not fuse
    (``benchmarks/onnx_forms.py``)."""
    return b.add("Gelu", [x], out, approximate=node.attr("approximate", "none"))


@dataclass(frozen=True, slots=True)
class Activation:
    """One activation: its torch function (called with the node's attributes as keywords), FLOPs
    per element, its ONNX form, and how torch code spells it (for the importer)."""

    name: str
    fn: Callable[..., torch.Tensor]
    flops: int
    onnx: OnnxForm
    modules: tuple[type[nn.Module], ...] = ()
    functions: tuple[Callable[..., Any], ...] = ()
    methods: tuple[str, ...] = ()
    aten: tuple[str, ...] = ()  # the ATen overloads torch.export records for it


#: Every activation, by name: the only list of them.
ACTIVATIONS: dict[str, Activation] = {a.name: a for a in (
    Activation("relu", F.relu, 1, _simple("Relu"), (nn.ReLU,), (F.relu, torch.relu), ("relu",),
               ("aten::relu.default",)),
    Activation("relu6", F.relu6, 2, _relu6, (nn.ReLU6,), (F.relu6,), (), ("aten::relu6.default",)),  # or hardtanh
    Activation("sigmoid", torch.sigmoid, 4, _simple("Sigmoid"), (nn.Sigmoid,), (torch.sigmoid, F.sigmoid),
               ("sigmoid",), ("aten::sigmoid.default",)),
    Activation("tanh", torch.tanh, 4, _simple("Tanh"), (nn.Tanh,), (torch.tanh, F.tanh), ("tanh",),
               ("aten::tanh.default",)),
    Activation("gelu", F.gelu, 8, _gelu),  # nn.GELU / F.gelu carry ``approximate``: the importer maps them
    Activation("silu", F.silu, 5, _silu, (nn.SiLU,), (F.silu,), (), ("aten::silu.default",)),
    Activation("hardswish", F.hardswish, 5, _simple("HardSwish"), (nn.Hardswish,), (F.hardswish,), (),
               ("aten::hardswish.default",)),
    Activation("hardsigmoid", F.hardsigmoid, 3, _hardsigmoid, (nn.Hardsigmoid,), (F.hardsigmoid,), (),
               ("aten::hardsigmoid.default",)),
)}


def activation(name: str) -> Activation:
    return ACTIVATIONS[name]


def apply_activation(fn: Kernel, act: str) -> Kernel:
    """``fn`` followed by the fused activation ``act`` (``"none"``: ``fn`` itself)."""
    if act == "none":
        return fn
    post = ACTIVATIONS[act].fn
    return lambda *xs: post(fn(*xs))


def export_activation(b: OnnxBuilder, x: str, act: str, out: str, node: Node) -> str:
    """The fused activation ``act`` of ``node`` applied to the ONNX value ``x``, written to ``out``."""
    if act == "none":
        return b.add("Identity", [x], out)
    return ACTIVATIONS[act].onnx(b, x, out, node)


def _kernel(graph: Graph, node: Node) -> Kernel:
    fn, attrs = ACTIVATIONS[node.op].fn, dict(node.attrs)
    return (lambda x: fn(x, **attrs)) if attrs else fn


def _export(b: OnnxBuilder, node: Node) -> None:
    ACTIVATIONS[node.op].onnx(b, node.inputs[0], node.name, node)


for _a in ACTIVATIONS.values():
    register(OpDef(OpSchema(_a.name, "activation", (1, 1), same, per_element(_a.flops)), _kernel, _export))


# --- softmax ------------------------------------------------------------------------------
def _softmax_kernel(graph: Graph, node: Node) -> Kernel:
    axis = node.attr("axis", -1)
    return lambda x: torch.softmax(x, axis)


def _softmax_export(b: OnnxBuilder, node: Node) -> None:
    b.add("Softmax", [node.inputs[0]], node.name, axis=int(node.attr("axis", -1)))


register(OpDef(OpSchema("softmax", "activation", (1, 1), same, per_element(5)), _softmax_kernel,
               _softmax_export))

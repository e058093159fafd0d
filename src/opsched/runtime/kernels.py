"""Kernels: per op kind, a factory that binds a node (its attrs and parameters) to a torch call.

Binding happens once, when a graph is prepared for execution; the returned closure takes only
the node's input tensors, so the per-call loop does no attribute lookups or dispatch on strings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from opsched.errors import ExecutionError
from opsched.ir import Graph, Node

__all__ = ["Kernel", "register_kernel", "make_kernel", "ACTIVATION_FNS"]

Kernel = Callable[..., torch.Tensor]
KernelFactory = Callable[[Graph, Node], Kernel]

_FACTORIES: dict[str, KernelFactory] = {}

ACTIVATION_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "relu": F.relu,
    "relu6": F.relu6,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "gelu": F.gelu,
    "silu": F.silu,
    "hardswish": F.hardswish,
}


def register_kernel(op: str) -> Callable[[KernelFactory], KernelFactory]:
    def deco(factory: KernelFactory) -> KernelFactory:
        _FACTORIES[op] = factory
        return factory
    return deco


def make_kernel(graph: Graph, node: Node) -> Kernel:
    try:
        factory = _FACTORIES[node.op]
    except KeyError:
        raise ExecutionError(f"no kernel for op {node.op!r} (node {node.name!r})") from None
    return factory(graph, node)


def _params(graph: Graph, node: Node) -> list[torch.Tensor]:
    return [graph.params[p] for p in node.params]


def _with_act(fn: Kernel, act: str) -> Kernel:
    if act == "none":
        return fn
    post = ACTIVATION_FNS[act]
    return lambda x: post(fn(x))


@register_kernel("conv2d")
def _conv2d(graph: Graph, node: Node) -> Kernel:
    p = _params(graph, node)
    weight, bias = p[0], (p[1] if len(p) > 1 else None)
    a = node.attrs
    stride, padding = a.get("stride", 1), a.get("padding", 0)
    dilation, groups = a.get("dilation", 1), a.get("groups", 1)

    def conv(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    return _with_act(conv, a.get("act", "none"))


@register_kernel("linear")
def _linear(graph: Graph, node: Node) -> Kernel:
    p = _params(graph, node)
    weight, bias = p[0], (p[1] if len(p) > 1 else None)
    return _with_act(lambda x: F.linear(x, weight, bias), node.attrs.get("act", "none"))


@register_kernel("batch_norm")
def _batch_norm(graph: Graph, node: Node) -> Kernel:
    weight, bias, mean, var = _params(graph, node)
    eps = node.attrs.get("eps", 1e-5)
    return lambda x: F.batch_norm(x, mean, var, weight, bias, False, 0.0, eps)


def _activation(op: str) -> KernelFactory:
    fn = ACTIVATION_FNS[op]
    if op == "gelu":
        def factory(graph: Graph, node: Node) -> Kernel:
            approximate = node.attrs.get("approximate", "none")
            return lambda x: F.gelu(x, approximate=approximate)
        return factory
    return lambda graph, node: fn


for _op in ACTIVATION_FNS:
    register_kernel(_op)(_activation(_op))


@register_kernel("add")
def _add(graph: Graph, node: Node) -> Kernel:
    if len(node.inputs) == 2:
        return torch.add

    def add(*xs: torch.Tensor) -> torch.Tensor:
        out = xs[0] + xs[1]
        for x in xs[2:]:
            out += x  # out is a fresh tensor here, so accumulating in place is safe
        return out
    return add


@register_kernel("mul")
def _mul(graph: Graph, node: Node) -> Kernel:
    return torch.mul


@register_kernel("concat")
def _concat(graph: Graph, node: Node) -> Kernel:
    axis = node.attrs.get("axis", 1)
    return lambda *xs: torch.cat(xs, axis)


@register_kernel("slice")
def _slice(graph: Graph, node: Node) -> Kernel:
    a = node.attrs
    rank = len(graph.types[node.inputs[0]].shape)
    axis = a["axis"] % rank
    index: tuple[Any, ...] = (slice(None),) * axis + (slice(a["start"], a.get("end"), a.get("step", 1)),)
    return lambda x: x[index]


@register_kernel("pad")
def _pad(graph: Graph, node: Node) -> Kernel:
    pads, value = node.attrs["pads"], node.attrs.get("value", 0.0)
    return lambda x: F.pad(x, pads, value=value)


@register_kernel("max_pool2d")
def _max_pool(graph: Graph, node: Node) -> Kernel:
    a = node.attrs
    k, s, p = a["kernel"], a.get("stride", a["kernel"]), a.get("padding", 0)
    d, c = a.get("dilation", 1), a.get("ceil_mode", False)
    return lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=c)


@register_kernel("avg_pool2d")
def _avg_pool(graph: Graph, node: Node) -> Kernel:
    a = node.attrs
    k, s, p, c = a["kernel"], a.get("stride", a["kernel"]), a.get("padding", 0), a.get("ceil_mode", False)
    inc = a.get("count_include_pad", True)
    return lambda x: F.avg_pool2d(x, k, s, p, ceil_mode=c, count_include_pad=inc)


@register_kernel("adaptive_avg_pool2d")
def _adaptive(graph: Graph, node: Node) -> Kernel:
    size = node.attrs["output_size"]
    return lambda x: F.adaptive_avg_pool2d(x, size)


@register_kernel("mean")
def _mean(graph: Graph, node: Node) -> Kernel:
    dims, keep = tuple(node.attrs["dims"]), node.attrs.get("keepdim", False)
    return lambda x: x.mean(dims, keepdim=keep)


@register_kernel("softmax")
def _softmax(graph: Graph, node: Node) -> Kernel:
    axis = node.attrs.get("axis", -1)
    return lambda x: torch.softmax(x, axis)


@register_kernel("flatten")
def _flatten(graph: Graph, node: Node) -> Kernel:
    start, end = node.attrs.get("start_dim", 1), node.attrs.get("end_dim", -1)
    return lambda x: torch.flatten(x, start, end)


@register_kernel("reshape")
def _reshape(graph: Graph, node: Node) -> Kernel:
    shape = tuple(node.out.shape)
    return lambda x: x.reshape(shape)


@register_kernel("identity")
def _identity(graph: Graph, node: Node) -> Kernel:
    return lambda x: x


@register_kernel("constant")
def _constant(graph: Graph, node: Node) -> Kernel:
    (value,) = _params(graph, node)
    return lambda: value


@register_kernel("opaque")
def _opaque(graph: Graph, node: Node) -> Kernel:
    return graph.callables[node.name]

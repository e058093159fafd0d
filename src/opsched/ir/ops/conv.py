"""2-D convolution, and operator merge: convolutions that read one tensor run as one wider one.

Merge rule. Convolutions are compatible when they read the same value and share stride,
dilation, fused activation, dtype, output size, whether they have a bias, ``groups == 1``, and
their paddings are congruent modulo the dilation (per axis). Kernel sizes may differ: each
kernel is embedded, zero-padded, in a common kernel so that every output position reads
exactly the input window it read before. With common padding ``P = max(p_i)`` per axis, kernel
``i`` sits at offset ``(P - p_i) / d`` taps, which is whole exactly when the paddings are
congruent modulo the dilation ``d``; the merged kernel extends to ``max(offset_i + k_i)``.
(IOS centres kernels instead, which is the same thing for "same" convolutions; this rule also
covers mixed paddings.) The merged output is split back by channel ranges. :func:`merge_class`
and :func:`merged_conv` apply the same rule, so a merge the class admits is always buildable.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F

from opsched.errors import IllegalMergeError
from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops._common import fail, pair, window
from opsched.ir.ops.activation import ACTIVATIONS, apply_activation, export_activation
from opsched.ir.ops.registry import Kernel, OpDef, params, register
from opsched.ir.schema import OpSchema
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__ = ["MergedConv", "conv_output_hw", "merge_class", "check_merge", "merged_conv", "merged_parameters",
           "merged_kernel", "export_merged"]


def conv_output_hw(h: int, w: int, attrs: FrozenAttrs, kernel: tuple[int, int]) -> tuple[int, int]:
    sh, sw = pair(attrs.get("stride", 1))
    ph, pw = pair(attrs.get("padding", 0))
    dh, dw = pair(attrs.get("dilation", 1))
    return window(h, kernel[0], sh, ph, dh, False), window(w, kernel[1], sw, pw, dw, False)


def _infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    if x.rank != 4:
        raise fail("conv2d", f"expects an NCHW input, got {x}")
    if not params:
        raise fail("conv2d", "has no weight parameter")
    w = params[0]
    groups = attrs.get("groups", 1)
    if w.rank != 4 or w.shape[1] * groups != x.shape[1]:
        raise fail("conv2d", f"weight {w} with groups={groups} does not fit input {x} "
                             f"(expected weight[:,{x.shape[1] // max(groups, 1)},kh,kw])")
    if len(params) > 1 and params[1].shape != (w.shape[0],):
        raise fail("conv2d", f"bias {params[1]} does not match {w.shape[0]} output channels")
    act = attrs.get("act", "none")
    if act != "none" and act not in ACTIVATIONS:
        raise fail("conv2d", f"unknown fused activation {act!r}")
    h, wd = conv_output_hw(x.shape[2], x.shape[3], attrs, (w.shape[2], w.shape[3]))
    if h <= 0 or wd <= 0:
        raise fail("conv2d", f"output would be empty for input {x} and kernel {w.shape[2:]}")
    return TensorType((x.shape[0], w.shape[0], h, wd), x.dtype)


def _flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType], out: TensorType) -> int:
    w = params[0]
    macs = out.numel * w.shape[1] * w.shape[2] * w.shape[3]
    return 2 * macs + (out.numel if len(params) > 1 else 0)


def _kernel(graph: Graph, node: Node) -> Kernel:
    p = params(graph, node)
    weight, bias = p[0], (p[1] if len(p) > 1 else None)
    a = node.attrs
    stride, padding = a.get("stride", 1), a.get("padding", 0)
    dilation, groups = a.get("dilation", 1), a.get("groups", 1)

    def conv(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weight, bias, stride, padding, dilation, groups)
    return apply_activation(conv, a.get("act", "none"))


def _export(b: OnnxBuilder, n: Node) -> None:
    pad = list(pair(n.attr("padding", 0)))
    inputs = [n.inputs[0]] + [b.param(n, i) for i in range(len(n.params))]
    kernel = list(b.graph.param_types[n.params[0]].shape[2:])
    act = n.attr("act", "none")
    y = b.add("Conv", inputs, None if act != "none" else n.name, kernel_shape=kernel,
              strides=list(pair(n.attr("stride", 1))), pads=pad + pad, dilations=list(pair(n.attr("dilation", 1))),
              group=int(n.attr("groups", 1)))
    if act != "none":
        export_activation(b, y, act, n.name, n)


register(OpDef(OpSchema("conv2d", "conv", (1, 1), _infer, _flops), _kernel, _export))


# --- operator merge -----------------------------------------------------------------------
def merge_class(graph: Graph, node: Node) -> tuple[object, ...] | None:
    """Convolutions with equal classes may merge; ``None`` for nodes that never merge."""
    if node.op != "conv2d" or node.attr("groups", 1) != 1:
        return None
    dilation = pair(node.attr("dilation", 1))
    phase = tuple(p % d for p, d in zip(pair(node.attr("padding", 0)), dilation))
    return (node.inputs[0], pair(node.attr("stride", 1)), dilation, phase, node.attr("act", "none"),
            node.out.shape[2:], node.out.dtype, len(node.params) > 1)


@dataclass(frozen=True, slots=True)
class MergedConv:
    """Geometry of a merged convolution; ``channels[i]`` is conv i's output channel range and
    ``offsets[i]`` where its kernel sits in the merged one (in taps)."""

    members: tuple[str, ...]
    kernel: tuple[int, int]
    padding: tuple[int, int]
    stride: tuple[int, int]
    dilation: tuple[int, int]
    act: str
    offsets: tuple[tuple[int, int], ...]
    channels: tuple[tuple[int, int], ...]
    in_channels: int

    @property
    def out_channels(self) -> int:
        return self.channels[-1][1]


def check_merge(graph: Graph, names: Sequence[str]) -> None:
    """Raise :class:`IllegalMergeError` unless ``names`` can run as one convolution."""
    if len(names) < 2:
        raise IllegalMergeError(f"a merge needs at least two convolutions, got {list(names)}")
    nodes = [graph.node(v) for v in names]
    classes = [merge_class(graph, n) for n in nodes]
    for n, c in zip(nodes, classes):
        if c is None:
            why = "grouped convolution" if n.op == "conv2d" else f"a {n.op}, not a conv2d"
            raise IllegalMergeError(f"cannot merge {n.name!r}: {why}")
    for n, c in zip(nodes[1:], classes[1:]):
        if c != classes[0]:
            raise IllegalMergeError(
                f"cannot merge {n.name!r} with {nodes[0].name!r}: they differ in input, stride, dilation, padding "
                f"modulo dilation, activation, output size, dtype or bias ({c} vs {classes[0]})")


def merged_conv(graph: Graph, names: Sequence[str]) -> MergedConv:
    """The geometry of merging ``names`` (which :func:`check_merge` admits)."""
    check_merge(graph, names)
    nodes = [graph.node(v) for v in names]
    pads = [pair(n.attr("padding", 0)) for n in nodes]
    kernels = [tuple(graph.param_types[n.params[0]].shape[2:]) for n in nodes]
    dil = pair(nodes[0].attr("dilation", 1))
    pad = (max(p[0] for p in pads), max(p[1] for p in pads))
    offsets = tuple(((pad[0] - p[0]) // dil[0], (pad[1] - p[1]) // dil[1]) for p in pads)
    kernel = (max(o[0] + k[0] for o, k in zip(offsets, kernels)), max(o[1] + k[1] for o, k in zip(offsets, kernels)))
    channels, start = [], 0
    for n in nodes:
        channels.append((start, start + n.out.shape[1]))
        start += n.out.shape[1]
    return MergedConv(tuple(names), kernel, pad, pair(nodes[0].attr("stride", 1)), dil, nodes[0].attr("act", "none"),
                      offsets, tuple(channels), graph.types[nodes[0].inputs[0]].shape[1])


def merged_parameters(graph: Graph, spec: MergedConv) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The merged weight (zero-padded kernels stacked on output channels) and bias."""
    first = graph.params[graph.node(spec.members[0]).params[0]]
    weight = first.new_zeros((spec.out_channels, spec.in_channels) + spec.kernel)
    biases = []
    for name, (oh, ow), (c0, c1) in zip(spec.members, spec.offsets, spec.channels):
        node = graph.node(name)
        w = graph.params[node.params[0]]
        weight[c0:c1, :, oh:oh + w.shape[2], ow:ow + w.shape[3]] = w
        if len(node.params) > 1:
            biases.append(graph.params[node.params[1]])
    return weight, (torch.cat(biases) if biases else None)


def merged_kernel(graph: Graph, names: Sequence[str]) -> Kernel:
    """The merged convolution as a torch call returning one output per member (views)."""
    spec = merged_conv(graph, names)
    weight, bias = merged_parameters(graph, spec)
    sizes = [c1 - c0 for c0, c1 in spec.channels]

    def conv(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, weight, bias, spec.stride, spec.padding, spec.dilation)
    run = apply_activation(conv, spec.act)

    def merged(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return tuple(torch.split(run(x), sizes, dim=1))
    return merged


def export_merged(b: OnnxBuilder, names: Sequence[str]) -> None:
    """The merged convolution as one ONNX Conv and a Split into the members' values."""
    spec = merged_conv(b.graph, names)
    weight, bias = merged_parameters(b.graph, spec)
    first = b.graph.node(names[0])
    inputs = [first.inputs[0], b.init(weight, "merged_w")] + ([b.init(bias, "merged_b")] if bias is not None else [])
    pad = list(spec.padding)
    y = b.add("Conv", inputs, kernel_shape=list(spec.kernel), strides=list(spec.stride), pads=pad + pad,
              dilations=list(spec.dilation))
    if spec.act != "none":
        y = export_activation(b, y, spec.act, b.fresh("act"), first)
    sizes = b.init(np.array([c1 - c0 for c0, c1 in spec.channels], np.int64), "split")
    b.add_multi("Split", [y, sizes], list(names), axis=1)

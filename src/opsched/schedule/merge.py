"""Operator merge: convolutions that read one tensor run as one wider convolution.

Convolutions are compatible when they read the same value and share stride, dilation, fused
activation, dtype and output size, with ``groups == 1``. Kernel sizes may differ: each kernel
is embedded, zero-padded, in a common kernel so that every output position reads exactly the
input window it read before. With common padding ``P = max(p_i)`` per axis, kernel ``i`` sits
at offset ``P - p_i`` and the merged kernel extends to ``max(P - p_i + k_i)``. (IOS centres
kernels instead, which is the same thing for "same" convolutions; our rule also covers mixed
paddings, and we check that each original window is reproduced.) The merged output is split
back by channel ranges.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from opsched.errors import IllegalMergeError
from opsched.ir import Graph, Node

__all__ = ["MergedConv", "merge_class", "check_merge", "merged_conv", "merged_parameters"]


def _pair(v: int | Sequence[int]) -> tuple[int, int]:
    return (v, v) if isinstance(v, int) else (int(v[0]), int(v[1]))


def merge_class(graph: Graph, node: Node) -> tuple[object, ...] | None:
    """Convolutions with equal classes may merge; ``None`` for nodes that never merge."""
    if node.op != "conv2d" or node.attr("groups", 1) != 1:
        return None
    return (node.inputs[0], _pair(node.attr("stride", 1)), _pair(node.attr("dilation", 1)),
            node.attr("act", "none"), node.out.shape[2:], node.out.dtype, len(node.params) > 1)


@dataclass(frozen=True, slots=True)
class MergedConv:
    """Geometry of a merged convolution; ``channels[i]`` is conv i's output channel range."""

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
                f"cannot merge {n.name!r} with {nodes[0].name!r}: they differ in input, stride, dilation, "
                f"activation, output size, dtype or bias ({c} vs {classes[0]})")
    merged_conv(graph, names)  # checks that every window is reproduced


def merged_conv(graph: Graph, names: Sequence[str]) -> MergedConv:
    nodes = [graph.node(v) for v in names]
    pads = [_pair(n.attr("padding", 0)) for n in nodes]
    kernels = [tuple(graph.param_types[n.params[0]].shape[2:]) for n in nodes]
    dil = _pair(nodes[0].attr("dilation", 1))
    pad = (max(p[0] for p in pads), max(p[1] for p in pads))
    offsets = tuple((pad[0] - p[0], pad[1] - p[1]) for p in pads)
    for (oh, ow), n in zip(offsets, nodes):
        if oh % dil[0] or ow % dil[1]:
            raise IllegalMergeError(f"cannot merge {n.name!r}: its padding offset is not a multiple of the dilation")
    offsets = tuple((oh // dil[0], ow // dil[1]) for oh, ow in offsets)
    kernel = (max(o[0] + k[0] for o, k in zip(offsets, kernels)), max(o[1] + k[1] for o, k in zip(offsets, kernels)))
    channels, start = [], 0
    for n in nodes:
        channels.append((start, start + n.out.shape[1]))
        start += n.out.shape[1]
    return MergedConv(tuple(names), kernel, pad, _pair(nodes[0].attr("stride", 1)), dil, nodes[0].attr("act", "none"),
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

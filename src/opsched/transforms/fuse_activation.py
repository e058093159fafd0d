"""Fuse an activation into the conv2d or linear that feeds it (attribute ``act``).

Applies when the producer has no activation yet and the activation is its only reader; one
kernel then does both, and the scheduler sees one operator (as IOS's Conv-ReLU units).
"""

from __future__ import annotations

from opsched.ir import Graph, Node
from opsched.ir.ops.activation import ACTIVATIONS
from opsched.transforms._rewrite import rename_uses, use_counts

__all__ = ["fuse_activation"]


def fuse_activation(graph: Graph) -> Graph:
    uses = use_counts(graph)
    producer = {n.name: n for n in graph.nodes}
    fused: dict[str, Node] = {}
    mapping: dict[str, str] = {}
    for n in graph.nodes:
        if n.op not in ACTIVATIONS or n.attrs:
            continue  # an attribute (gelu's approximation) is not expressible as a fused act
        p = producer.get(n.inputs[0])
        if p is None or p.op not in ("conv2d", "linear") or p.attr("act", "none") != "none" or uses[p.name] != 1:
            continue
        fused[p.name] = p.replace(attrs=p.attrs.replace(act=n.op))
        mapping[n.name] = p.name
    if not fused:
        return graph
    nodes = [fused.get(n.name, n) for n in graph.nodes if n.name not in mapping]
    return rename_uses(graph, nodes, mapping)

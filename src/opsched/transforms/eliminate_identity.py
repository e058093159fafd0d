"""Remove identity nodes (dropout at inference, nn.Identity, no-op reshapes) by rewiring."""

from __future__ import annotations

from opsched.ir import Graph
from opsched.transforms._rewrite import rename_uses

__all__ = ["eliminate_identity"]


def eliminate_identity(graph: Graph) -> Graph:
    mapping = {}
    for n in graph.nodes:
        noop_reshape = n.op in ("reshape", "flatten") and graph.types[n.inputs[0]] == n.out
        if n.op == "identity" or noop_reshape:
            mapping[n.name] = n.inputs[0]
    if not mapping:
        return graph
    return rename_uses(graph, [n for n in graph.nodes if n.name not in mapping], mapping)

"""Remove nodes no graph output depends on (a model's unused branches: eager PyTorch computes them
and throws them away; a plan need not)."""

from __future__ import annotations

from opsched.ir import Graph
from opsched.transforms._rewrite import rename_uses

__all__ = ["eliminate_dead"]


def eliminate_dead(graph: Graph) -> Graph:
    live = set(graph.outputs)
    for n in reversed(graph.nodes):  # topological: every reader of a node comes after it
        if n.name in live:
            live.update(n.inputs)
    if all(n.name in live for n in graph.nodes):
        return graph
    return rename_uses(graph, [n for n in graph.nodes if n.name in live], {})

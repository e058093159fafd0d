"""Small helpers every graph rewrite needs: use counts and renaming of uses."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from opsched.ir import Graph, Node

__all__ = ["use_counts", "rename_uses"]


def use_counts(graph: Graph) -> Counter[str]:
    """How many times each value is read (by nodes, plus once per appearance as a graph output)."""
    counts: Counter[str] = Counter()
    for n in graph.nodes:
        counts.update(n.inputs)
    counts.update(graph.outputs)
    return counts


def _resolve(v: str, mapping: Mapping[str, str]) -> str:
    while v in mapping:
        v = mapping[v]
    return v


def rename_uses(graph: Graph, nodes: list[Node], mapping: Mapping[str, str]) -> Graph:
    """Rebuild ``graph`` from ``nodes`` with every read of a key of ``mapping`` redirected."""
    if mapping:
        nodes = [n.replace(inputs=tuple(_resolve(v, mapping) for v in n.inputs))
                 if any(v in mapping for v in n.inputs) else n for n in nodes]
    outputs = tuple(_resolve(v, mapping) for v in graph.outputs)
    used = {p for n in nodes for p in n.params}
    names = {n.name for n in nodes}
    return graph.replace(nodes=tuple(nodes), outputs=outputs,
                         params={k: v for k, v in graph.params.items() if k in used},
                         callables={k: v for k, v in graph.callables.items() if k in names})

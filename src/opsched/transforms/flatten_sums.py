"""Turn chains of binary adds into one n-ary add: ``(a + b) + c -> add(a, b, c)``.

A node of a RandWire graph sums all its predecessors; traced, that is a chain of binary adds,
which would show the scheduler several tiny dependent operators instead of one. An add is
absorbed into the add that reads it when that is its only reader and the shapes agree (no
broadcasting hidden inside).
"""

from __future__ import annotations

from opsched.ir import Graph, Node
from opsched.transforms._rewrite import rename_uses, use_counts

__all__ = ["flatten_sums"]


def flatten_sums(graph: Graph) -> Graph:
    uses = use_counts(graph)
    current: dict[str, Node] = {}
    absorbed: set[str] = set()
    nodes: list[Node] = []
    for n in graph.nodes:
        if n.op == "add":
            inputs: list[str] = []
            for v in n.inputs:
                p = current.get(v)
                if p is not None and p.op == "add" and uses[v] == 1 and p.out == n.out:
                    inputs.extend(p.inputs)
                    absorbed.add(v)
                else:
                    inputs.append(v)
            n = n.replace(inputs=tuple(inputs))
        current[n.name] = n
        nodes.append(n)
    if not absorbed:
        return graph
    return rename_uses(graph, [n for n in nodes if n.name not in absorbed], {})

"""Write a reshape that merges trailing dimensions into one as the flatten it is.

``x.view(n, -1)``, ``torch.flatten(x, 1)`` (which torch.export records as a view), ONNX's
Flatten and Reshape: one meaning, several spellings. As ``flatten(start_dim=s)`` they are one
op, so that a model imports to the same graph, and the same schedules, from every frontend.
"""

from __future__ import annotations

from math import prod

from opsched.ir import FrozenAttrs, Graph

__all__ = ["reshape_as_flatten"]


def _start(source: tuple[int, ...], target: tuple[int, ...]) -> int | None:
    """The ``start_dim`` of the flatten from ``source`` to ``target``, if it is one."""
    s = len(target) - 1
    if s < 0 or len(source) <= len(target) or source[:s] != target[:s]:
        return None
    return s if prod(source[s:]) == target[s] else None


def reshape_as_flatten(graph: Graph) -> Graph:
    nodes = []
    for n in graph.nodes:
        start = _start(graph.types[n.inputs[0]].shape, n.out.shape) if n.op == "reshape" else None
        nodes.append(n if start is None else n.replace(op="flatten", attrs=FrozenAttrs(start_dim=start, end_dim=-1)))
    if all(a is b for a, b in zip(nodes, graph.nodes)):
        return graph
    return graph.replace(nodes=tuple(nodes))

"""A readable, deterministic text form of a graph (one line per node, fx-like)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from opsched.ir.node import Node

if TYPE_CHECKING:
    from opsched.ir.graph import Graph

__all__ = ["format_graph", "format_node"]


def _value(v: object) -> str:
    if isinstance(v, tuple):
        return "(" + ",".join(_value(x) for x in v) + ")"
    return repr(v) if isinstance(v, str) else str(v)


def format_node(graph: Graph, node: Node) -> str:
    args = ", ".join(f"%{v}" for v in node.inputs)
    if node.params:
        args += ("; " if args else "") + ", ".join(f"{p}:{graph.param_types[p]}" for p in node.params)
    attrs = ", ".join(f"{k}={_value(v)}" for k, v in node.attrs.items())
    return f"%{node.name} = {node.op}({args})" + (f" {{{attrs}}}" if attrs else "") + f" : {node.out}"


def format_graph(graph: Graph) -> str:
    ins = ", ".join(f"%{i.name}: {i.type}" for i in graph.inputs)
    lines = [f"graph {graph.name}({ins}) {{"]
    lines += ["  " + format_node(graph, n) for n in graph.nodes]
    lines.append("  return " + ", ".join(f"%{v}" for v in graph.returns))
    written = graph.outputs[len(graph.returns):]
    lines += [f"  write %{name} <- %{v}" for name, v in zip(graph.writes, written)]
    lines.append("}")
    return "\n".join(lines)

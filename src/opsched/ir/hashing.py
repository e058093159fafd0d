"""Structural keys: what a graph or a set of its nodes computes, independent of names and weights.

Two Inception blocks built alike hash the same; change a kernel size, a channel count, a
dtype or the wiring and the hash changes. Keys are SHA-256 hex digests of a canonical text, so
they are stable across processes and Python versions (unlike ``hash()``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from opsched.ir.graph import Graph
from opsched.ir.node import Node

__all__ = ["structural_hash", "node_signature", "subgraph_key"]


def node_signature(graph: Graph, node: Node) -> str:
    """Everything about a node that matters to its cost, except where its inputs come from."""
    attrs = ",".join(f"{k}={v!r}" for k, v in node.attrs.items())
    params = ",".join(str(graph.param_types[p]) for p in node.params)
    ins = ",".join(str(graph.types[v]) for v in node.inputs)
    extra = ""
    if node.op == "opaque":
        fn = graph.callables.get(node.name)
        extra = f"|{getattr(fn, '__qualname__', type(fn).__qualname__)}"
    return f"{node.op}({ins})[{params}]{{{attrs}}}->{node.out}{extra}"


def _wiring(nodes: Sequence[Node], external: dict[str, int]) -> list[str]:
    local = {n.name: i for i, n in enumerate(nodes)}
    lines = []
    for n in nodes:
        refs = []
        for v in n.inputs:
            if v in local:
                refs.append(f"%{local[v]}")
            else:
                refs.append("$" + str(external.setdefault(v, len(external))))
        lines.append(",".join(refs))
    return lines


def _digest(parts: Iterable[str]) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode())
        h.update(b"\n")
    return h.hexdigest()


def structural_hash(graph: Graph) -> str:
    external = {i.name: k for k, i in enumerate(graph.inputs)}
    ins = [str(i.type) for i in graph.inputs]
    sigs = [node_signature(graph, n) for n in graph.nodes]
    wiring = _wiring(graph.nodes, external)
    local = {n.name: i for i, n in enumerate(graph.nodes)}
    outs = [f"%{local[v]}" if v in local else f"${external[v]}" for v in graph.outputs]
    return _digest(["graph", *ins, *(f"{s}<{w}" for s, w in zip(sigs, wiring)), "out", *outs])


def subgraph_key(graph: Graph, groups: Sequence[Sequence[str]], tag: str = "") -> str:
    """Key of a set of nodes partitioned into ordered groups (a stage).

    Groups are canonicalised by sorting their own keys, so the order in which groups are listed
    does not matter; the order of nodes within a group does (it is an execution order).
    External inputs are numbered per stage in order of first use, so a stage that reads one
    tensor twice differs from one that reads two tensors.
    """
    external: dict[str, int] = {}
    group_keys = []
    for group in groups:
        nodes = [graph.node(v) for v in group]
        sigs = [node_signature(graph, n) for n in nodes]
        group_keys.append((sigs, nodes))
    # Sort by signature first (name-free), then assign external ids in that canonical order.
    group_keys.sort(key=lambda g: g[0])
    parts = [tag]
    all_nodes = [n for _, nodes in group_keys for n in nodes]
    wiring = _wiring(all_nodes, external)
    pos = 0
    for sigs, nodes in group_keys:
        parts.append("group")
        for s in sigs:
            parts.append(f"{s}<{wiring[pos]}")
            pos += 1
    return _digest(parts)

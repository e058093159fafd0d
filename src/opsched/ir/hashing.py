"""Structural keys: what a graph or a set of its nodes computes, independent of names and weights.

Two Inception blocks built alike hash the same; change a kernel size, a channel count, a
dtype or the wiring and the hash changes. Keys are SHA-256 hex digests of a canonical text, so
they are stable across processes and Python versions (unlike ``hash()``).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from opsched.ir.node import Node

if TYPE_CHECKING:
    from opsched.ir.graph import Graph

__all__ = ["structural_hash", "node_signature", "cost_signature", "group_wiring", "stage_key"]


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


def cost_signature(graph: Graph, node: Node) -> str:
    """:func:`node_signature` without the attrs that only say where in its input a view reads
    (:attr:`OpSchema.positions <opsched.ir.schema.OpSchema>`): the select of patch 11 and of
    patch 12 of an unrolled loop cost the same, and so do the parts of the graph around them.
    What the search prices stages and recognises repeated parts by; never a graph's identity
    (:func:`structural_hash`), which a compiled segment or a saved schedule is checked against."""
    from opsched.ir.schema import op_schema

    positions = op_schema(node.op).positions
    if positions is None:
        return graph.signatures[node.name]
    return node_signature(graph, dataclasses.replace(node, attrs=positions(node.attrs)))


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


def structural_hash(graph: Graph, signatures: Mapping[str, str] | None = None) -> str:
    """The graph's structure hashed: its inputs' types, each node's signature (``signatures``,
    by default :func:`node_signature`'s) with its wiring, its outputs and writes."""
    external = {i.name: k for k, i in enumerate(graph.inputs)}
    ins = [str(i.type) for i in graph.inputs]
    sigs = [(signatures or graph.signatures)[n.name] for n in graph.nodes]
    wiring = _wiring(graph.nodes, external)
    local = {n.name: i for i, n in enumerate(graph.nodes)}
    outs = [f"%{local[v]}" if v in local else f"${external[v]}" for v in graph.outputs]
    writes = ["writes", *(f"${external[v]}" for v in graph.writes)] if graph.writes else []  # hashes kept as before
    return _digest(["graph", *ins, *(f"{s}<{w}" for s, w in zip(sigs, wiring)), "out", *outs, *writes])


def group_wiring(graph: Graph, group: Sequence[str]) -> list[tuple[int, ...]]:
    """Per node of an ordered group, where each input comes from: the index of an earlier node
    of the group, or -1 for a value from outside it."""
    local = {v: i for i, v in enumerate(group)}
    return [tuple(local.get(u, -1) for u in graph.node(v).inputs) for v in group]


def stage_key(graph: Graph, groups: Sequence[Sequence[str]], strategy: str) -> str:
    """Structural key of a stage: its strategy and, as a multiset, its groups' operator signatures
    and internal wiring. Which external tensor a group reads is not part of it (any operator
    reading a tensor of the right type costs the same), nor are names, weights or group order.
    Stable across processes: the profile store is keyed by it."""
    parts = sorted("|".join(f"{graph.signatures[v]}<{','.join(map(str, refs))}"
                            for v, refs in zip(group, group_wiring(graph, group))) for group in groups)
    return _digest([strategy, *parts])

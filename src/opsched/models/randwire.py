"""RandWire (Xie et al., 2019): stages wired by seeded Watts-Strogatz random graphs.

Each graph node sums its predecessors' outputs, then applies ReLU -> separable 3x3 conv
(depthwise + pointwise) -> batch norm; source nodes read the stage input with stride 2; the
stage output sums the sink nodes (IOS uses this plain sum instead of the paper's weighted
average, and so do we). Graphs are undirected WS(n, k, p) graphs from :func:`watts_strogatz`
with every edge oriented from the lower to the higher node index.

``randwire_large`` is the IOS "large" configuration: C = 154, stem 3x3/2 conv to C/2, stage
graphs WS(16,4,0.75) at C then WS(32,4,0.75) at 2C, 4C, 8C, then ReLU, 1x1 conv to 1280 and
global pooling (we add the linear classifier). IOS counts 120 schedule units (a ReLU-SepConv
"Sequential" is one unit; 344 primitives); opsched sees each ReLU, depthwise and pointwise
conv, and each n-ary sum, as operators of their own. The graphs come from our generator with
fixed seeds, not IOS's stored files, so the wiring (and the exact counts) differ. For a
like-for-like comparison, :meth:`RandWire.from_edge_lists` builds the network on stored
graphs: IOS keeps its four in ``python/models/randwire_graphs/generated/ws-*.txt`` of its
repository, in the format :func:`read_edge_list` reads.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

import torch
from torch import nn

from opsched.errors import MalformedModelError
from opsched.models._blocks import ConvBN, SepConv

__all__ = ["RandWire", "watts_strogatz", "dag_from_edges", "read_edge_list"]

Edges = Sequence[tuple[int, int]]


def watts_strogatz(n: int, k: int, p: float, seed: int) -> list[tuple[int, int]]:
    """Undirected Watts-Strogatz small-world graph as sorted (u, v) pairs, u < v.

    Start from a ring lattice where each node links to its k/2 nearest neighbours on each
    side; then, going round the ring once per neighbour distance, rewire each lattice edge
    (u, u+j) with probability p to (u, w) for a uniformly chosen w that is neither u nor
    already a neighbour of u.
    """
    if k % 2 or k >= n:
        raise ValueError(f"Watts-Strogatz needs an even k < n, got n={n}, k={k}")
    rng = random.Random(seed)
    adj: list[set[int]] = [set() for _ in range(n)]
    for u in range(n):
        for j in range(1, k // 2 + 1):
            v = (u + j) % n
            adj[u].add(v)
            adj[v].add(u)
    for j in range(1, k // 2 + 1):
        for u in range(n):
            v = (u + j) % n
            if v in adj[u] and rng.random() < p:
                choices = [w for w in range(n) if w != u and w not in adj[u]]
                if choices:
                    w = rng.choice(choices)
                    adj[u].discard(v)
                    adj[v].discard(u)
                    adj[u].add(w)
                    adj[w].add(u)
    return sorted((u, v) for u in range(n) for v in adj[u] if u < v)


def dag_from_edges(n: int, edges: Edges) -> list[list[int]]:
    """Predecessor lists of the DAG that orients every edge from lower to higher index."""
    preds: list[list[int]] = [[] for _ in range(n)]
    for u, v in edges:
        preds[max(u, v)].append(min(u, v))
    return [sorted(p) for p in preds]


def read_edge_list(path: str | PathLike[str]) -> tuple[int, list[tuple[int, int]]]:
    """A stored random graph: a line with the node count n, one with the edge count m, then m
    lines "u v" (an undirected edge between nodes 0 <= u, v < n), the format RandWire
    generators write. Returns (n, edges)."""
    try:
        lines = [line.split() for line in Path(path).read_text(encoding="ascii").splitlines() if line.strip()]
    except (OSError, UnicodeDecodeError) as e:
        raise MalformedModelError(f"{path}: cannot read a graph edge list ({e})") from e

    def numbers(k: int, count: int, what: str) -> list[int]:
        if k >= len(lines):
            raise MalformedModelError(f"{path}: ends after {len(lines)} lines, expected {what} on line {k + 1}")
        fields = lines[k]
        if len(fields) != count or not all(f.isdigit() for f in fields):
            raise MalformedModelError(f"{path}: line {k + 1} is {' '.join(fields)!r}, expected {what}")
        return [int(f) for f in fields]

    (n,), (m,) = numbers(0, 1, "the node count"), numbers(1, 1, "the edge count")
    edges = []
    for k in range(2, 2 + m):
        u, v = numbers(k, 2, f"edge {k - 1} of {m} as 'u v'")
        if u == v or max(u, v) >= n:
            raise MalformedModelError(f"{path}: line {k + 1}: edge ({u}, {v}) is not between two of the {n} nodes")
        if (u, v) in edges or (v, u) in edges:
            raise MalformedModelError(f"{path}: line {k + 1}: edge ({u}, {v}) is listed twice")
        edges.append((u, v))
    if len(lines) > 2 + m:
        raise MalformedModelError(f"{path}: {len(lines) - 2 - m} lines after the {m} edges the header announces")
    return n, edges


class RandomStage(nn.Module):
    def __init__(self, cin: int, cout: int, n: int, edges: Edges) -> None:
        super().__init__()
        self.preds = dag_from_edges(n, edges)
        has_succ = {q for ps in self.preds for q in ps}
        self.sinks = [i for i in range(n) if i not in has_succ]
        self.nodes = nn.ModuleList(
            SepConv(cin, cout, 3, stride=2) if not ps else SepConv(cout, cout, 3) for ps in self.preds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outs: list[torch.Tensor] = []
        for ps, node in zip(self.preds, self.nodes):
            if not ps:
                inp = x
            else:
                inp = outs[ps[0]]
                for q in ps[1:]:
                    inp = inp + outs[q]
            outs.append(node(inp))
        y = outs[self.sinks[0]]
        for s in self.sinks[1:]:
            y = y + outs[s]
        return y


class RandWire(nn.Module):
    """Stage i has ``nodes[i]`` nodes wired by WS(nodes[i], k, p) drawn with seed ``seed + i``,
    or, where ``graphs`` is given, one stage per (n, edges) graph in it."""

    def __init__(self, channels: int = 154, nodes: tuple[int, ...] = (16, 32, 32, 32), k: int = 4,
                 p: float = 0.75, seed: int = 0, num_classes: int = 1000,
                 graphs: Sequence[tuple[int, Edges]] | None = None) -> None:
        super().__init__()
        if graphs is None:
            graphs = [(n, watts_strogatz(n, k, p, seed + i)) for i, n in enumerate(nodes)]
        self.stem = ConvBN(3, channels // 2, 3, stride=2, padding=1, relu=False)
        stages = []
        cin = channels // 2
        for i, (n, edges) in enumerate(graphs):
            cout = channels * 2 ** i
            stages.append(RandomStage(cin, cout, n, edges))
            cin = cout
        self.stages = nn.Sequential(*stages)
        self.head = nn.Sequential(nn.ReLU(), nn.Conv2d(cin, 1280, 1), nn.AdaptiveAvgPool2d(1))
        self.fc = nn.Linear(1280, num_classes)

    @classmethod
    def from_edge_lists(cls, paths: Sequence[str | PathLike[str]], channels: int = 154,
                        num_classes: int = 1000) -> RandWire:
        """The network on stored stage graphs, one file per stage (:func:`read_edge_list`)."""
        return cls(channels, num_classes=num_classes, graphs=[read_edge_list(p) for p in paths])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.head(self.stages(self.stem(x))), 1))

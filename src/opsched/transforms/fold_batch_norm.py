"""Fold an inference batch norm into the convolution(s) that feed it.

``bn(conv(x)) = conv'(x)`` with ``W' = W * s`` per output channel and ``b' = (b - mean) * s +
beta`` where ``s = gamma / sqrt(var + eps)``. Applies when the convolution has no fused
activation and the batch norm is its only reader. A batch norm after a channel concat of
such convolutions (NASNet's factorised reduction) is per-channel too, so each convolution
takes its slice of the statistics and the concat is kept. Other batch norms stay as they are.
"""

from __future__ import annotations

import torch

from opsched.ir import Graph, Node
from opsched.transforms._rewrite import rename_uses, use_counts

__all__ = ["fold_batch_norm"]


def fold_batch_norm(graph: Graph) -> Graph:
    uses = use_counts(graph)
    producer = {n.name: n for n in graph.nodes}
    params = dict(graph.params)
    folded: dict[str, Node] = {}  # conv name -> folded conv
    mapping: dict[str, str] = {}  # bn name -> the value that replaces it

    def foldable(v: str) -> Node | None:
        p = producer.get(v)
        ok = p is not None and p.op == "conv2d" and p.attr("act", "none") == "none" and uses[v] == 1
        return p if ok and v not in folded else None

    for n in graph.nodes:
        if n.op != "batch_norm":
            continue
        src = producer.get(n.inputs[0])
        if src is None or uses[src.name] != 1:
            continue
        if src.op == "conv2d":
            convs = [foldable(src.name)]
        elif src.op == "concat" and src.attr("axis", 1) in (1, -3) and graph.types[src.name].rank == 4:
            convs = [foldable(v) for v in src.inputs]
        else:
            continue
        if any(c is None for c in convs) or len({c.name for c in convs}) != len(convs):  # type: ignore[union-attr]
            continue
        gamma, beta, mean, var = (graph.params[p] for p in n.params)
        scale = gamma / torch.sqrt(var + n.attr("eps", 1e-5))
        shift = beta - mean * scale
        start = 0
        for conv in convs:
            assert conv is not None
            w = graph.params[conv.params[0]]
            k = w.shape[0]
            s, t = scale[start:start + k], shift[start:start + k]
            b = graph.params[conv.params[1]] if len(conv.params) > 1 else torch.zeros(k, dtype=w.dtype, device=w.device)
            w_name, b_name = f"{conv.name}.weight.bn", f"{conv.name}.bias.bn"
            params[w_name] = (w * s.reshape(-1, 1, 1, 1)).to(w.dtype)
            params[b_name] = (b * s + t).to(w.dtype)
            folded[conv.name] = conv.replace(params=(w_name, b_name))
            start += k
        mapping[n.name] = src.name
    if not folded:
        return graph
    nodes = [folded.get(n.name, n) for n in graph.nodes if n.name not in mapping]
    return rename_uses(graph.replace(params=params), nodes, mapping)

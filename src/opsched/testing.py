"""Helpers for tests of opsched and of code built on it: tolerances and small random graphs."""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch

from opsched.ir import Graph, GraphBuilder

__all__ = ["TOLERANCES", "assert_close", "fork_join", "random_dag"]

#: Absolute tolerance relative to the reference's largest magnitude, per dtype. Floating-point
#: sums reassociate (BN folding, merged convolutions, other kernels), so bitwise equality is
#: not the contract; agreement to this many ulps of the output's scale is.
TOLERANCES: dict[torch.dtype, float] = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2,
                                        torch.float64: 1e-10}


def assert_close(actual: Sequence[torch.Tensor] | torch.Tensor, expected: Sequence[torch.Tensor] | torch.Tensor,
                 what: str = "output") -> None:
    """Assert equal shapes and ``max|a - e| <= tol * max(1, max|e|)`` for each pair."""
    acts = [a.detach() for a in ([actual] if isinstance(actual, torch.Tensor) else actual)]
    exps = [e.detach() for e in ([expected] if isinstance(expected, torch.Tensor) else expected)]
    assert len(acts) == len(exps), f"{what}: {len(acts)} tensors, expected {len(exps)}"
    for i, (a, e) in enumerate(zip(acts, exps)):
        assert a.shape == e.shape, f"{what}[{i}]: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        tol = TOLERANCES.get(e.dtype, 1e-4) * max(1.0, float(e.abs().max()))
        err = float((a.double() - e.double()).abs().max())
        assert err <= tol, f"{what}[{i}]: max abs error {err:.3g} exceeds {tol:.3g}"


def random_dag(n: int, seed: int, *, edge_prob: float = 0.35, channels: int = 4, size: int = 8) -> Graph:
    """A random connected DAG of ``n`` small convolutions and sums over one input.

    Node i reads a random subset of earlier nodes (or the input); several readers are summed
    first. Every node has the same shape, so any wiring is valid and every node is a conv2d
    (possibly preceded by an add), which makes the graph executable as well as schedulable.
    """
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    b = GraphBuilder(f"dag{n}_{seed}")
    x = b.input("x", (1, channels, size, size))
    outs: list[str] = []
    for i in range(n):
        preds = [o for o in outs if rng.random() < edge_prob] or [rng.choice(outs) if outs and rng.random() < 0.7 else x]
        src = preds[0] if len(preds) == 1 else b.add("add", preds, name=f"sum{i}")
        k = rng.choice((1, 3))
        w = b.param(f"w{i}", torch.randn(channels, channels, k, k, generator=gen) * (1.0 / (channels * k * k)) ** 0.5)
        outs.append(b.add("conv2d", [src], name=f"n{i}", params=[w], padding=k // 2, act="relu"))
    used = {v for node in b.nodes for v in node.inputs}
    sinks = [o for o in outs if o not in used]
    out = sinks[0] if len(sinks) == 1 else b.add("add", sinks, name="out")
    return b.build([out]).verify()


def fork_join(c_reads: str = "x") -> Graph:
    """1x1 convolutions on (1, 4, 8, 8): x -> a -> b; c reads ``c_reads`` ("x" or "a"); d = b + c."""
    b = GraphBuilder(f"fork_join_{c_reads}")
    x = b.input("x", (1, 4, 8, 8))
    w = b.param("w", torch.randn(4, 4, 1, 1))
    a = b.add("conv2d", [x], name="a", params=[w])
    bb = b.add("conv2d", [a], name="b", params=[w])
    c = b.add("conv2d", [{"x": x, "a": a}[c_reads]], name="c", params=[w])
    return b.build([b.add("add", [bb, c], name="d")])

"""The reference interpreter: run a graph in topological order, one kernel at a time.

It is the numeric oracle every executor is compared with, and the simplest complete runtime:
values are freed after their last use, and every failure names the node and op.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from opsched.errors import ExecutionError, InputMismatchError, OpschedError
from opsched.ir import Graph
from opsched.ir.ops import Kernel, torch_kernel

__all__ = ["Interpreter", "run_graph", "check_inputs"]


def check_inputs(graph: Graph, inputs: Sequence[torch.Tensor]) -> None:
    """Raise :class:`InputMismatchError` unless ``inputs`` match the graph's inputs exactly."""
    if len(inputs) != len(graph.inputs):
        raise InputMismatchError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs "
                                 f"({', '.join(i.name for i in graph.inputs)}), got {len(inputs)}")
    for spec, t in zip(graph.inputs, inputs):
        if not isinstance(t, torch.Tensor):
            raise InputMismatchError(f"input {spec.name!r} of graph {graph.name!r} must be a tensor, "
                                     f"got {type(t).__name__}")
        shape, dtype = tuple(t.shape), str(t.dtype).removeprefix("torch.")
        if shape == spec.type.shape and dtype != spec.type.dtype:
            again = (f", or optimize again with dtype={dtype!r} for a graph in that precision"
                     if t.is_floating_point() and getattr(torch, spec.type.dtype).is_floating_point else "")
            raise InputMismatchError(
                f"input {spec.name!r} of graph {graph.name!r}: expected {spec.type} ({spec.type.dtype}), got "
                f"{dtype} values of that shape; the graph (and any schedule for it) runs in the types it was "
                f"made for: pass the input as tensor.to(torch.{spec.type.dtype}){again}")
        if shape != spec.type.shape or dtype != spec.type.dtype:
            raise InputMismatchError(
                f"input {spec.name!r} of graph {graph.name!r}: expected {spec.type} "
                f"(shape {spec.type.shape}, {spec.type.dtype}), got shape {shape}, {dtype}; "
                f"the graph (and any schedule for it) is specialised to that shape: import or "
                f"optimize again with example inputs of the new shape (opsched.optimize_per_shape, or "
                f"torch.compile(model, backend='opsched'), schedules a model for each input shape it meets)")


class Interpreter:
    """Kernels bound once; ``__call__`` runs the graph on a list of input tensors."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.kernels: list[Kernel] = [torch_kernel(graph, n) for n in graph.nodes]
        # value name -> index of the node after which it is dead (never, for graph outputs)
        last: dict[str, int] = {}
        for i, n in enumerate(graph.nodes):
            for v in n.inputs:
                last[v] = i
        for v in graph.outputs:
            last[v] = len(graph.nodes)
        self._free_after: list[list[str]] = [[] for _ in graph.nodes]
        for v, i in last.items():
            if i < len(graph.nodes):
                self._free_after[i].append(v)

    @torch.no_grad()
    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        graph = self.graph
        check_inputs(graph, inputs)
        env: dict[str, torch.Tensor] = {i.name: t for i, t in zip(graph.inputs, inputs)}
        for i, (node, kernel) in enumerate(zip(graph.nodes, self.kernels)):
            try:
                env[node.name] = kernel(*(env[v] for v in node.inputs))
            except OpschedError:
                raise
            except Exception as e:
                raise ExecutionError(f"graph {graph.name!r}: node {node.name!r} ({node.op}) failed: "
                                     f"{type(e).__name__}: {e}") from e
            for v in self._free_after[i]:
                del env[v]
        return [env[v] for v in graph.outputs]


def run_graph(graph: Graph, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """``graph``'s outputs on ``inputs``, node by node: what the model returns, then the new
    values of the inputs it changes in place (:attr:`Graph.writes`); ``inputs`` are not changed."""
    return Interpreter(graph)(inputs)

"""GraphBuilder: build a graph op by op, with types inferred by the op registry."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from opsched.ir.graph import Graph, GraphInput, tensor_type
from opsched.ir.node import Node
from opsched.ir.schema import infer_type
from opsched.ir.types import FrozenAttrs, TensorType

__all__ = ["GraphBuilder"]


class GraphBuilder:
    """Accumulates nodes in creation order (which is topological by construction).

    >>> b = GraphBuilder("tiny")
    >>> x = b.input("x", (1, 3, 8, 8))
    >>> y = b.add("relu", [x])
    >>> b.build([y]).verify().name
    'tiny'
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.inputs: list[GraphInput] = []
        self.nodes: list[Node] = []
        self.params: dict[str, torch.Tensor] = {}
        self.callables: dict[str, Callable[..., Any]] = {}
        self._types: dict[str, TensorType] = {}
        self._count = 0

    def fresh(self, hint: str) -> str:
        while True:
            self._count += 1
            name = f"{hint}_{self._count}"
            if name not in self._types:
                return name

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32") -> str:
        t = TensorType(tuple(shape), dtype)
        self.inputs.append(GraphInput(name, t))
        self._types[name] = t
        return name

    def param(self, name: str, tensor: torch.Tensor) -> str:
        self.params[name] = tensor.detach()
        return name

    def add(self, op: str, inputs: Sequence[str], *, name: str | None = None,
            params: Sequence[str] = (), out: TensorType | None = None,
            fn: Callable[..., Any] | None = None, **attrs: Any) -> str:
        name = name or self.fresh(op)
        frozen = FrozenAttrs(attrs)
        inferred = infer_type(op, [self._types[v] for v in inputs], frozen,
                              [tensor_type(self.params[p]) for p in params])
        t = inferred if inferred is not None else out
        if t is None:
            raise ValueError(f"op {op!r} has no shape rule: pass out=")
        self.nodes.append(Node(name, op, tuple(inputs), t, frozen, tuple(params)))
        self._types[name] = t
        if fn is not None:
            self.callables[name] = fn
        return name

    def type(self, value: str) -> TensorType:
        return self._types[value]

    def holds(self, value: str) -> bool:
        """Whether ``value`` names an input or node added so far."""
        return value in self._types

    def mark(self) -> tuple[int, int]:
        """Where the graph stands: what :meth:`undo` goes back to."""
        return len(self.nodes), len(self.params)

    def undo(self, mark: tuple[int, int]) -> list[torch.Tensor]:
        """Take back every node and parameter added since ``mark``; returns the parameters."""
        nodes, params = mark
        for node in self.nodes[nodes:]:
            del self._types[node.name]
            self.callables.pop(node.name, None)
        del self.nodes[nodes:]
        return [self.params.pop(name) for name in list(self.params)[params:]]

    def build(self, outputs: Sequence[str], writes: Sequence[tuple[str, str]] = ()) -> Graph:
        """The graph returning ``outputs``; ``writes``: (graph input, its value after the call)
        for each input the model changes in place (:attr:`Graph.writes`)."""
        return Graph(self.name, tuple(self.inputs), tuple(self.nodes), (*outputs, *(v for _, v in writes)),
                     dict(self.params), dict(self.callables), tuple(name for name, _ in writes))

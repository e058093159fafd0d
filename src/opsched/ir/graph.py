"""The graph: nodes in topological order, graph inputs, outputs, and parameters beside them."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import torch

from opsched._toposort import kahn
from opsched.errors import (
    CycleError,
    DanglingInputError,
    DuplicateNameError,
    GraphError,
    OpschedError,
    ShapeMismatchError,
)
from opsched.ir.hashing import cost_signature, node_signature, structural_hash
from opsched.ir.node import Node
from opsched.ir.printer import format_graph
from opsched.ir.schema import infer_type
from opsched.ir.types import TensorType
from opsched.structure.fixed import FixedInput

__all__ = ["Graph", "GraphInput", "tensor_type", "random_inputs"]


def tensor_type(t: torch.Tensor) -> TensorType:
    return TensorType(tuple(int(d) for d in t.shape), str(t.dtype).removeprefix("torch."))


@dataclass(frozen=True, slots=True)
class GraphInput:
    name: str
    type: TensorType


@dataclass(frozen=True, eq=False)
class Graph:
    """An inference graph. Frozen: transforms return new graphs.

    ``params`` maps parameter names to tensors (weights stay out of the nodes, so structure and
    values can be hashed, printed and replaced separately); ``callables`` holds, for each
    ``opaque`` node, the Python callable that computes it from its input tensors.

    ``writes`` names the graph inputs the model changes in place (``x.add_(1)``, ``x[0] = 0``):
    the last ``len(writes)`` outputs are their values after the call, in that order, and a
    scheduled module copies them back into the caller's tensors; :attr:`returns` are the others,
    what the model returns.

    ``fixed_inputs`` are the model's inputs the graph computes for one value of, which are not
    among its inputs (:func:`opsched.from_onnx`'s ``input_values``): a module made of it is
    called with them too, or without them (:class:`~opsched.structure.FixedInput`).
    """

    name: str
    inputs: tuple[GraphInput, ...]
    nodes: tuple[Node, ...]
    outputs: tuple[str, ...]
    params: Mapping[str, torch.Tensor] = field(default_factory=dict)
    callables: Mapping[str, Callable[..., Any]] = field(default_factory=dict)
    writes: tuple[str, ...] = ()
    fixed_inputs: tuple[FixedInput, ...] = ()

    # --- derived facts (computed once) ----------------------------------------------------
    @cached_property
    def index(self) -> dict[str, int]:
        """Node name -> position in :attr:`nodes`."""
        return {n.name: i for i, n in enumerate(self.nodes)}

    @cached_property
    def types(self) -> dict[str, TensorType]:
        """Value name (graph input or node) -> its type."""
        types = {i.name: i.type for i in self.inputs}
        types.update((n.name, n.out) for n in self.nodes)
        return types

    @property
    def returns(self) -> tuple[str, ...]:
        """The outputs the model returns: all but the trailing values of the inputs it writes."""
        return self.outputs[:len(self.outputs) - len(self.writes)]

    @cached_property
    def dtypes(self) -> frozenset[str]:
        """The dtypes of its values and parameters (what a backend must hold to run it)."""
        return frozenset(t.dtype for t in (*self.types.values(), *self.param_types.values()))

    @cached_property
    def param_types(self) -> dict[str, TensorType]:
        return {k: tensor_type(v) for k, v in self.params.items()}

    @cached_property
    def preds(self) -> tuple[tuple[int, ...], ...]:
        """Per node index, the indices of the nodes it reads (graph inputs excluded, no repeats)."""
        idx = self.index
        return tuple(tuple(dict.fromkeys(idx[v] for v in n.inputs if v in idx)) for n in self.nodes)

    @cached_property
    def succs(self) -> tuple[tuple[int, ...], ...]:
        out: list[list[int]] = [[] for _ in self.nodes]
        for i, ps in enumerate(self.preds):
            for p in ps:
                out[p].append(i)
        return tuple(tuple(s) for s in out)

    @cached_property
    def readers(self) -> dict[str, tuple[str, ...]]:
        """Value name (graph input or node) -> the nodes that read it, in order, each once."""
        out: dict[str, dict[str, None]] = {i.name: {} for i in self.inputs}
        out.update((n.name, {}) for n in self.nodes)
        for n in self.nodes:
            for v in n.inputs:
                out[v][n.name] = None
        return {v: tuple(rs) for v, rs in out.items()}

    def node(self, name: str) -> Node:
        try:
            return self.nodes[self.index[name]]
        except KeyError:
            raise GraphError(f"graph {self.name!r} has no node {name!r}") from None

    def input_types(self, node: Node) -> list[TensorType]:
        return [self.types[v] for v in node.inputs]

    def node_param_types(self, node: Node) -> list[TensorType]:
        return [self.param_types[p] for p in node.params]

    def replace(self, **changes: Any) -> Graph:
        fields = {f: getattr(self, f) for f in ("name", "inputs", "nodes", "outputs", "params", "callables", "writes",
                                                "fixed_inputs")}
        fields.update(changes)
        return Graph(**fields)

    def __len__(self) -> int:
        return len(self.nodes)

    def __str__(self) -> str:
        return format_graph(self)

    @cached_property
    def signatures(self) -> dict[str, str]:
        """Node name -> :func:`~opsched.ir.hashing.node_signature` (what matters to its cost)."""
        return {n.name: node_signature(self, n) for n in self.nodes}

    @cached_property
    def cost_signatures(self) -> dict[str, str]:
        """Node name -> :func:`~opsched.ir.hashing.cost_signature` (its signature without a view's
        position in its input)."""
        return {n.name: cost_signature(self, n) for n in self.nodes}

    @cached_property
    def _structural_hash(self) -> str:
        return structural_hash(self)

    def structural_hash(self) -> str:
        """SHA-256 of the structure: ops, attrs, types, wiring; not weight values, not names."""
        return self._structural_hash

    # --- the checker ----------------------------------------------------------------------
    def verify(self) -> Graph:
        """Check every invariant of the IR and return ``self``.

        Raises :class:`DuplicateNameError`, :class:`DanglingInputError`, :class:`CycleError`,
        :class:`ShapeMismatchError` or :class:`GraphError` naming the offending node. A graph is
        frozen, so it is checked once; one that fails raises again on every call.
        """
        self._verified  # noqa: B018  (computed once; raises where an invariant is broken)
        return self

    @cached_property
    def _verified(self) -> bool:
        _check_references(self)
        _check_writes(self)
        _check_acyclic(self)
        _check_order_and_types(self)
        return True

    def subgraph(self, names: Iterable[str], name: str | None = None) -> Graph:
        """The nodes ``names`` as a graph of their own: values read from outside become inputs
        (in order of first use), values used outside or graph outputs become outputs."""
        keep = set(names)
        if missing := keep - self.index.keys():
            raise GraphError(f"graph {self.name!r} has no nodes {sorted(missing)}")
        # the kept nodes' own reads and readers, never the whole graph's: a search cuts out
        # hundreds of parts of a graph of tens of thousands of nodes
        nodes = tuple(self.nodes[i] for i in sorted(self.index[v] for v in keep))
        external: dict[str, None] = {}
        for n in nodes:
            for v in n.inputs:
                if v not in keep:
                    external.setdefault(v)
        exported = set(self.outputs)
        outputs = tuple(n.name for n in nodes
                        if n.name in exported or any(r not in keep for r in self.readers[n.name]))
        return Graph(
            name=name or f"{self.name}.sub",
            inputs=tuple(GraphInput(v, self.types[v]) for v in external),
            nodes=nodes,
            outputs=outputs,
            params={p: self.params[p] for n in nodes for p in n.params},
            callables={n.name: self.callables[n.name] for n in nodes if n.name in self.callables},
        )


def random_inputs(graph: Graph, device: str | torch.device = "cpu", seed: int = 0) -> list[torch.Tensor]:
    """Reproducible inputs of ``graph``'s input types on ``device``, to time and race plans with:
    floating-point ones drawn from a normal distribution; integer ones zero (an index valid in
    any table: a graph does not know how large its embeddings' vocabularies are) and boolean
    ones true."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for i in graph.inputs:
        dtype = getattr(torch, i.type.dtype)
        if dtype.is_floating_point or dtype.is_complex:
            drawn = dtype if dtype.is_complex else torch.float32  # complex: both parts drawn
            out.append(torch.randn(i.type.shape, generator=gen, dtype=drawn).to(device, dtype))
        else:
            out.append(torch.full(i.type.shape, dtype == torch.bool, dtype=dtype, device=device))
    return out


def _check_references(graph: Graph) -> None:
    """Every name defined once; every value, parameter and callable a node uses exists."""
    seen: set[str] = set()
    for name in [i.name for i in graph.inputs] + [n.name for n in graph.nodes]:
        if name in seen:
            raise DuplicateNameError(f"graph {graph.name!r}: the name {name!r} is defined twice")
        seen.add(name)
    for n in graph.nodes:
        for v in n.inputs:
            if v not in seen:
                raise DanglingInputError(
                    f"graph {graph.name!r}: node {n.name!r} ({n.op}) reads {v!r}, which nothing defines")
        for p in n.params:
            if p not in graph.params:
                raise DanglingInputError(
                    f"graph {graph.name!r}: node {n.name!r} ({n.op}) uses parameter {p!r}, which is missing")
        if n.op == "opaque" and n.name not in graph.callables:
            raise GraphError(f"graph {graph.name!r}: opaque node {n.name!r} has no callable")
    for v in graph.outputs:
        if v not in seen:
            raise DanglingInputError(f"graph {graph.name!r}: output {v!r} is not defined")


def _check_writes(graph: Graph) -> None:
    """Each write names a distinct graph input, and its value has that input's type."""
    inputs = {i.name: i.type for i in graph.inputs}
    if len(graph.writes) > len(graph.outputs) or len(set(graph.writes)) != len(graph.writes):
        raise GraphError(f"graph {graph.name!r}: writes {list(graph.writes)} must name distinct inputs, one per "
                         f"trailing output (it has {len(graph.outputs)} outputs)")
    for name, v in zip(graph.writes, graph.outputs[len(graph.outputs) - len(graph.writes):]):
        if name not in inputs:
            raise DanglingInputError(f"graph {graph.name!r}: writes {name!r}, which is not a graph input")
        if graph.types[v] != inputs[name]:
            raise ShapeMismatchError(f"graph {graph.name!r}: input {name!r} ({inputs[name]}) is written with "
                                     f"{v!r}, a {graph.types[v]}")


def _check_order_and_types(graph: Graph) -> None:
    """Nodes in topological order, each output type what its op's shape rule infers."""
    defined = {i.name for i in graph.inputs}
    for n in graph.nodes:
        late = [v for v in n.inputs if v not in defined]
        if late:
            raise GraphError(f"graph {graph.name!r}: nodes are not in topological order: "
                             f"node {n.name!r} reads {late[0]!r}, defined after it")
        defined.add(n.name)
        try:
            inferred = infer_type(n.op, graph.input_types(n), n.attrs, graph.node_param_types(n))
        except OpschedError as e:
            raise ShapeMismatchError(f"graph {graph.name!r}: node {n.name!r}: {e}") from None
        if inferred is not None and inferred != n.out:
            raise ShapeMismatchError(f"graph {graph.name!r}: node {n.name!r} ({n.op}) records output "
                                     f"{n.out} but its inputs give {inferred}")


def _check_acyclic(graph: Graph) -> None:
    """Kahn's algorithm over name references (the node order is not trusted here)."""
    names = {n.name for n in graph.nodes}
    by_name = {n.name: n for n in graph.nodes}
    stuck = set(kahn({n.name: {v for v in n.inputs if v in names} for n in graph.nodes}))
    if not stuck:
        return
    # Walk backwards from a blocked node until a name repeats: that is a cycle.
    cur = next(n.name for n in graph.nodes if n.name in stuck)
    path: list[str] = []
    while cur not in path:
        path.append(cur)
        cur = next(v for v in by_name[cur].inputs if v in stuck)
    cycle = path[path.index(cur):][::-1]
    raise CycleError(f"graph {graph.name!r} has a cycle: {' -> '.join(cycle + [cycle[0]])}")

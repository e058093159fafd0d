"""Sub-graph instances: a group of nodes computed as ``factor`` instances, each on its own equal
slice of the batch (GraphTurbo's sub-graph instances, split along the batch).

:func:`split_instances` rewrites a graph so that each node ``v`` of a split group becomes the
nodes ``v@0 .. v@{f-1}``, instance ``i`` computing samples ``[i*N/f, (i+1)*N/f)``. What an
instance reads from outside its group is the matching slice of the producer:

* from an instance of a group with the same factor, that instance's output itself;
* otherwise a *piece* ``u@a-b`` (samples ``a`` to ``b`` of ``u``): a ``slice`` of the one
  producer instance (or unsplit value) that covers them, a view in torch, or a ``concat`` of the
  producer instances that cover them (a group of 8 instances feeding one of 4: each consumer
  instance reads two producer instances, and depends on those two only).

A split node read by a node outside every group, or that is a graph output, is joined again
under its own name (a ``concat`` of its instances), so the rest of the graph is unchanged.

Which nodes split: an op that computes each sample from that sample alone (convolutions, batch
norm in inference, activations, pooling, elementwise ops with per-sample or broadcast operands,
linear layers, concat/slice/softmax/mean off the batch axis, reshapes that keep the batch
outermost). Generic ATen and ONNX nodes do not (their attributes may carry the batch), nor do
opaque ones. :func:`split_refusal` says why a node cannot split.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opsched.errors import InvalidScheduleError, ShapeMismatchError
from opsched.ir import Graph, Node, TensorType
from opsched.ir.schema import infer_type
from opsched.ir.types import FrozenAttrs

__all__ = ["Split", "split_instances", "split_refusal", "instance_name", "BATCH_SEPARABLE"]

#: Ops whose every output sample depends on the same sample of their inputs alone (given the
#: axis checks of :func:`split_refusal`).
BATCH_SEPARABLE = frozenset({
    "conv2d", "batch_norm", "linear", "relu", "relu6", "sigmoid", "silu", "tanh", "gelu", "hardsigmoid",
    "hardswish", "softmax", "add", "mul", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "mean", "pad",
    "concat", "slice", "flatten", "reshape", "identity",
})
_BROADCASTING = frozenset({"add", "mul"})


@dataclass(frozen=True, slots=True)
class Split:
    """The nodes ``nodes`` (a group, in any order) computed as ``factor`` instances along the batch."""

    nodes: tuple[str, ...]
    factor: int

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:
            raise InvalidScheduleError("a split needs at least one node")
        if not isinstance(self.factor, int) or self.factor < 2:
            raise InvalidScheduleError(f"a split's factor is an int of at least 2, got {self.factor!r} "
                                       f"(for nodes {list(self.nodes[:3])}...)")

    def to_dict(self) -> dict[str, object]:
        return {"nodes": list(self.nodes), "factor": self.factor}


def instance_name(node: str, i: int) -> str:
    """The name of instance ``i`` of ``node``."""
    return f"{node}@{i}"


def _piece_name(value: str, start: int, end: int) -> str:
    return f"{value}@{start}-{end}"


def split_refusal(graph: Graph, node: Node, batch: int) -> str | None:
    """Why ``node`` cannot be computed per slice of a batch of ``batch``, or ``None`` if it can."""
    if node.op not in BATCH_SEPARABLE:
        return f"op {node.op!r} is not known to compute each sample on its own"
    rank = node.out.rank
    if rank == 0 or node.out.shape[0] != batch:
        return f"its output {node.out} does not lead with the batch ({batch})"
    for v in node.inputs:
        t = graph.types[v]
        if _sliced(node, t, batch) or (node.op in _BROADCASTING and (t.rank < rank or t.shape[0] == 1)):
            continue  # sliced per instance, or broadcast along the batch (every instance reads all of it)
        return f"its input {v!r} ({t}) does not lead with the batch ({batch})"
    axis = {"concat": node.attr("axis", 1), "slice": node.attr("axis"), "softmax": node.attr("axis", -1)}.get(node.op)
    if axis is not None and axis % rank == 0:
        return f"it works along the batch axis (axis={axis})"
    if node.op == "mean" and any(d % graph.types[node.inputs[0]].rank == 0 for d in node.attr("dims")):
        return "it reduces over the batch axis"
    if node.op == "flatten" and node.attr("start_dim", 1) % graph.types[node.inputs[0]].rank == 0:
        return "it flattens the batch axis"
    if node.op == "pad" and len(node.attr("pads")) // 2 >= graph.types[node.inputs[0]].rank:
        return "it pads the batch axis"
    return None


def _sliced(node: Node, t: TensorType, batch: int) -> bool:
    """Whether ``node``'s instances read their slice of an input of type ``t`` (else all of it,
    broadcast: an elementwise operand of lower rank or of batch 1)."""
    if node.op in _BROADCASTING:
        return t.rank == node.out.rank and t.shape[0] == batch
    return t.rank >= 1 and t.shape[0] == batch


def split_instances(graph: Graph, splits: Sequence[Split]) -> Graph:
    """``graph`` with each split's nodes computed as instances (see the module docstring).

    Raises :class:`~opsched.errors.InvalidScheduleError` naming the node for a split that names
    a node twice or one the graph lacks, a factor that does not divide the batch, or a node that
    cannot split (and why)."""
    if not splits:
        return graph
    batch = graph.inputs[0].type.shape[0] if graph.inputs and graph.inputs[0].type.rank else 1
    factor_of: dict[str, int] = {}
    group_of: dict[str, int] = {}
    for k, split in enumerate(splits):
        if batch % split.factor:
            raise InvalidScheduleError(f"split {k} of graph {graph.name!r}: factor {split.factor} does not divide "
                                       f"the batch of {batch}")
        for v in split.nodes:
            if v in group_of:
                raise InvalidScheduleError(f"node {v!r} is in splits {group_of[v]} and {k}")
            node = graph.node(v) if v in graph.index else None
            if node is None:
                raise InvalidScheduleError(f"split {k} names {v!r}, which is not a node of graph {graph.name!r}")
            why = split_refusal(graph, node, batch)
            if why is not None:
                raise InvalidScheduleError(f"node {v!r} ({node.op}) of graph {graph.name!r} cannot be split along "
                                           f"the batch: {why}")
            group_of[v], factor_of[v] = k, split.factor
    return _Splitter(graph, batch, group_of, factor_of).graph()


class _Splitter:
    """One rewrite: nodes emitted in the graph's order, pieces and joins made where first read."""

    def __init__(self, graph: Graph, batch: int, group_of: dict[str, int], factor_of: dict[str, int]) -> None:
        self.g, self.batch, self.group_of, self.factor_of = graph, batch, group_of, factor_of
        self.nodes: list[Node] = []
        self.made: dict[tuple[str, int, int], str] = {}  # (value, start, end) -> the value holding those samples
        self.names = set(graph.index) | {i.name for i in graph.inputs}
        self.types = dict(graph.types)  # of the values made too

    def graph(self) -> Graph:
        g = self.g
        for node in g.nodes:
            if node.name in self.group_of:
                f = self.factor_of[node.name]
                for i in range(f):
                    self._instance(node, f, i)
            else:
                self.nodes.append(node.replace(inputs=tuple(self._whole(v) for v in node.inputs)))
        outputs = tuple(self._whole(v) for v in g.outputs)
        return g.replace(nodes=tuple(self.nodes), outputs=outputs).verify()

    def _fresh(self, name: str) -> str:
        if name in self.names:
            raise InvalidScheduleError(f"graph {self.g.name!r} already has a value named {name!r}, the name a split "
                                       f"gives an instance; rename the node")
        self.names.add(name)
        return name

    def _instance(self, node: Node, f: int, i: int) -> None:
        size = self.batch // f
        start, end = i * size, (i + 1) * size
        inputs = []
        for v in node.inputs:
            inputs.append(self._samples(v, start, end) if _sliced(node, self.g.types[v], self.batch) else v)
        attrs = dict(node.attrs)
        if node.op == "reshape":
            attrs["shape"] = (size, *tuple(attrs["shape"])[1:])
        out = TensorType((size, *node.out.shape[1:]), node.out.dtype)
        made = Node(self._fresh(instance_name(node.name, i)), node.op, tuple(inputs), out, FrozenAttrs(attrs),
                    node.params)
        try:
            inferred = infer_type(made.op, [self.types[v] for v in made.inputs], made.attrs,
                                  [self.g.param_types[p] for p in made.params])
        except ShapeMismatchError as e:
            raise InvalidScheduleError(f"instance {i} of node {node.name!r} ({node.op}): {e}") from None
        if inferred is not None and inferred != out:
            raise InvalidScheduleError(f"instance {i} of node {node.name!r} ({node.op}) computes {inferred}, "
                                       f"expected {out}")
        self.nodes.append(made)
        self.types[made.name] = out
        self.made[(node.name, start, end)] = made.name

    def _whole(self, value: str) -> str:
        """The value holding all of ``value``: itself, or its instances joined under its name."""
        if value not in self.group_of or (value, 0, self.batch) in self.made:
            return value
        return self._samples(value, 0, self.batch, name=value)

    def _samples(self, value: str, start: int, end: int, name: str | None = None) -> str:
        """The value holding samples ``[start, end)`` of ``value``, made if need be."""
        key = (value, start, end)
        if key in self.made:
            return self.made[key]
        f = self.factor_of.get(value, 1)
        size = self.batch // f
        t = self.g.types[value]
        if f == 1:  # an unsplit value: a view of its samples
            made = self._add("slice", [value], name or _piece_name(value, start, end), t, (start, end),
                             {"axis": 0, "start": start, "end": end})
        else:
            parts = []
            for i in range(start // size, (end - 1) // size + 1):
                a, b = max(start, i * size), min(end, (i + 1) * size)
                inst = self.made[(value, i * size, (i + 1) * size)]
                parts.append(inst if (a, b) == (i * size, (i + 1) * size) else
                             self._add("slice", [inst], _piece_name(value, a, b), t, (a, b),
                                       {"axis": 0, "start": a - i * size, "end": b - i * size}))
            made = parts[0] if len(parts) == 1 else self._add("concat", parts, name or _piece_name(value, start, end),
                                                              t, (start, end), {"axis": 0})
        self.made[key] = made
        return made

    def _add(self, op: str, inputs: Iterable[str], name: str, whole: TensorType, samples: tuple[int, int],
             attrs: dict[str, object]) -> str:
        out = TensorType((samples[1] - samples[0], *whole.shape[1:]), whole.dtype)
        self.nodes.append(Node(self._fresh(name) if name not in self.g.index else name, op, tuple(inputs), out,
                               FrozenAttrs(attrs)))
        self.types[name] = out
        return name

"""Sub-graph instances: a group of nodes computed as ``factor`` instances, each on its own equal
slice of the batch, or on its own band of rows with halos (GraphTurbo's sub-graph instances).

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

A split along the rows (``axis=2``, the height of NCHW values) works the same way with the rows
of :mod:`opsched.transforms.halos`: instance ``i`` of node ``v`` is ``v@i`` computing the rows
its readers need, halos included; it reads a band of a value from outside the group (a piece
``u@rows{a}-{b}``), the rows it needs of an instance of its own group (``v@i:{a}-{b}``, a slice
where that instance computed more), and an edge instance pads explicitly where the op padded
(``v@i:pad``). An instance reading another row split reads the shares of the producer instances
that cover its rows (a ``concat`` of their slices where it needs more than one: its halo comes
from its neighbours), so it depends on those alone and a depth-first order can follow a band
through the groups. Where anything else reads a row-split value, it is joined from each
instance's share of its rows; a row split reads a batch-split value whole.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from opsched.errors import InvalidScheduleError, ShapeMismatchError
from opsched.ir import Graph, Node, TensorType
from opsched.ir.ops import pair
from opsched.ir.schema import infer_type
from opsched.ir.types import FrozenAttrs
from opsched.transforms.halos import ROW_AXIS, RowPlan, row_plan, row_sliced, window_of

__all__ = ["Split", "SplitGraph", "split_instances", "split_graph", "split_refusal", "instance_name",
           "BATCH_SEPARABLE", "AXES"]

#: The axes a split cuts: the batch, or the rows (height) of NCHW values.
AXES = (0, ROW_AXIS)

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
    """The nodes ``nodes`` (a group, in any order) computed as ``factor`` instances along the batch
    (``axis=0``) or the rows of NCHW values (``axis=2``)."""

    nodes: tuple[str, ...]
    factor: int
    axis: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))
        if not self.nodes:
            raise InvalidScheduleError("a split needs at least one node")
        if not isinstance(self.factor, int) or self.factor < 2:
            raise InvalidScheduleError(f"a split's factor is an int of at least 2, got {self.factor!r} "
                                       f"(for nodes {list(self.nodes[:3])}...)")
        if self.axis not in AXES:
            raise InvalidScheduleError(f"a split cuts axis 0 (the batch) or {ROW_AXIS} (the rows), got {self.axis!r} "
                                       f"(for nodes {list(self.nodes[:3])}...)")

    @property
    def along(self) -> str:
        return "the batch" if self.axis == 0 else "the rows"

    def to_dict(self) -> dict[str, object]:
        return {"nodes": list(self.nodes), "factor": self.factor, **({"axis": self.axis} if self.axis else {})}


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


@dataclass(frozen=True)
class SplitGraph:
    """A graph rewritten with splits, and for each node it made that belongs to one instance (the
    instance itself, its explicit padding, its slices of its own group's instances), the split's
    index and the instance's. Pieces and joins between groups belong to no instance."""

    graph: Graph
    owner: Mapping[str, tuple[int, int]]


def split_instances(graph: Graph, splits: Sequence[Split]) -> Graph:
    """``graph`` with each split's nodes computed as instances (see the module docstring).

    Raises :class:`~opsched.errors.InvalidScheduleError` naming the node for a split that names
    a node twice or one the graph lacks, a factor that does not divide the batch or exceeds a
    value's rows, or a node that cannot split (and why)."""
    return split_graph(graph, splits).graph


def split_graph(graph: Graph, splits: Sequence[Split]) -> SplitGraph:
    """:func:`split_instances`, with which instance each node it made belongs to."""
    if not splits:
        return SplitGraph(graph, {})
    batch = graph.inputs[0].type.shape[0] if graph.inputs and graph.inputs[0].type.rank else 1
    group_of: dict[str, int] = {}
    plans: dict[int, RowPlan] = {}
    for k, split in enumerate(splits):
        if split.axis == 0 and batch % split.factor:
            raise InvalidScheduleError(f"split {k} of graph {graph.name!r}: factor {split.factor} does not divide "
                                       f"the batch of {batch}")
        for v in split.nodes:
            if v in group_of:
                raise InvalidScheduleError(f"node {v!r} is in splits {group_of[v]} and {k}")
            node = graph.node(v) if v in graph.index else None
            if node is None:
                raise InvalidScheduleError(f"split {k} names {v!r}, which is not a node of graph {graph.name!r}")
            why = split_refusal(graph, node, batch) if split.axis == 0 else None
            if why is not None:
                raise InvalidScheduleError(f"node {v!r} ({node.op}) of graph {graph.name!r} cannot be split along "
                                           f"the batch: {why}")
            group_of[v] = k
        if split.axis == ROW_AXIS:
            plans[k] = row_plan(graph, split.nodes, split.factor)
    return _Splitter(graph, batch, tuple(splits), group_of, plans).split()


def _resized(t: TensorType, axis: int, size: int) -> TensorType:
    shape = list(t.shape)
    shape[axis] = size
    return TensorType(tuple(shape), t.dtype)


class _Splitter:
    """One rewrite: nodes emitted in the graph's order, pieces and joins made where first read."""

    def __init__(self, graph: Graph, batch: int, splits: tuple[Split, ...], group_of: dict[str, int],
                 plans: dict[int, RowPlan]) -> None:
        self.g, self.batch, self.splits, self.group_of, self.plans = graph, batch, splits, group_of, plans
        self.nodes: list[Node] = []
        self.made: dict[tuple[str, int, int], str] = {}  # (value, start, end) -> the value holding those samples
        self.bands: dict[tuple[str, int, int], str] = {}  # (value, start, end) -> the value holding those rows
        self.names = set(graph.index) | {i.name for i in graph.inputs}
        self.types = dict(graph.types)  # of the values made too
        self.owner: dict[str, tuple[int, int]] = {}

    def split(self) -> SplitGraph:
        g = self.g
        for node in g.nodes:
            k = self.group_of.get(node.name)
            if k is None:
                self.nodes.append(node.replace(inputs=tuple(self._whole(v) for v in node.inputs)))
                continue
            for i in range(self.splits[k].factor):
                if self.splits[k].axis == 0:
                    self._instance(node, k, i)
                else:
                    self._row_instance(node, k, i)
        outputs = tuple(self._whole(v) for v in g.outputs)
        return SplitGraph(g.replace(nodes=tuple(self.nodes), outputs=outputs).verify(), self.owner)

    def _fresh(self, name: str) -> str:
        if name in self.names:
            raise InvalidScheduleError(f"graph {self.g.name!r} already has a value named {name!r}, the name a split "
                                       f"gives an instance; rename the node")
        self.names.add(name)
        return name

    def _factor(self, value: str) -> int:
        """The factor of ``value``'s batch split; 1 where it is not split along the batch."""
        k = self.group_of.get(value)
        return 1 if k is None or self.splits[k].axis else self.splits[k].factor

    def _checked(self, node: Node, made: Node, i: int) -> None:
        """Add instance ``i`` of ``node`` once its type checks."""
        try:
            inferred = infer_type(made.op, [self.types[v] for v in made.inputs], made.attrs,
                                  [self.g.param_types[p] for p in made.params])
        except ShapeMismatchError as e:
            raise InvalidScheduleError(f"instance {i} of node {node.name!r} ({node.op}): {e}") from None
        if inferred is not None and inferred != made.out:
            raise InvalidScheduleError(f"instance {i} of node {node.name!r} ({node.op}) computes {inferred}, "
                                       f"expected {made.out}")
        self.nodes.append(made)
        self.types[made.name] = made.out

    # --- along the batch ------------------------------------------------------------------------
    def _instance(self, node: Node, k: int, i: int) -> None:
        size = self.batch // self.splits[k].factor
        start, end = i * size, (i + 1) * size
        inputs = []
        for v in node.inputs:
            inputs.append(self._samples(v, start, end) if _sliced(node, self.g.types[v], self.batch)
                          else self._whole(v))
        attrs = dict(node.attrs)
        if node.op == "reshape":
            attrs["shape"] = (size, *tuple(attrs["shape"])[1:])
        made = Node(self._fresh(instance_name(node.name, i)), node.op, tuple(inputs), _resized(node.out, 0, size),
                    FrozenAttrs(attrs), node.params)
        self._checked(node, made, i)
        self.owner[made.name] = (k, i)
        self.made[(node.name, start, end)] = made.name

    def _whole(self, value: str) -> str:
        """The value holding all of ``value``: itself, or its instances joined under its name."""
        k = self.group_of.get(value)
        if k is None or (value, 0, self.batch) in self.made:
            return value
        made = self._join_rows(value, k) if self.splits[k].axis else self._samples(value, 0, self.batch, name=value)
        self.made[(value, 0, self.batch)] = made
        return made

    def _samples(self, value: str, start: int, end: int, name: str | None = None) -> str:
        """The value holding samples ``[start, end)`` of ``value``, made if need be."""
        key = (value, start, end)
        if key in self.made:
            return self.made[key]
        f = self._factor(value)
        size = self.batch // f
        t = self.g.types[value]
        if f == 1:  # an unsplit value (or one joined from its rows): a view of its samples
            made = self._add("slice", [self._whole(value)], name or _piece_name(value, start, end),
                             _resized(t, 0, end - start), {"axis": 0, "start": start, "end": end})
        else:
            parts = []
            for i in range(start // size, (end - 1) // size + 1):
                a, b = max(start, i * size), min(end, (i + 1) * size)
                inst = self.made[(value, i * size, (i + 1) * size)]
                parts.append(inst if (a, b) == (i * size, (i + 1) * size) else
                             self._add("slice", [inst], _piece_name(value, a, b), _resized(t, 0, b - a),
                                       {"axis": 0, "start": a - i * size, "end": b - i * size}))
            made = parts[0] if len(parts) == 1 else self._add("concat", parts, name or _piece_name(value, start, end),
                                                              _resized(t, 0, end - start), {"axis": 0})
        self.made[key] = made
        return made

    # --- along the rows -------------------------------------------------------------------------
    def _row_instance(self, node: Node, k: int, i: int) -> None:
        plan = self.plans[k]
        name = instance_name(node.name, i)
        inputs = []
        for x in node.inputs:
            t = self.g.types[x]
            if not row_sliced(node, t):
                inputs.append(self._whole(x))  # broadcast along the rows: every instance reads all of it
                continue
            lo, hi = plan.reads[(node.name, x)][i]
            a, b = max(lo, 0), min(hi, t.shape[ROW_AXIS])
            src = self._rows(x, a, b, k, i)
            if (lo, hi) != (a, b):  # the op's padding, on an edge instance
                value = float("-inf") if node.op == "max_pool2d" else 0.0
                src = self._add("pad", [src], f"{name}:pad", _resized(t, ROW_AXIS, hi - lo),
                                {"pads": (0, 0, a - lo, hi - b), "value": value}, owner=(k, i))
            inputs.append(src)
        attrs = dict(node.attrs)
        if window_of(self.g, node) is not None:
            attrs["padding"] = (0, pair(attrs.get("padding", 0))[1])
        a, b = plan.computes[node.name][i]
        made = Node(self._fresh(name), node.op, tuple(inputs), _resized(node.out, ROW_AXIS, b - a),
                    FrozenAttrs(attrs), node.params)
        self._checked(node, made, i)
        self.owner[made.name] = (k, i)

    def _rows(self, value: str, a: int, b: int, k: int, i: int) -> str:
        """The value holding rows ``[a, b)`` of ``value`` for instance ``i`` of row split ``k``."""
        producer = self.group_of.get(value)
        if producer == k:  # an instance of the same group: its own rows, or a slice of them
            return self._own_rows(value, a, b, k, i)
        t = self.g.types[value]
        key = (value, a, b)
        if key in self.bands:
            return self.bands[key]
        if producer is not None and self.splits[producer].axis == ROW_AXIS:
            # another row split: the shares of its instances that cover the rows (halos from the neighbours)
            parts = [self._own_rows(value, max(a, s), min(b, e), producer, j)
                     for j, (s, e) in enumerate(self.plans[producer].shares[value]) if s < b and a < e]
            made = parts[0] if len(parts) == 1 else self._add("concat", parts, f"{value}@rows{a}-{b}",
                                                              _resized(t, ROW_AXIS, b - a), {"axis": ROW_AXIS})
        elif (a, b) == (0, t.shape[ROW_AXIS]):
            made = self._whole(value)
        else:
            made = self._add("slice", [self._whole(value)], f"{value}@rows{a}-{b}", _resized(t, ROW_AXIS, b - a),
                             {"axis": ROW_AXIS, "start": a, "end": b})
        self.bands[key] = made
        return made

    def _own_rows(self, value: str, a: int, b: int, k: int, i: int) -> str:
        ua, ub = self.plans[k].computes[value][i]
        inst = instance_name(value, i)
        name = f"{inst}:{a}-{b}"
        if (a, b) == (ua, ub) or name in self.types:
            return inst if (a, b) == (ua, ub) else name
        return self._add("slice", [inst], name, _resized(self.g.types[value], ROW_AXIS, b - a),
                         {"axis": ROW_AXIS, "start": a - ua, "end": b - ua}, owner=(k, i))

    def _join_rows(self, value: str, k: int) -> str:
        """``value`` whole again: each instance's share of its rows, concatenated."""
        shares = self.plans[k].shares[value]
        parts = [self._own_rows(value, a, b, k, i) for i, (a, b) in enumerate(shares)]
        return self._add("concat", parts, value, self.g.types[value], {"axis": ROW_AXIS})

    def _add(self, op: str, inputs: Iterable[str], name: str, out: TensorType, attrs: dict[str, object],
             owner: tuple[int, int] | None = None) -> str:
        self.nodes.append(Node(self._fresh(name) if name not in self.g.index else name, op, tuple(inputs), out,
                               FrozenAttrs(attrs)))
        self.types[name] = out
        if owner is not None:
            self.owner[name] = owner
        return name

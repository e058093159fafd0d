"""Row ranges of a spatial split: which rows of each value every instance of a group computes,
halos included (GraphTurbo's spatial sub-graph instances).

A group split ``f`` ways along the height (axis 2 of its NCHW values) gives instance ``i`` an
equal share of the rows of every value the group *exports* (that a node outside the group reads,
or that is a graph output): rows ``[i*H//f, (i+1)*H//f)``. Walking the group's nodes from the
last to the first, each node's instance computes the union of its own share (if exported) and
the rows its readers inside the group need of it. A pointwise op (batch norm, an activation, an
elementwise op, a channel concat) needs the rows it computes; a window op (convolution, pooling)
with kernel ``k``, stride ``s``, padding ``p`` and dilation ``d`` computing rows ``[a, b)`` needs
input rows ``[a*s - p, (b-1)*s - p + d*(k-1) + 1)``. Where neighbouring instances need the same
rows, each computes them: that overlap is the *halo*, recomputed. Rows a window reaches above the
first row or below the last are the op's padding, which the rewrite makes explicit on the
instances at the edges (zeros for convolutions and average pooling, ``-inf`` for max pooling).

:func:`row_refusal` says which nodes cannot split along the rows, and why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from opsched.errors import InvalidScheduleError
from opsched.ir import Graph, Node, TensorType
from opsched.ir.ops import pair
from opsched.ir.schema import node_flops

__all__ = ["ROW_SEPARABLE", "Rows", "RowPlan", "row_plan", "row_refusal", "row_sliced", "window_of", "ROW_AXIS"]

#: The axis a spatial split cuts: the height of an NCHW value.
ROW_AXIS = 2

#: Ops whose every output row depends on a window of rows of their inputs alone.
ROW_SEPARABLE = frozenset({
    "conv2d", "batch_norm", "relu", "relu6", "sigmoid", "silu", "tanh", "gelu", "hardsigmoid", "hardswish", "add",
    "mul", "max_pool2d", "avg_pool2d", "concat", "identity",
})
_WINDOWED = frozenset({"conv2d", "max_pool2d", "avg_pool2d"})

Rows = tuple[int, int]  # [start, end) along the height


@dataclass(frozen=True, slots=True)
class Window:
    """A sliding window along the height: kernel, stride, padding, dilation."""

    kernel: int
    stride: int
    padding: int
    dilation: int

    def needs(self, rows: Rows) -> Rows:
        """The input rows (unclipped: below 0 or past the end is padding) that output ``rows`` read."""
        a, b = rows
        reach = self.dilation * (self.kernel - 1) + 1
        return (a * self.stride - self.padding, (b - 1) * self.stride - self.padding + reach)


def window_of(graph: Graph, node: Node) -> Window | None:
    """The window along the height of a convolution or pooling node; ``None`` for a pointwise one."""
    if node.op not in _WINDOWED:
        return None
    kernel = graph.param_types[node.params[0]].shape[2] if node.op == "conv2d" else pair(node.attr("kernel"))[0]
    stride = pair(node.attr("stride", 1 if node.op == "conv2d" else node.attr("kernel")))[0]
    return Window(kernel, stride, pair(node.attr("padding", 0))[0], pair(node.attr("dilation", 1))[0])


def row_sliced(node: Node, t: TensorType) -> bool:
    """Whether ``node``'s instances read their rows of an input of type ``t`` (else all of it: an
    elementwise operand broadcast along the height)."""
    return t.rank == 4 and (node.op in _WINDOWED or t.shape[ROW_AXIS] == node.out.shape[ROW_AXIS])


def row_refusal(graph: Graph, node: Node) -> str | None:
    """Why ``node`` cannot be computed per band of rows, or ``None`` if it can."""
    if node.op not in ROW_SEPARABLE:
        return f"op {node.op!r} is not known to compute each row from a window of rows"
    if node.out.rank != 4:
        return f"its output {node.out} is not NCHW"
    if node.op == "concat" and node.attr("axis", 1) % 4 != 1:
        return f"it concatenates along axis {node.attr('axis', 1)}, not the channels"
    if node.op == "avg_pool2d" and node.attr("ceil_mode", False):
        return "an average pool in ceil mode divides its last window by a clipped count"
    if node.op == "avg_pool2d" and pair(node.attr("padding", 0))[0] and not node.attr("count_include_pad", True):
        return "an average pool that leaves padding out of its count cannot take explicit padding"
    for v in node.inputs:
        t = graph.types[v]
        if row_sliced(node, t) or (node.op in ("add", "mul") and (t.rank < 2 or t.shape[-2] == 1)):
            continue
        return f"its input {v!r} ({t}) neither has its rows nor broadcasts along them"
    return None


def _shares(height: int, factor: int) -> tuple[Rows, ...]:
    return tuple((i * height // factor, (i + 1) * height // factor) for i in range(factor))


def _union(a: Rows | None, b: Rows) -> Rows:
    return b if a is None else (min(a[0], b[0]), max(a[1], b[1]))


@dataclass(frozen=True)
class RowPlan:
    """A group split ``factor`` ways along the rows. Per instance: ``computes[v]``, the rows of
    node ``v``'s output it computes; ``reads[(v, x)]``, the rows of input ``x`` that node ``v``
    needs (unclipped: what lies outside ``x`` is padding); ``shares[v]``, for an exported value,
    the rows it contributes to the joined whole; ``outside[x]``, the rows of a value from outside
    the group that it reads."""

    factor: int
    computes: Mapping[str, tuple[Rows, ...]]
    reads: Mapping[tuple[str, str], tuple[Rows, ...]]
    shares: Mapping[str, tuple[Rows, ...]]
    outside: Mapping[str, tuple[Rows, ...]]

    def recompute(self, graph: Graph) -> float:
        """The group's FLOPs as split (halos computed twice) over its FLOPs unsplit."""
        whole = split = 0.0
        for v, rows in self.computes.items():
            node = graph.node(v)
            flops = node_flops(node, graph.input_types(node), graph.node_param_types(node))
            whole += flops
            split += flops * sum(b - a for a, b in rows) / node.out.shape[ROW_AXIS]
        return split / whole if whole else 1.0


def row_plan(graph: Graph, nodes: Iterable[str], factor: int) -> RowPlan:
    """The rows every instance of ``nodes`` computes when split ``factor`` ways along the height.

    Raises :class:`~opsched.errors.InvalidScheduleError` naming the node for one that cannot
    split along the rows (and why), or an exported value with fewer rows than instances."""
    index = graph.index
    members = sorted(set(nodes), key=index.__getitem__)
    inside = set(members)
    for v in members:
        why = row_refusal(graph, graph.node(v))
        if why is not None:
            raise InvalidScheduleError(f"node {v!r} ({graph.node(v).op}) of graph {graph.name!r} cannot be split "
                                       f"along the rows: {why}")
    shares: dict[str, tuple[Rows, ...]] = {}
    need: dict[str, list[Rows | None]] = {v: [None] * factor for v in members}
    computed: dict[str, tuple[Rows, ...]] = {}
    reads: dict[tuple[str, str], tuple[Rows, ...]] = {}
    outside: dict[str, list[Rows | None]] = {}
    for v in reversed(members):
        node = graph.node(v)
        height = node.out.shape[ROW_AXIS]
        read_after = v in graph.outputs or any(graph.nodes[s].name not in inside for s in graph.succs[index[v]])
        if read_after or all(r is None for r in need[v]):
            if height < factor:
                raise InvalidScheduleError(f"node {v!r} ({node.op}) of graph {graph.name!r}: its {height} rows "
                                           f"cannot be shared by {factor} instances")
            shares[v] = _shares(height, factor)
            need[v] = [_union(r, s) for r, s in zip(need[v], shares[v])]
        computes = tuple(r for r in need[v] if r is not None)
        if len(computes) != factor or any(a >= b for a, b in computes):
            raise InvalidScheduleError(f"node {v!r} ({node.op}) of graph {graph.name!r}: an instance of a "
                                       f"{factor}-way split along the rows computes none of its rows")
        computed[v] = computes
        win = window_of(graph, node)
        for x in dict.fromkeys(node.inputs):
            t = graph.types[x]
            if not row_sliced(node, t):
                continue
            wanted = tuple(win.needs(r) if win else r for r in computes)
            reads[(v, x)] = wanted
            clipped = [(max(a, 0), min(b, t.shape[ROW_AXIS])) for a, b in wanted]
            into = need[x] if x in inside else outside.setdefault(x, [None] * factor)
            for i, r in enumerate(clipped):
                into[i] = _union(into[i], r)
    bands = {x: tuple(r for r in rows if r is not None) for x, rows in outside.items()}  # every instance reads
    return RowPlan(factor, {v: computed[v] for v in members}, reads, shares, bands)

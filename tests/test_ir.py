"""IR invariants: verify() names every broken invariant; hashes see structure only."""

from __future__ import annotations

import pytest
import torch

from opsched.errors import (
    CycleError,
    DanglingInputError,
    DuplicateNameError,
    GraphError,
    ShapeMismatchError,
    UnknownOpError,
)
from opsched.ir import FrozenAttrs, Graph, GraphBuilder, Node, TensorType
from opsched.ir.analysis import critical_path, generations, max_antichain, width
from opsched.testing import random_dag


def conv(b: GraphBuilder, x: str, cout: int, k: int = 1, name: str | None = None, seed: int = 0) -> str:
    cin = b.type(x).shape[1]
    w = b.param(b.fresh("w"), torch.randn(cout, cin, k, k, generator=torch.Generator().manual_seed(seed)))
    return b.add("conv2d", [x], name=name, params=[w], padding=k // 2, act="relu")


def inception_like(b: GraphBuilder, x: str, seed: int) -> str:
    a = conv(b, x, 8, 1, seed=seed)
    c = conv(b, conv(b, x, 4, 1, seed=seed + 1), 8, 3, seed=seed + 2)
    p = b.add("max_pool2d", [x], kernel=3, stride=1, padding=1)
    return b.add("concat", [a, c, p], axis=1)


def diamond() -> Graph:
    b = GraphBuilder("diamond")
    x = b.input("x", (1, 4, 8, 8))
    a = b.add("relu", [x], name="a")
    left = b.add("sigmoid", [a], name="l")
    right = b.add("tanh", [a], name="r")
    d = b.add("add", [left, right], name="d")
    return b.build([d])


def test_builder_graph_verifies_and_prints() -> None:
    g = diamond().verify()
    text = str(g)
    assert text.splitlines()[0] == "graph diamond(%x: f32[1,4,8,8]) {"
    assert "%d = add(%l, %r) : f32[1,4,8,8]" in text
    assert text.splitlines()[-2] == "  return %d"


def test_duplicate_name_is_rejected() -> None:
    g = diamond()
    nodes = g.nodes + (g.nodes[1].replace(),)
    with pytest.raises(DuplicateNameError, match="'l' is defined twice"):
        g.replace(nodes=nodes).verify()


def test_dangling_input_is_rejected() -> None:
    g = diamond()
    bad = g.nodes[3].replace(inputs=("l", "ghost"))
    broken = g.replace(nodes=g.nodes[:3] + (bad,))
    for _ in range(2):  # checked once for a valid graph, but a broken one raises every time
        with pytest.raises(DanglingInputError, match="node 'd' \\(add\\) reads 'ghost'"):
            broken.verify()
    assert g.verify() is g and g.verify() is g


def test_dangling_output_and_param_are_rejected() -> None:
    g = diamond()
    with pytest.raises(DanglingInputError, match="output 'nope'"):
        g.replace(outputs=("nope",)).verify()
    bad = g.nodes[0].replace(params=("missing_w",))
    with pytest.raises(DanglingInputError, match="parameter 'missing_w'"):
        g.replace(nodes=(bad,) + g.nodes[1:]).verify()


def test_cycle_is_rejected_with_its_nodes() -> None:
    g = diamond()
    a = g.nodes[0].replace(inputs=("d",))  # a <- d <- l <- a
    with pytest.raises(CycleError, match="has a cycle: ") as info:
        g.replace(nodes=(a,) + g.nodes[1:]).verify()
    cycle = str(info.value).split(": ")[-1].split(" -> ")
    assert cycle[0] == cycle[-1] and set(cycle) == {"a", "l", "d"}


def test_non_topological_order_is_rejected() -> None:
    g = diamond()
    with pytest.raises(GraphError, match="not in topological order"):
        g.replace(nodes=(g.nodes[1], g.nodes[0]) + g.nodes[2:]).verify()


def test_shape_mismatch_is_rejected() -> None:
    g = diamond()
    bad = g.nodes[1].replace(out=TensorType((1, 5, 8, 8)))
    with pytest.raises(ShapeMismatchError, match="node 'l' \\(sigmoid\\) records output f32\\[1,5,8,8\\]"):
        g.replace(nodes=(g.nodes[0], bad) + g.nodes[2:]).verify()


def test_conv_weight_mismatch_names_the_node() -> None:
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 8, 8))
    w = b.param("w", torch.randn(8, 3, 3, 3))
    g = b.build([x])
    node = Node("c", "conv2d", (x,), TensorType((1, 8, 8, 8)), FrozenAttrs(padding=1), ("w",))
    with pytest.raises(ShapeMismatchError, match="node 'c'.*weight f32\\[8,3,3,3\\]"):
        g.replace(nodes=(node,), params={"w": b.params[w]}).verify()


def test_unknown_op_is_rejected() -> None:
    g = diamond()
    bad = g.nodes[1].replace(op="frobnicate")
    with pytest.raises(ShapeMismatchError, match="unknown op kind 'frobnicate'"):
        g.replace(nodes=(g.nodes[0], bad) + g.nodes[2:]).verify()
    with pytest.raises(UnknownOpError):
        GraphBuilder("g").add("frobnicate", [])


def test_attrs_are_frozen_and_hashable() -> None:
    a = FrozenAttrs(stride=[2, 2], act="relu")
    assert a["stride"] == (2, 2) and hash(a) == hash(FrozenAttrs(act="relu", stride=(2, 2)))
    with pytest.raises(TypeError):
        a["act"] = "none"  # type: ignore[index]
    with pytest.raises(TypeError, match="attribute 'w'"):
        FrozenAttrs(w=torch.zeros(1))


def test_structural_hash_ignores_names_and_weights() -> None:
    def build(seed: int, prefix: str) -> Graph:
        b = GraphBuilder(prefix)
        b._count = 100 * seed  # different node names
        x = b.input(f"{prefix}_in", (1, 16, 8, 8))
        return b.build([inception_like(b, x, seed)])

    g1, g2 = build(1, "first"), build(7, "second")
    assert [n.name for n in g1.nodes] != [n.name for n in g2.nodes]
    assert not torch.equal(next(iter(g1.params.values())), next(iter(g2.params.values())))
    assert g1.structural_hash() == g2.structural_hash()


def test_two_identical_blocks_in_one_graph_hash_the_same() -> None:
    b = GraphBuilder("two_blocks")
    x = b.input("x", (1, 16, 8, 8))
    start1 = len(b.nodes)
    y = inception_like(b, x, 1)
    y = conv(b, y, 16)
    start2 = len(b.nodes)
    z = inception_like(b, y, 2)
    g = b.build([z]).verify()
    block1 = [n.name for n in g.nodes[start1:start1 + 5]]
    block2 = [n.name for n in g.nodes[start2:start2 + 5]]
    assert g.subgraph(block1).structural_hash() == g.subgraph(block2).structural_hash()


@pytest.mark.parametrize("change", ["kernel", "channels", "wiring", "dtype"])
def test_structural_hash_sees_structure(change: str) -> None:
    def build(variant: str) -> Graph:
        b = GraphBuilder("g")
        x = b.input("x", (1, 16, 8, 8), "float16" if variant == "dtype" else "float32")
        a = conv(b, x, 8, 3 if variant == "kernel" else 1)
        c = conv(b, x, 12 if variant == "channels" else 8, 1)
        d = b.add("concat", [a, c] if variant != "wiring" else [a, a], axis=1)
        return b.build([d])

    assert build(change).structural_hash() != build("base").structural_hash()


def test_a_views_position_is_no_part_of_its_cost_signature_but_is_of_the_graphs_identity() -> None:
    """Two windows of one tensor, at 0:4 and 4:8, each through a ReLU: their nodes' cost signatures
    are equal (what the search prices and reuses parts by), their signatures and the two halves'
    structural hashes are not (what a schedule or a compiled segment is checked against); a
    window of another stride is another cost, and the coster prices the two stages once."""
    from opsched.cost import AnalyticCostModel, StageCoster
    from opsched.cost.devices import device_spec
    from opsched.schedule import Stage

    b = GraphBuilder("windows")
    x = b.input("x", (1, 16, 8, 8))
    first = b.add("slice", [x], axis=1, start=0, end=4)
    second = b.add("slice", [x], axis=1, start=4, end=8)
    strided = b.add("slice", [x], axis=1, start=0, end=8, step=2)
    outs = [b.add("relu", [v]) for v in (first, second, strided)]
    g = b.build(outs).verify()
    assert g.signatures[first] != g.signatures[second]
    assert g.cost_signatures[first] == g.cost_signatures[second] != g.cost_signatures[strided]
    assert g.cost_signatures[outs[0]] == g.signatures[outs[0]]  # not a view: nothing left out
    halves = [g.subgraph([w, r]) for w, r in zip((first, second), outs)]
    assert halves[0].structural_hash() != halves[1].structural_hash()
    coster = StageCoster(g, AnalyticCostModel(device_spec("V100")))
    for w, r in zip((first, second), outs):
        coster.latency(Stage(((w, r),)))
    assert (coster.stats.distinct, coster.stats.structural_hits) == (1, 1)


def test_an_aten_views_position_arguments_alone_leave_its_cost_signature() -> None:
    """Imported from PyTorch: ``x.select(1, 0)`` and ``x.select(1, 1)`` cost alike, as do
    ``narrow``s at two starts; ``select`` on another dimension does not, nor does a transpose."""
    from opsched import from_torch

    class Views(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return (x.select(1, 0) * 2, x.select(1, 1) * 2, x.select(2, 0) * 2, x.narrow(1, 0, 2) * 2,
                    x.narrow(1, 1, 2) * 2, x.transpose(1, 2) * 2)

    g = from_torch(Views(), (torch.randn(2, 3, 3),))
    views = [n.name for n in g.nodes if n.op == "aten.view"]
    assert len(views) == 6
    sel0, sel1, other_dim, nar0, nar1, transposed = (g.cost_signatures[v] for v in views)
    assert len({g.signatures[v] for v in views}) == 6
    assert sel0 == sel1 and nar0 == nar1
    assert len({sel0, other_dim, nar0, transposed}) == 4


def test_writes_name_inputs_print_apart_from_what_is_returned_and_change_the_hash() -> None:
    """An input the model changes in place is a trailing output, named in ``writes``."""
    b = GraphBuilder("w")
    x, y = b.input("x", (2, 3)), b.input("y", (2, 3))
    s = b.add("relu", [x], name="s")
    t = b.add("sigmoid", [y], name="t")
    g = b.build([s], writes=[("y", t)]).verify()
    assert g.outputs == ("s", "t") and g.returns == ("s",) and g.writes == ("y",)
    assert str(g).splitlines()[-3:] == ["  return %s", "  write %y <- %t", "}"]
    assert g.structural_hash() != g.replace(writes=()).structural_hash()
    assert g.replace(writes=()).structural_hash() == b.build([s, t]).structural_hash()  # hashes without writes kept
    with pytest.raises(DanglingInputError, match="writes 's', which is not a graph input"):
        g.replace(writes=("s",)).verify()
    with pytest.raises(GraphError, match="must name distinct inputs"):
        g.replace(writes=("y", "y")).verify()
    b2 = GraphBuilder("w2")
    x2 = b2.input("x", (2, 3))
    with pytest.raises(ShapeMismatchError, match="input 'x' \\(f32\\[2,3\\]\\) is written with 'm', a f32\\[6\\]"):
        b2.build([], writes=[("x", b2.add("flatten", [x2], name="m", start_dim=0))]).verify()


def test_width_generations_and_critical_path_on_a_diamond() -> None:
    g = diamond()
    assert width(g) == 2
    assert sorted(g.nodes[i].name for i in max_antichain(g)) == ["l", "r"]
    assert [[g.nodes[i].name for i in gen] for gen in generations(g)] == [["a"], ["l", "r"], ["d"]]
    length, path = critical_path(g, [1.0, 5.0, 2.0, 1.0])
    assert length == 7.0 and [g.nodes[i].name for i in path] == ["a", "l", "d"]


@pytest.mark.parametrize("seed", range(20))
def test_width_equals_brute_force_max_antichain(seed: int) -> None:
    from itertools import combinations

    from opsched.ir.analysis import descendants

    g = random_dag(9, seed)
    desc = descendants(g)
    n = len(g.nodes)

    def independent(s: tuple[int, ...]) -> bool:
        return all(not (desc[a] >> b) & 1 and not (desc[b] >> a) & 1 for a, b in combinations(s, 2))

    best = max(k for k in range(1, n + 1) if any(independent(s) for s in combinations(range(n), k)))
    antichain = max_antichain(g)
    assert len(antichain) == best and independent(tuple(antichain))


def test_subgraph_inputs_and_outputs() -> None:
    g = diamond()
    sub = g.subgraph(["l", "r"])
    assert [i.name for i in sub.inputs] == ["a"]
    assert sub.outputs == ("l", "r")
    sub.verify()


class _Masked(torch.nn.Module):
    """An additive attention mask as models make them: filled where ``keep`` is False, plus a bias
    the model holds (T5's position biases, ALiBi's slopes)."""

    def __init__(self, fill: float, bias: torch.Tensor, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.fill, self.dtype = fill, dtype
        self.register_buffer("bias", bias.to(dtype))

    def forward(self, keep: torch.Tensor) -> torch.Tensor:
        mask = torch.where(keep, torch.zeros((), dtype=self.dtype), torch.tensor(self.fill, dtype=self.dtype))
        return (mask + self.bias).unsqueeze(1).expand(-1, 2, -1, -1) * 1.0


_F32, _F16 = torch.finfo(torch.float32), torch.finfo(torch.float16)


@pytest.mark.parametrize(("fill", "bias", "dtype", "low"), [
    (_F32.min, torch.linspace(-5, 3, 16).view(4, 4), torch.float32, _F32.min),  # finfo.min - 5 rounds to finfo.min
    (_F32.min, torch.full((4, 4), -1e32), torch.float32, -float("inf")),        # past the edge: -inf
    (float("-inf"), torch.zeros(4, 4), torch.float32, -float("inf")),
    (-1e4, torch.linspace(-5, 3, 16).view(4, 4), torch.float32, -1e4 - 5),
    (_F16.min, torch.full((4, 4), -8.0), torch.float16, _F16.min),             # half a unit: rounds back
    (_F16.min, torch.full((4, 4), -16.0), torch.float16, -float("inf")),       # a tie, to even: -inf
])
def test_bounds_follow_a_mask_through_where_add_and_views_as_its_dtype_rounds(
        fill: float, bias: torch.Tensor, dtype: torch.dtype, low: float) -> None:
    """The least value a mask can hold, worked out from its calls (a graph input of bools, a
    buffer's own entries, scalars), is what the dtype's rounding makes of the exact least: float32
    holds ``finfo.min - 5`` as ``finfo.min`` and overflows to -inf from half a unit past it on."""
    from opsched import from_torch
    from opsched.ir.bounds import bounds

    keep = torch.rand(2, 4, 4) > 0.5
    graph = from_torch(_Masked(fill, bias, dtype), (keep,), canonical=False)
    (out,) = graph.outputs
    found = bounds(graph, out)
    assert found.low == low
    eager = _Masked(fill, bias, dtype)(keep)
    assert eager.min().item() >= found.low and eager.max().item() <= found.high


def test_bounds_of_inputs_and_calls_without_a_rule_are_their_dtypes_range() -> None:
    """A float input may hold anything; an integer input its dtype's range, which a cast to float32
    rounds (-2^31 .. 2^31) and ``1 - x`` wraps past in int32 (anything it holds); a bool's 0 and
    1, of which ``(1 - m) * finfo.min`` is at least ``finfo.min``; a call without a rule (``exp``)
    may give anything."""
    from opsched import from_torch
    from opsched.ir.bounds import ANY, Bounds, bounds

    class Calls(torch.nn.Module):
        def forward(self, x: torch.Tensor, n: torch.Tensor, m: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return x + 1, n.float(), 1 - n, (1.0 - m.float()) * _F32.min, x.exp()

    graph = from_torch(Calls(), (torch.randn(3), torch.arange(3, dtype=torch.int32), torch.rand(3) > 0.5),
                       canonical=False)
    found = [bounds(graph, v) for v in graph.outputs]
    int32 = Bounds(-2.0 ** 31, 2.0 ** 31 - 1)
    assert found == [ANY, Bounds(-2.0 ** 31, 2.0 ** 31), int32, Bounds(_F32.min, 0.0), ANY]
    assert Bounds(1.0, 2.0).hull() == Bounds(1.0, 2.0)  # of one: a cat of one tensor, a list of one


def test_bounds_of_a_clamp_to_tensors_hold_every_entry_of_the_bounds_it_is_clamped_to() -> None:
    """``clamp(x, min=t)`` with ``t`` in [-1, 5] is at least -1 and may reach anything above;
    ``clamp(x, 0, t)`` is in [-1, 5]: where ``t`` is -1, it is -1; ``clamp(x, 0.3, 2.7)`` cast to
    int64 is in [0, 3], as the cast truncates. Each holds the eager result."""
    from opsched import from_torch
    from opsched.ir.bounds import Bounds, bounds

    class Clamps(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("t", torch.linspace(-1, 5, 4))

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return torch.clamp(x, min=self.t), torch.clamp(x, torch.zeros(4), self.t), x.clamp(0.3, 2.7).long()

    x = torch.randn(4) * 10
    graph = from_torch(Clamps(), (x,), canonical=False)
    found = [bounds(graph, v) for v in graph.outputs]
    assert found == [Bounds(-1.0, float("inf")), Bounds(-1.0, 5.0), Bounds(0.0, 3.0)]
    for got, b in zip(Clamps()(x), found):
        assert b.low <= got.min().item() and got.max().item() <= b.high

"""What a new user hits: each a small regression test of a case that went wrong, and the fixes'
edges. Every model here is checked against eager PyTorch on fresh inputs, not only the examples."""

from __future__ import annotations

import copy
import dataclasses
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opsched
from opsched.check import fresh_inputs
from opsched.cli.main import main
from opsched.errors import (
    ExecutionError,
    FrontendError,
    InputMismatchError,
    OpschedError,
    ScheduleError,
    ScheduleMismatchError,
    StatefulModelError,
    UntraceableModuleError,
)
from opsched.testing import assert_close

ANALYTIC = {"cost": "analytic", "verify": False}


def tensors(out: object) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def equal_on_fresh_inputs(model: nn.Module, module: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    for xs in (inputs, fresh_inputs(inputs, seed=7)):
        with torch.no_grad():
            assert_close(tensors(module(*xs)), tensors(model(*xs)))


# --- correctness ---------------------------------------------------------------------------------
class Attention(nn.Module):
    """A ViT block's core: nn.MultiheadAttention returns (output, None) with need_weights=False."""

    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.mlp = nn.Linear(16, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.attn(x, x, x, need_weights=False)
        return self.mlp(y + x)


@pytest.mark.parametrize("scheduler", ["sequential", "ios", "est"])
def test_a_tuple_with_a_none_stays_a_graph_value(scheduler: str) -> None:
    """It was frozen into a constant: every other input gave the example input's output again."""
    model, x = Attention().eval(), torch.randn(2, 5, 16)
    module = opsched.optimize(model, x, scheduler=scheduler, **ANALYTIC)
    equal_on_fresh_inputs(model, module, (x,))
    opsched.optimize(model, x, cost="analytic", scheduler=scheduler)  # the end-to-end check now sees fresh inputs


class InPlace(nn.Module):
    """Branches that read a tensor that another op changes in place, every spelling of it."""

    def __init__(self, spelling: str) -> None:
        super().__init__()
        self.spelling = spelling
        self.a, self.b, self.c = nn.Conv2d(4, 4, 1), nn.Conv2d(4, 4, 3, padding=1), nn.Conv2d(4, 4, 1)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.a(x)
        before = self.c(y)  # reads y before the change
        if self.spelling == "module":
            z = self.relu(y)
        elif self.spelling == "method":
            z = y.relu_()
        elif self.spelling == "augmented":
            y += 1.0
            z = y
        elif self.spelling == "twice":  # three names for one tensor: y, and each write's result
            z = y.relu_()
            y.mul_(2.0)
            z = z.sigmoid()
        else:  # a call without a converter, in place
            z = F.hardtanh(y, -0.5, 0.5, inplace=True)
        after = self.b(y)  # reads y after it: eager sees the changed tensor
        return z * 2 + after + before


@pytest.mark.parametrize("spelling", ["module", "method", "augmented", "twice", "opaque"])
@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_in_place_ops_on_a_shared_tensor_equal_eager(spelling: str, backend: str) -> None:
    model, x = InPlace(spelling).eval(), torch.randn(1, 4, 8, 8)
    for scheduler in ("sequential", "greedy", "ios", "est"):
        module = opsched.optimize(model, x, scheduler=scheduler, backend=backend, **ANALYTIC)
        equal_on_fresh_inputs(model, module, (x,))
    assert_close([x], [x.clone()])


class Aliased(nn.Module):
    """In-place changes that reach other tensors through shared memory (views, ``x += y`` on a
    second name, ``x[i] = y``): torch.fx records none of them as eager PyTorch runs them."""

    def __init__(self, case: str) -> None:
        super().__init__()
        self.case = case
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> object:
        a = self.conv(x)
        if self.case == "view changed, base read":
            a.transpose(2, 3).relu_()
            return a + 1
        if self.case == "base changed, earlier view read":
            b = a[:, :2]
            a.relu_()
            return b * 2
        if self.case == "second name":
            alias = a
            alias += 1.0
            return a
        if self.case == "chunks":
            p, q = a.chunk(2, 1)
            p.mul_(3)
            q += 1
            return a, p, q.sigmoid()
        if self.case == "setitem":
            flat = a.flatten(2)
            a[:, :2] = 0
            a[..., 0, :] = a[..., 1, :].sigmoid()
            return flat.sum(-1), a
        raise AssertionError(self.case)


@pytest.mark.parametrize("case", ["view changed, base read", "base changed, earlier view read", "second name",
                                  "chunks", "setitem"])
@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_in_place_changes_through_shared_memory_equal_eager(case: str, backend: str) -> None:
    model, x = Aliased(case).eval(), torch.randn(1, 3, 6, 6)
    for scheduler in ("sequential", "ios"):
        module = opsched.optimize(model, x, scheduler=scheduler, backend=backend, **ANALYTIC)
        equal_on_fresh_inputs(model, module, (x,))


class Detached(nn.Module):
    """DeBERTa's relative positions: a constant made in forward and detached in place."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.tensor([0.5, 1.0, 2.0, 4.0])
        scale.detach_()
        return self.conv(x) * scale[:, None, None]


@pytest.mark.parametrize(("model", "retraced"), [
    *[pytest.param(InPlace(s), False, id=s) for s in ("module", "method", "augmented", "twice")],
    pytest.param(Detached(), False, id="detach_"),
    *[pytest.param(Aliased(c), True, id=c) for c in ("view changed, base read", "base changed, earlier view read",
                                                      "chunks", "setitem")],
])
def test_writes_to_unshared_tensors_import_without_functionalising_again(model: nn.Module, retraced: bool,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A write to a tensor that shares memory with none (a convolution's output, never viewed) is
    rewritten out of place in torch.export's program; a write that others may see through a view
    leaves the program to ``run_decompositions``' retrace (:mod:`opsched.frontends.export_in_place`)."""
    from opsched.frontends.export_trace import export_graph

    retraces = []
    functionalise = torch.export.ExportedProgram.run_decompositions

    def counted(self: torch.export.ExportedProgram, *args: object, **kwargs: object) -> object:
        retraces.append(self)
        return functionalise(self, *args, **kwargs)

    monkeypatch.setattr(torch.export.ExportedProgram, "run_decompositions", counted)
    model = model.eval()
    x = torch.randn(1, 4 if isinstance(model, InPlace) else 3, 6, 6)
    graph = export_graph(model, (x,), {}, "model")
    assert bool(retraces) == retraced
    module = opsched.optimize_graph(graph, cost="analytic", scheduler="sequential", backend="torch", check=False)
    equal_on_fresh_inputs(model, module, (x,))


class Writes(nn.Module):
    """Changes its inputs in place: ``x`` twice (itself), ``y`` through a view, ``z`` to another
    input's value; returns a value computed between the writes and ``x`` itself."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor, y: torch.Tensor, z: torch.Tensor) -> object:
        x.add_(1)
        y[:, 0] = 0
        h = self.conv(x + y)
        x.mul_(2)
        z.copy_(y)
        return h, x


@pytest.mark.parametrize("tracer", ["export", "fx"])
@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_inputs_the_model_changes_in_place_are_changed_as_eager_changes_them(tracer: str, backend: str) -> None:
    """torch.export lists such writes beside the outputs, and they were dropped: the module
    returned the right values but left the caller's tensors as they were. The input the model
    returns is the caller's tensor itself, as in eager (it was an equal copy)."""
    import copy

    model = Writes().eval()
    xs = tuple(torch.randn(1, 3, 5, 5) for _ in range(3))
    before = [t.clone() for t in xs]
    for scheduler in ("sequential", "ios"):
        module = opsched.optimize(model, xs, scheduler=scheduler, backend=backend, tracer=tracer, cost="analytic")
        assert module.graph.writes == ("x", "y", "z")
        assert all(torch.equal(t, b) for t, b in zip(xs, before))  # optimize() checked it on copies
        for again in (module, copy.deepcopy(module)):
            for inputs in (xs, fresh_inputs(xs, seed=3)):
                theirs, mine = [t.clone() for t in inputs], [t.clone() for t in inputs]
                with torch.no_grad():
                    got, want = again(*mine), model(*theirs)
                assert_close(tensors(got), tensors(want))
                assert_close(mine, theirs)
                assert got[1] is mine[0] and want[1] is theirs[0]


def test_the_check_against_the_model_compares_the_inputs_it_changes() -> None:
    """A module that returned the right values but wrote no input fails the check, naming it."""
    from opsched.check import verify_against
    from opsched.cost import AnalyticCostModel
    from opsched.schedulers import schedule
    from opsched.structure import InputStructure

    model, xs = Writes().eval(), tuple(torch.randn(1, 3, 5, 5) for _ in range(3))
    module = opsched.optimize(model, xs, **ANALYTIC)
    graph = module.graph
    unwritten = graph.replace(outputs=graph.returns, writes=())
    forgetful = opsched.ScheduledModule(unwritten, schedule(unwritten, "sequential", AnalyticCostModel("CPU2")))
    call = InputStructure.positional(["x", "y", "z"])
    verify_against(module, graph, torch.device("cpu"), model, call, xs)
    with pytest.raises(ExecutionError, match="on the example inputs, the scheduled module's input 'x' after the call "
                                             "differs from the model's"):
        verify_against(forgetful, forgetful.graph, torch.device("cpu"), model, call, xs)


class _Pair(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return x.relu(), x.sigmoid()


class _Half(nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return x.relu(), None


def test_the_check_names_an_output_that_nests_otherwise_than_the_models() -> None:
    """A module whose outputs hold None where the model's hold a tensor fails the check with what
    each side holds (it raised AttributeError on the None's shape)."""
    from opsched.check import verify_against
    from opsched.structure import InputStructure

    model, x = _Pair().eval(), torch.randn(2, 3)
    graph, call = opsched.from_torch(model, x), InputStructure.positional(["x"])
    with pytest.raises(ExecutionError, match=r"on the example inputs, the scheduled module's output 1 is None where "
                                             r"the model's is a tensor of shape \(2, 3\): its outputs nest otherwise"):
        verify_against(_Half(), graph, torch.device("cpu"), model, call, (x,))


class _ImageInText(nn.Module):
    """A text-and-image model's merge: the image's features where the ids hold the image token (7),
    ids that leave them another number of places refused, as LLaVA refuses them."""

    def __init__(self, checked: bool = True) -> None:
        super().__init__()
        self.checked, self.embed, self.proj = checked, nn.Embedding(10, 4), nn.Linear(3, 4)

    def forward(self, ids: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        places = (ids == 7).unsqueeze(-1)
        if self.checked and int(places.sum()) != image.shape[0]:
            raise ValueError("image features and image tokens do not match")
        return self.embed(ids).masked_scatter(places, self.proj(image))


class _Replays(nn.Module):
    def __init__(self, answer: torch.Tensor) -> None:
        super().__init__()
        self.answer = answer

    def forward(self, ids: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return self.answer.clone()


def test_where_the_model_refuses_fresh_ids_the_check_draws_fresh_floats_beside_the_ids_given(
        caplog: pytest.LogCaptureFixture) -> None:
    """Fresh random token ids leave an image no place, and the model refuses them: the check then
    calls both on a fresh image beside the ids given, so a module that replays the example's
    answer fails it (it passed, checked on the example alone)."""
    from opsched.check import verify_against
    from opsched.structure import InputStructure

    model = _ImageInText().eval()
    ids, image = torch.tensor([[1, 7, 7, 2, 3]]), torch.randn(2, 3)
    unchecked = _ImageInText(checked=False).eval()  # the same model, traceable: the module's graph
    unchecked.load_state_dict(model.state_dict())
    graph, call = opsched.from_torch(unchecked, (ids, image)), InputStructure.positional(["ids", "image"])
    with caplog.at_level(logging.WARNING, logger="opsched"):
        verify_against(unchecked, graph, torch.device("cpu"), model, call, (ids, image))
    assert "and on fresh floats beside its integers as given" in caplog.text
    with torch.no_grad():
        replays = _Replays(model(ids, image))
    with pytest.raises(ExecutionError, match="on fresh random floats, its integers and booleans as given, the "
                                             "scheduled module's output 0 differs"):
        verify_against(replays, graph, torch.device("cpu"), model, call, (ids, image))


class _Shifted(nn.Module):
    """Adds ``shift`` and takes it away again: in float32, rounding to the precision of the shift
    (ulp(1e4) is 1e-3), where float64 gives ``x`` back exactly."""

    def __init__(self, shift: float) -> None:
        super().__init__()
        self.shift = shift

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + self.shift) - self.shift


class _Off(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 0.01


def test_the_check_holds_a_result_against_float64_where_the_model_itself_rounds_beyond_the_tolerance() -> None:
    """A model that rounds badly in float32 (trained batch norms of small variance do, folded into
    convolutions) and a module that rounds otherwise differ by more than float32's tolerance:
    the check passes a module as near the float64 truth as the model, and still fails one further."""
    from opsched.check import verify_against
    from opsched.compare import largest_difference, tolerance
    from opsched.structure import InputStructure

    model, x = _Shifted(1e4).eval(), torch.randn(1, 4096, generator=torch.Generator().manual_seed(0))
    rounds_otherwise = _Shifted(3e3)  # rounds to a finer grid, on other elements
    with torch.no_grad():
        assert largest_difference(rounds_otherwise(x), model(x)) > tolerance(model(x))  # the plain check would fail
    graph, call = opsched.from_torch(model, x), InputStructure.positional(["x"])
    verify_against(rounds_otherwise, graph, torch.device("cpu"), model, call, (x,))
    with pytest.raises(ExecutionError, match=r"output 0 differs from the model's .* against the model run in "
                                             r"float64, the module is 0.01 off and the model itself 0.000\d+\): "
                                             r"torch.export's own program of the model matches it on these inputs "
                                             r"\(0 apart\), so the difference is opsched's"):
        verify_against(_Off(), graph, torch.device("cpu"), model, call, (x,))


def test_a_pass_against_float64_where_the_model_keeps_nothing_of_its_output_in_float32_is_said(
        caplog: pytest.LogCaptureFixture) -> None:
    """Where the model's own float32 output is a tenth of its scale or more from its float64 one
    (random detectors: D-FINE's, 5.9 at a scale of 5.5), the float64 arbiter passes a module as
    far: the check passes it, and warns that float32 kept nothing to check it by."""
    from opsched.check import verify_against
    from opsched.structure import InputStructure

    model, x = _Shifted(1e8).eval(), torch.randn(1, 4096, generator=torch.Generator().manual_seed(0))
    graph, call = opsched.from_torch(model, x), InputStructure.positional(["x"])
    with caplog.at_level(logging.INFO, logger="opsched"):
        verify_against(_Shifted(3e7), graph, torch.device("cpu"), model, call, (x,))
    assert "the model's own output 0 is " in caplog.text and "it keeps nothing in float32 to check the module by" \
        in caplog.text
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="opsched"):  # a model that keeps its output: no such words
        verify_against(_Shifted(3e3), opsched.from_torch(_Shifted(1e4).eval(), x), torch.device("cpu"),
                       _Shifted(1e4).eval(), call, (x,))
    assert "keeps nothing" not in caplog.text and "as near the model's float64 output as the model" in caplog.text


class _Masked(nn.Module):
    """Masks half its logits with -inf, as GroundingDINO's attention masks its text; ``off`` shifts the rest."""

    def __init__(self, off: float = 0.0, nan: bool = False) -> None:
        super().__init__()
        self.off, self.nan = off, nan

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = x.sin() + self.off
        if self.nan:
            logits = logits * float("nan")
        return logits.masked_fill(torch.arange(x.shape[-1]) % 2 == 0, float("-inf"))


def test_a_module_that_returns_nan_fails_the_check_and_infinities_the_model_returns_set_no_tolerance() -> None:
    """NaN compares false with everything, so a difference of NaN passed any tolerance: a module
    returning NaN passed the check. Now a NaN or infinity on one side only is infinitely far, the
    same on both sides 0 apart, and a tolerance is of the finite values' scale, not an infinity's."""
    from opsched.check import verify_against
    from opsched.compare import largest_difference, tolerance
    from opsched.structure import InputStructure

    inf, nan = float("inf"), float("nan")
    assert largest_difference(torch.tensor([1.0, nan, inf, -inf]), torch.tensor([1.0, nan, inf, -inf])) == 0.0
    assert largest_difference(torch.tensor([nan]), torch.tensor([1.0])) == inf
    assert largest_difference(torch.tensor([inf]), torch.tensor([-inf])) == inf
    assert tolerance(torch.tensor([-inf, 3.0])) == pytest.approx(3e-4)
    model, x = _Masked().eval(), torch.randn(1, 8, generator=torch.Generator().manual_seed(0))
    graph, call = opsched.from_torch(model, x), InputStructure.positional(["x"])
    verify_against(_Masked(), graph, torch.device("cpu"), model, call, (x,))
    for wrong in (_Masked(off=0.01), _Masked(nan=True)):
        with pytest.raises(ExecutionError, match="output 0 differs from the model's"):
            verify_against(wrong, graph, torch.device("cpu"), model, call, (x,))


def test_fresh_inputs_keep_an_additive_masks_infinities_and_draw_the_rest_within_its_range() -> None:
    """A mask of 0 and -inf has no mean or spread (NaN), and drawn by them every fresh value was
    NaN, which a model returned as NaN: the check then failed a module that masks as the model's
    mask says. Its infinities are kept where they are, its finite values drawn within their range."""
    from opsched.check import fresh_inputs

    causal = nn.Transformer.generate_square_subsequent_mask(6)
    biased = causal + torch.linspace(-1.0, 1.0, 6)
    (fresh_causal, fresh_biased) = fresh_inputs((causal, biased))
    assert torch.equal(fresh_causal, causal)  # its finite values all 0: their range holds nothing else
    masked = torch.isinf(biased)
    assert torch.equal(torch.isinf(fresh_biased), masked) and not torch.isnan(fresh_biased).any()
    assert (fresh_biased[~masked] >= -1.0).all() and (fresh_biased[~masked] <= 1.0).all()
    assert not torch.equal(fresh_biased, biased)


class _Picks(nn.Module):
    """Keeps the ``k`` largest of its scores and what each query computes of its own, as RT-DETR
    keeps its queries: two outputs, the queries along another dimension in each."""

    def __init__(self, k: int) -> None:
        super().__init__()
        self.k = k

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        picked = x.gather(1, x.topk(self.k, dim=1).indices)
        return picked, torch.stack([picked.sin(), picked.cos()])


class _Reordered(nn.Module):
    """What a plan makes of :class:`_Picks` where scores tie within its rounding: the picked
    queries at ``positions`` taken in the order ``order``, in every output."""

    def __init__(self, k: int, positions: list[int], order: list[int]) -> None:
        super().__init__()
        self.k, self.positions, self.order = k, positions, order

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        picked = x.gather(1, x.topk(self.k, dim=1).indices)
        picked[:, self.positions] = picked[:, self.order]
        return picked, torch.stack([picked.sin(), picked.cos()])


def test_a_plan_that_takes_tied_values_in_another_order_passes_and_any_other_order_fails(
        caplog: pytest.LogCaptureFixture) -> None:
    """A plan that took two neighbours of a ranking in the other order (RT-DETR's, on fresh
    random inputs, queries 99 and 100 of its 300 swapped in its logits, boxes and decoder states,
    every score within 1.2e-6 of eager's) computes the model in another order of what ties: the
    check passes it and says which positions moved. Positions that are not neighbours, or a run
    longer than ties make, fail it, and the failure names the ``topk`` that may explain it; a
    model that picks nothing by order gets no such words."""
    from opsched.check import ordering, verify_against
    from opsched.structure import InputStructure

    model, x = _Picks(8).eval(), torch.randn(1, 12, generator=torch.Generator().manual_seed(0))
    graph, call = opsched.from_torch(model, x), InputStructure.positional(["x"])
    assert "aten::topk.default" in ordering(graph) and ordering(opsched.from_torch(_Off(), x)) == ""
    with caplog.at_level(logging.WARNING, logger="opsched"):
        verify_against(_Reordered(8, [2, 3], [3, 2]), graph, torch.device("cpu"), model, call, (x,))
    assert "the scheduled module's output 0, output 1 are the model's with positions of a dimension of 8 in " \
           "another order (2 holds 3's, 3 holds 2's): the model picks values by their order ('topk" in caplog.text
    verify_against(_Reordered(8, [4, 5, 6, 7], [7, 4, 5, 6]), graph, torch.device("cpu"), model, call, (x,))
    for far in (_Reordered(8, [0, 5], [5, 0]), _Reordered(8, [0, 1, 2, 3, 4], [4, 0, 1, 2, 3])):
        with pytest.raises(ExecutionError, match=r"the difference is opsched's, or it picks values by their "
                                                 r"order \('topk\w*' \(aten::topk.default\)\) and its plan takes "
                                                 r"values that tie"):
            verify_against(far, graph, torch.device("cpu"), model, call, (x,))


def test_a_reordering_explains_every_output_that_differs_or_none() -> None:
    """One permutation along a dimension of one size, wherever it lies in each output, of
    neighbours only, each position then within the tolerance: or no reordering at all."""
    from opsched.compare import Reordering, reordering

    queries = torch.randn(6, 3, generator=torch.Generator().manual_seed(0))
    swapped = queries[[0, 2, 1, 3, 4, 5]]
    states = torch.stack([queries.T, queries.T])  # the queries along dimension 2
    assert reordering([(queries, queries, 1e-6)]) is None  # nothing differs
    assert reordering([(swapped, queries, 1e-6), (states, states, 1e-6), (swapped.T, queries.T, 1e-6)]) == \
        Reordering(6, ((1, 2), (2, 1)), (0, 2))
    assert reordering([(swapped, queries, 1e-6), (queries[[0, 1, 2, 4, 3, 5]].T, queries.T, 1e-6)]) is None  # two
    assert reordering([(swapped + 1e-3, queries, 1e-6)]) is None  # beyond the tolerance once reordered
    assert reordering([(queries[[5, 1, 2, 3, 4, 0]], queries, 1e-6)]) is None  # not neighbours
    assert reordering([(swapped, queries.double(), 1e-6)]) is None  # another dtype: no reordering makes it equal


class _Imprecise:
    """A backend's executor whose kernels compute the plan ``by`` off: as ONNX Runtime's computed
    MobileViTV2 (1.3e-4 from its float64 outputs, where eager's float32 was 6e-6)."""

    def __init__(self, executor: object, by: float) -> None:
        self.executor, self.by = executor, by

    def __call__(self, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
        return [t + self.by for t in self.executor(inputs)]  # type: ignore[operator]

    def __getattr__(self, name: str) -> object:
        return getattr(self.executor, name)


class _Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(8, 8, 3, padding=1), nn.Conv2d(8, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x).relu() + self.b(x).sigmoid()


def _kernels_off(monkeypatch: pytest.MonkeyPatch, backend: type, by: float) -> None:
    prepare = backend.prepare
    monkeypatch.setattr(backend, "prepare", lambda self, *args: _Imprecise(prepare(self, *args), by))


def test_a_plan_onnx_runtimes_kernels_compute_beyond_the_check_is_kept_on_torchs(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path) -> None:
    """With the backend left to choose, a plan whose ONNX Runtime kernels fail the check runs on
    torch's kernels where those pass it, and says so, in optimize() and in a checked load(); asked
    for ONNX Runtime's, or where torch's fail too, each raises ONNX Runtime's failure."""
    from opsched.backends.ort import OrtBackend
    from opsched.backends.torch_cpu import TorchCpuBackend

    model, x = _Branches().eval(), torch.randn(1, 8, 16, 16, generator=torch.Generator().manual_seed(0))
    opsched.optimize(model, x, **ANALYTIC).save(tmp_path / "on_ort.json")
    _kernels_off(monkeypatch, OrtBackend, 0.01)
    with caplog.at_level(logging.WARNING, logger="opsched.api"):
        module = opsched.optimize(model, x, cost="analytic")
    assert module.backend.name == "torch" and {lane.backend for lane in module.schedule.lanes} == {"torch"}
    assert "on ort's kernels failed the check (on the example inputs, the scheduled module's output 0" in caplog.text
    equal_on_fresh_inputs(model, module, (x,))
    module.save(tmp_path / "kept.json")
    assert opsched.load(model, tmp_path / "kept.json", x).backend.name == "torch"
    with pytest.raises(ExecutionError, match=r"largest difference 0.01\b"):
        opsched.optimize(model, x, cost="analytic", backend="ort")
    assert opsched.load(model, tmp_path / "on_ort.json", x).backend.name == "ort"  # unchecked: as saved
    assert opsched.load(model, tmp_path / "on_ort.json", x, verify=True).backend.name == "torch"
    with pytest.raises(ExecutionError, match=r"largest difference 0.01\b"):
        opsched.load(model, tmp_path / "on_ort.json", x, backend="ort", verify=True)
    _kernels_off(monkeypatch, TorchCpuBackend, 0.5)
    with pytest.raises(ExecutionError, match=r"largest difference 0.01\b"):
        opsched.optimize(model, x, cost="analytic")


class _OtherwiseTraced(nn.Module):
    """Computes otherwise while traced, as transformers' PaliGemma builds its attention mask."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2 if torch.compiler.is_compiling() else x * 3


def test_a_failed_check_says_whose_the_difference_is_by_torch_exports_own_program() -> None:
    """The check's failure said "or this is a bug [of ours]" for a model that computes otherwise
    while traced; it now runs torch.export's own program of the model: as far apart as the
    module, the difference is the model's, and the message says so."""
    with pytest.raises(ExecutionError, match=r"on the example inputs, .* largest difference 1\.\d+.*torch.export's "
                                             r"own program of the model, run on the same inputs, is 1\.\d+ from the "
                                             r"model too: the model computes otherwise while traced"):
        opsched.optimize(_OtherwiseTraced(), torch.rand(2, 3) + 1, cost="analytic", progress=False)


class Stateful(nn.Module):
    """Counts its calls in a buffer; with ``accumulate``, its output reads a running sum too."""

    def __init__(self, accumulate: bool) -> None:
        super().__init__()
        self.accumulate = accumulate
        self.linear = nn.Linear(3, 3)
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls.add_(1)
        if not self.accumulate:
            return self.linear(x)
        self.total.add_(x.sum(0))
        return self.linear(x) * self.total


@pytest.mark.parametrize("tracer", ["auto", "export", "fx"])
def test_a_stateful_model_is_refused_and_a_counter_it_keeps_is_left_with_a_warning(
        tracer: str, caplog: pytest.LogCaptureFixture) -> None:
    """Weights and buffers are constants of the graph: a model whose outputs read one it
    changes in place would be right on the first call only."""
    x = torch.randn(2, 3)
    with pytest.raises(StatefulModelError, match="^Stateful is stateful: its forward changes buffer 'total' in place "
                                                 "and its outputs read it.*; keep the state outside") as info:
        opsched.from_torch(Stateful(accumulate=True).eval(), x, tracer=tracer)  # type: ignore[arg-type]
    assert "; and" not in str(info.value)  # auto does not try torch.fx after torch.export found it
    model = Stateful(accumulate=False).eval()
    with caplog.at_level("WARNING"):
        module = opsched.optimize(model, x, tracer=tracer, **ANALYTIC)  # type: ignore[arg-type]
    # torch.fx does not trace a buffer's own method calls (it runs them while tracing): out of its sight
    assert ("changes buffer 'calls' in place in forward; the scheduled module computes the same outputs but "
            "leaves it as it was" in caplog.text) == (tracer != "fx")
    calls = float(model.calls)
    with torch.no_grad():
        assert_close(module(x), model(x))
    assert float(model.calls) == calls + 1  # the model's own call counted; the module's did not


class Refreshed(nn.Module):
    """Assigns a buffer anew at every call, CTRL's way (``self.pos = self.pos.to(x.dtype)``); with
    ``drift`` the new values differ from the old."""

    def __init__(self, drift: float = 0.0) -> None:
        super().__init__()
        self.drift = drift
        self.linear = nn.Linear(3, 3)
        self.register_buffer("pos", torch.arange(3.0))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.pos = self.pos.to(x.dtype) * (1 + self.drift)
        return self.linear(x) + self.pos


def test_a_buffer_assigned_the_values_it_holds_is_no_state_and_one_assigned_new_values_is() -> None:
    """A write that puts back what the buffer holds (computed from weights alone, equal in every
    element) changes nothing at any call: CTRL's forward was refused for it."""
    x = torch.randn(2, 3)
    model = Refreshed().eval()
    module = opsched.optimize(model, x, **ANALYTIC)
    with torch.no_grad():
        assert_close(module(x), model(x))
    with pytest.raises(StatefulModelError, match="changes buffer 'pos' in place and its outputs read it"):
        opsched.from_torch(Refreshed(drift=0.5).eval(), x, tracer="export")


class Masked(nn.Module):
    """Two branches and a keyword-only mask, as exported with a dynamic batch."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3), nn.Conv2d(3, 4, 3)
        self.norm = nn.BatchNorm2d(4)

    def forward(self, x: torch.Tensor, scale: float | None = None, *, mask: torch.Tensor | None = None) -> object:
        y = self.norm(self.a(x)) + self.b(x).relu()
        if mask is not None:
            y = y * mask
        return {"y": y, "mean": y.mean()}


def _masked(batch: int) -> dict[str, torch.Tensor]:
    return {"x": torch.randn(batch, 3, 8, 8), "mask": torch.rand(batch, 4, 6, 6)}


def test_a_torch_export_program_is_scheduled_at_its_own_inputs_or_at_the_sizes_given(tmp_path: Path) -> None:
    """A program saved with torch.export.save is what PyTorch 2 deploys: opsched takes it as it
    takes a module, at the example inputs saved with it where none are given."""
    model = Masked().eval()
    batch = torch.export.Dim("batch")
    example = _masked(2)
    exported = torch.export.export(model, (example["x"],), {"mask": example["mask"]},
                                   dynamic_shapes={"x": {0: batch}, "mask": {0: batch}})
    torch.export.save(exported, tmp_path / "masked.pt2")
    program = torch.export.load(tmp_path / "masked.pt2")

    module = opsched.optimize(program, cost="analytic")
    assert module.graph.name == "Masked" and module.inputs.describe() == "forward(x, mask=mask)"
    assert [n.name for n in module.graph.nodes][:2] == ["a", "b"]  # named as in the model
    for inputs in (example, _masked(2)):
        with torch.no_grad():
            assert_close(tensors(module(inputs["x"], mask=inputs["mask"])), tensors(model(**inputs)))
    with pytest.raises(InputMismatchError, match="too many positional arguments"):
        module(example["x"], example["mask"])  # mask is keyword-only, as in the model
    three = _masked(3)
    at_three = opsched.optimize(program, three, cost="analytic")  # the dynamic batch, fixed at 3
    per_shape = opsched.optimize_per_shape(program, cost="analytic")
    with torch.no_grad():
        want = tensors(model(**three))
        assert_close(tensors(at_three(**three)), want)
        assert_close(tensors(per_shape(**three)), want)
    assert len(per_shape.buckets) == 2 and per_shape.report().model == "Masked"
    module.save(tmp_path / "masked.json")
    with torch.no_grad():
        assert_close(tensors(opsched.load(program, tmp_path / "masked.json")(**example)), tensors(model(**example)))
    assert opsched.from_torch(program).name == "Masked"


class Scaled(nn.Module):
    """Two branches, a batch norm and a dropout (a mode to keep), and a second input."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3), nn.Conv2d(3, 4, 3)
        self.norm, self.drop = nn.BatchNorm2d(4), nn.Dropout(0.5)

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return self.drop(self.norm(self.a(x)).relu() + self.b(x)) * scale


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")  # TorchScript is deprecated in torch 2.13
def test_a_torchscript_module_is_converted_and_checked_against_itself(tmp_path: Path) -> None:
    """TorchScript (torch.jit.load of a deployed model.pt) could not be traced by either tracer:
    PyTorch's converter makes it a torch.export program, which is scheduled, and the check runs
    the TorchScript module itself, in eval mode, the mode it was in left as it was."""
    model = Scaled().eval()
    x, scale = torch.randn(1, 3, 8, 8), torch.rand(1, 4, 6, 6)
    torch.jit.save(torch.jit.script(model), tmp_path / "scaled.pt")
    loaded = torch.jit.load(tmp_path / "scaled.pt").train()  # deployed, then left in training mode
    for script in (loaded, torch.jit.trace(model, (x, scale))):
        module = opsched.optimize(script, {"scale": scale, "x": x}, cost="analytic")
        assert module.graph.name == "Scaled" and module.inputs.describe() == "forward(x, scale)"
        assert script.training is (script is loaded)
        for inputs in ((x, scale), fresh_inputs((x, scale), seed=5)):
            with torch.no_grad():
                assert_close(module(*inputs), model(*inputs))
    with pytest.raises(FrontendError, match="give its arguments x, scale in order, leaving out only trailing ones"):
        opsched.optimize(loaded, {"scale": scale}, cost="analytic")
    with pytest.raises(FrontendError, match="needs example inputs of the TorchScript module Scaled"):
        opsched.optimize(loaded)


def test_a_program_exported_in_training_mode_or_a_module_without_inputs_is_refused_saying_why() -> None:
    x = torch.randn(2, 3, 8, 8)
    training = torch.export.export(Masked(), (x,))  # model.eval() forgotten: batch norms update their statistics
    with pytest.raises(StatefulModelError, match="buffer 'norm.running_mean', buffer 'norm.running_var' in place.*"
                                                 "its batch norms run in training mode: export the model after "
                                                 "model.eval\\(\\)"):
        opsched.optimize(training, cost="analytic")
    with pytest.raises(FrontendError, match="optimize\\(\\) needs example inputs of Masked: how it is called"):
        opsched.optimize(Masked().eval())
    with pytest.raises(FrontendError, match="got the path 'm.pt2': opsched.optimize\\(torch.export.load\\(path\\)\\)"):
        opsched.optimize("m.pt2")  # type: ignore[arg-type]


class Branches(nn.Module):
    """Data-dependent control flow as torch.export takes it: ``torch.cond``, two results."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.head = nn.Linear(4, 4), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        def positive(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.a(t).relu(), t * 2

        def negative(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.b(t).sigmoid(), t - 1

        y, z = torch.cond(x.sum() > 0, positive, negative, (x,))
        return self.head(y + z), z


def test_a_control_flow_operator_runs_whole_on_torch_and_either_branch_is_taken() -> None:
    """torch.export keeps torch.cond's branches as graphs of their own: the import stopped at
    them; the call is now an opaque node per result, between scheduled nodes."""
    model, x = Branches().eval(), torch.randn(2, 4)
    module = opsched.optimize(model, x, cost="analytic")
    assert sorted((n.name, n.attrs["target"]) for n in module.graph.nodes if n.op == "opaque") == [
        ("cond_0", "cond"), ("cond_1", "cond")]
    for taken in (x.abs(), -x.abs()):  # each branch
        with torch.no_grad():
            assert_close(list(module(taken)), list(model(taken)))


class Dilated(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Conv2d(4, 8, 3, padding=2, dilation=2)
        self.b = nn.Conv2d(4, 8, 2, padding=1, dilation=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.a(x) + self.b(x)


@pytest.mark.parametrize("scheduler", ["ios", "est"])
def test_dilated_convolutions_whose_paddings_cannot_share_a_kernel(scheduler: str) -> None:
    model, x = Dilated().eval(), torch.randn(1, 4, 12, 12)
    module = opsched.optimize(model, x, scheduler=scheduler, cost="analytic")
    assert not module.schedule.merges
    equal_on_fresh_inputs(model, module, (x,))


def test_optimize_leaves_the_model_in_its_mode() -> None:
    model = Attention()
    model.mlp.eval()  # mixed modes survive too
    opsched.optimize(model, torch.randn(2, 5, 16), **ANALYTIC)
    assert model.training and model.attn.training and not model.mlp.training


def test_the_module_keeps_the_weights_it_was_made_with_and_load_takes_new_ones() -> None:
    """Like an exported file, the module holds the model's weights as optimize() found them;
    weights changed after are the model's alone, and load() with the module's own schedule
    rebuilds it with them, with no search."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 4, 1)).eval()
    x = torch.randn(1, 3, 8, 8)
    fast = opsched.optimize(model, x, scheduler="greedy", **ANALYTIC)
    with torch.no_grad():
        before = model(x)
        model[0].weight.mul_(2)
        assert_close([fast(x)], [before])
        rebuilt = opsched.load(model, fast.schedule, x)
        assert_close([rebuilt(x)], [model(x)])
    assert rebuilt.outcome.seconds is None and rebuilt.schedule.lanes == fast.schedule.lanes


class Nested(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 5, 3, padding=1)

    def forward(self, x: torch.Tensor) -> dict[str, object]:
        a, b = self.a(x), self.b(x)
        return {"a": a, "pair": (b, [a + 1, torch.flatten(b, 1)]), "none": None, "k": 3}


@pytest.mark.parametrize("verify", [True, False])
def test_outputs_come_back_nested_as_the_model_returns_them(verify: bool) -> None:
    model, x = Nested().eval(), torch.randn(1, 3, 6, 6)
    # torch.export imports it (its None and 3 are fixed leaves of the output), nothing opaque
    assert {n.op for n in opsched.from_torch(model, x, tracer="export").nodes} == {"conv2d", "aten.elementwise",
                                                                                    "flatten"}
    out = opsched.optimize(model, x, cost="analytic", verify=verify)(x)
    with torch.no_grad():
        want = model(x)
    assert set(out) == set(want) and out["none"] is None and out["k"] == 3
    assert isinstance(out["pair"], tuple) and isinstance(out["pair"][1], list)
    assert_close(tensors(out), tensors(want))




class _Small(nn.Module):
    def __init__(self, steps: int) -> None:
        super().__init__()
        self.steps = steps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(self.steps):
            x = x.sin()
        return x


@pytest.mark.parametrize("backend", ["torch", "ort"])
@pytest.mark.parametrize("steps", [0, 1, 2])
def test_a_model_of_no_step_or_one_is_optimized_with_measured_costs(backend: str, steps: int,
                                                                     tmp_path: Path) -> None:
    """A model that computes nothing (it returns its input) or one thing has no segment to cut:
    ONNX Runtime's cut calibration failed on its empty plan."""
    model, x = _Small(steps), torch.randn(3, 4)
    module = opsched.optimize(model, x, backend=backend, cache_dir=str(tmp_path), budget_s=2, progress=False)
    assert len(module.graph.nodes) == steps
    assert_close(module(x), model(x))


class Masking(nn.Module):
    """ViTMAE's masking: patches kept by the order of noise, drawn unless given."""

    def __init__(self) -> None:
        super().__init__()
        self.project = nn.Linear(8, 8)

    def forward(self, patches: torch.Tensor, noise: torch.Tensor | None = None) -> torch.Tensor:
        noise = torch.rand(patches.shape[:2]) if noise is None else noise
        kept = noise.argsort(dim=1)[:, :3]
        return self.project(torch.gather(patches, 1, kept[..., None].expand(-1, -1, patches.shape[-1])))


def test_a_model_that_draws_random_numbers_is_refused_naming_them_and_runs_given_them() -> None:
    patches = torch.randn(2, 6, 8)
    with pytest.raises(ExecutionError, match=r"the model draws random numbers \('rand' \(aten::rand.default\)\), "
                                             r"so no two of its calls agree: give it those numbers as an input"):
        opsched.optimize(Masking(), patches, cost="analytic")
    model, inputs = Masking(), (patches, torch.rand(2, 6))
    equal_on_fresh_inputs(model, opsched.optimize(model, inputs, cost="analytic"), inputs)


class Bags(nn.Module):
    """Bags of ids given as offsets, which random integers are not (the first must be 0)."""

    def __init__(self) -> None:
        super().__init__()
        self.bags = nn.EmbeddingBag(50, 8, mode="mean")

    def forward(self, ids: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        return self.bags(ids, offsets).relu()


def test_a_model_refusing_fresh_random_inputs_is_checked_on_its_examples(caplog: pytest.LogCaptureFixture) -> None:
    model, inputs = Bags().eval(), (torch.randint(0, 50, (10,)), torch.tensor([0, 3, 6, 9]))
    module = opsched.optimize(model, inputs)
    assert "the model refuses fresh random inputs (RuntimeError: offsets[0] has to be 0" in caplog.text
    for xs in (inputs, (torch.randint(0, 50, (10,)), torch.tensor([0, 2, 5, 9]))):
        assert_close(module(*xs), model(*xs))

@dataclasses.dataclass
class Detections:
    """A user's own output type, as detection and segmentation models return theirs."""

    boxes: torch.Tensor
    scores: torch.Tensor
    label: str = "person"


class Detector(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.boxes, self.scores = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 1, 3, padding=1)

    def forward(self, x: torch.Tensor) -> tuple[Detections, torch.Tensor]:
        return Detections(self.boxes(x), self.scores(x).sigmoid()), x.mean()


@dataclasses.dataclass
class Unregistered:
    value: torch.Tensor


class ReturnsUnregistered(nn.Module):
    def forward(self, x: torch.Tensor) -> Unregistered:
        return Unregistered(x.relu())


def test_a_dataclass_output_comes_back_rebuilt_and_tracing_says_how_to_see_into_one() -> None:
    """optimize() registers the dataclasses a model returns as pytree nodes (torch.export's own
    register_dataclass), so their tensors are outputs; from_torch, which does not run the model,
    names the fix, where torch.fx used to make a graph with no outputs at all."""
    model, x = Detector().eval(), torch.randn(2, 3, 6, 6)
    for tracer in ("export", "fx"):
        module = opsched.optimize(model, x, tracer=tracer, cost="analytic")
        (got, mean), (want, want_mean) = module(x), model(x)
        assert type(got) is Detections and got.label == "person"
        assert_close([got.boxes, got.scores, mean], [want.boxes, want.scores, want_mean])
    for tracer in ("auto", "fx"):
        with pytest.raises(FrontendError, match=r"returns a Unregistered, whose tensors tracing cannot see: return "
                                                r"its tensors instead, or register it: "
                                                r"torch.export.register_dataclass\(Unregistered\)"):
            opsched.from_torch(ReturnsUnregistered(), x, tracer=tracer)


def test_one_tensor_given_for_several_inputs_is_traced_as_several() -> None:
    """``MultiheadAttention(x, x, x)`` projects once where ``query is key``: traced on the one
    tensor, the graph was wrong for any other three (and optimize's check refused it)."""
    attention, x = nn.MultiheadAttention(16, 2, batch_first=True).eval(), torch.randn(2, 5, 16)
    one, three = (opsched.from_torch(attention, xs) for xs in ((x, x, x), (x, x.clone(), x.clone())))
    assert one.structural_hash() == three.structural_hash()
    module = opsched.optimize(attention, (x, x, x))
    query, memory = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    for xs in ((query, query, query), (query, memory, memory)):
        with torch.no_grad():
            assert_close(tensors(module(*xs)), tensors(attention(*xs)))

@pytest.mark.parametrize(("example", "plain"), [
    ("t", True), (("t", "t"), False), (("t",), False), (["t", "t"], None), (("t", None), None),
    (("t", ("t",)), None), ({"a": "t"}, None),
])
def test_output_structures_rebuild_exactly_what_the_model_returned(example: object, plain: bool | None) -> None:
    """A lone tensor and a flat tuple of tensors take the shortcut; anything else rebuilds its tree,
    and both give what torch's pytree gives, containers' types included."""
    import torch.utils._pytree as pytree

    from opsched.module import OutputStructure

    marker = torch.empty(0)
    example = pytree.tree_map(lambda x: marker if x == "t" else x, example)
    structure = OutputStructure.of(example)
    outputs = [torch.full((1,), float(k)) for k in range(structure.tensors)]
    got, (leaves, spec) = structure.build(outputs), pytree.tree_flatten(example)
    it = iter(outputs)
    want = pytree.tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)
    assert structure._plain is plain
    assert pytree.tree_structure(got) == spec and type(got) is type(want)
    assert all(a is b for a, b in zip(pytree.tree_leaves(got), pytree.tree_leaves(want), strict=True))


def test_a_model_output_comes_back_with_its_fields_in_the_order_the_model_set_them() -> None:
    """A Hugging Face ``ModelOutput`` rebuilt from its leaves takes its fields' order; InternVL
    sets its vision output's pooled features after the others, so the rebuilt output held them
    elsewhere: ``out[1]`` and ``to_tuple()`` answered otherwise, and optimize()'s own check
    failed on a None where the model had a tensor."""
    transformers = pytest.importorskip("transformers")

    @dataclasses.dataclass
    class Pooled(transformers.utils.ModelOutput):
        last_hidden_state: torch.Tensor | None = None
        pooler_output: torch.Tensor | None = None
        hidden_states: tuple[torch.Tensor, ...] | None = None

    class SetsPooledLast(nn.Module):
        def forward(self, x: torch.Tensor) -> dict[str, object]:
            inner = Pooled(last_hidden_state=x.relu(), hidden_states=(x.sigmoid(),))
            inner.pooler_output = x.mean(1)
            return {"features": x.tanh(), "vision": inner}

    model, x = SetsPooledLast().eval(), torch.randn(2, 5, 4)
    module = opsched.optimize(model, x, cost="analytic")
    got, want = module(x), model(x)
    assert list(got["vision"]) == list(want["vision"]) == ["last_hidden_state", "hidden_states", "pooler_output"]
    assert_close(got["vision"][1], want["vision"][1])
    assert_close(tensors(got["vision"].to_tuple()), tensors(want["vision"].to_tuple()))
    assert_close(tensors(got), tensors(want))


@pytest.mark.parametrize("tracer", ["export", "fx"])
def test_a_model_output_whose_fields_are_set_in_another_order_while_traced_returns_each_in_its_place(
        tracer: str) -> None:
    """Mistral3's vision output sets its pooled features before its hidden states when compiled
    and after them when eager, so the trace's outputs came in another order than the eager
    output's leaves: each tensor went to another field (the check caught it, shapes apart, and
    refused the model). The graph's outputs and the output's leaves are both numbered in the
    class's fields' order now, whatever order either set them in."""
    transformers = pytest.importorskip("transformers")

    @dataclasses.dataclass
    class Pooled(transformers.utils.ModelOutput):
        last_hidden_state: torch.Tensor | None = None
        hidden_states: tuple[torch.Tensor, ...] | None = None
        pooler_output: torch.Tensor | None = None

    class SetsOtherwiseWhenCompiled(nn.Module):
        def forward(self, x: torch.Tensor) -> Pooled:
            out = Pooled(last_hidden_state=x.relu())
            if torch.compiler.is_compiling():
                out.pooler_output = x.mean(1)
                out.hidden_states = (x.sigmoid(),)
            else:
                out.hidden_states = (x.sigmoid(),)
                out.pooler_output = x.mean(1)
            return out

    model, x = SetsOtherwiseWhenCompiled().eval(), torch.randn(2, 5, 4)
    module = opsched.optimize(model, x, cost="analytic", tracer=tracer)
    got, want = module(x), model(x)
    assert list(got) == list(want) == ["last_hidden_state", "hidden_states", "pooler_output"]
    assert [tuple(t.shape) for t in tensors(got)] == [(2, 5, 4), (2, 5, 4), (2, 4)]
    assert_close(tensors(got), tensors(want))


class TokenTypes(nn.Module):
    """Ids into a table of two rows, as BERT's token types are."""

    def __init__(self) -> None:
        super().__init__()
        self.types, self.words = nn.Embedding(2, 8), nn.Embedding(50, 8)

    def forward(self, ids: torch.Tensor, types: torch.Tensor) -> torch.Tensor:
        return self.words(ids) + self.types(types)


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_plans_race_on_ids_valid_in_any_table(backend: str, tmp_path: Path) -> None:
    """The race's inputs are made from the graph alone, which does not know a table's size: random
    integers indexed past a two-row table (ORT) or below zero (torch) and optimize() failed."""
    model, ids, types = TokenTypes().eval(), torch.randint(0, 50, (2, 6)), torch.randint(0, 2, (2, 6))
    module = opsched.optimize(model, (ids, types), backend=backend, cache_dir=str(tmp_path), scheduler="greedy")
    assert module.outcome.race is not None  # greedy's lanes race the sequential plan
    equal_on_fresh_inputs(model, module, (ids, types))


# --- how the model is called ----------------------------------------------------------------------
class Keyed(nn.Module):
    """A forward as Hugging Face models have them: optional tensors, flags, a keyword-only argument."""

    def __init__(self) -> None:
        super().__init__()
        self.embed, self.proj = nn.Embedding(10, 8), nn.Linear(8, 8)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None, extra: torch.Tensor | None = None,
                scale: float = 1.0, *, pair: tuple[torch.Tensor, torch.Tensor] | None = None,
                return_dict: bool = True) -> object:
        h = self.proj(self.embed(ids)) * scale
        if mask is not None:
            h = h * mask[..., None]
        if extra is not None:
            h = h + extra
        if pair is not None:
            h = h + pair[0] * pair[1]
        return {"h": h} if return_dict else (h,)


def _keyed_example() -> dict[str, object]:
    return {"pair": (torch.randn(2, 4, 8), torch.randn(2, 4, 8)), "ids": torch.randint(0, 10, (2, 4)),
            "mask": torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]]), "scale": 2.0, "return_dict": False}


def test_keyword_inputs_are_bound_to_the_forward_whatever_their_order_or_spelling() -> None:
    from opsched.structure import InputStructure

    model, example = Keyed().eval(), _keyed_example()
    structure = InputStructure.of(model.forward, example)
    # canonical: bound positionally up to the first parameter left out, in the signature's order
    assert structure.names == ("ids", "mask", "pair[0]", "pair[1]")
    assert structure.describe() == "forward(ids, mask, scale=2.0, pair=(pair[0], pair[1]), return_dict=False)"
    ids, mask, pair = example["ids"], example["mask"], example["pair"]
    want = (ids, mask, *pair)  # type: ignore[misc]
    spellings = [((ids, mask), {"scale": 2.0, "pair": pair, "return_dict": False}),
                 ((ids, mask, None, 2.0), {"return_dict": False, "pair": pair}),
                 ((), {"return_dict": False, "pair": pair, "extra": None, "scale": 2.0, "mask": mask, "ids": ids})]
    for args, kwargs in spellings:  # an argument equal to its default is the call without it
        got = structure.tensors(args, kwargs)
        assert len(got) == len(want) and all(a is b for a, b in zip(got, want)), (args, kwargs)
    args, kwargs = structure.call(want)
    assert args[:2] == (ids, mask) and kwargs == {"scale": 2.0, "pair": pair, "return_dict": False}
    assert InputStructure.of(model.forward, (ids,)).plain and not structure.plain
    # every argument whole: a call passing exactly those is read without binding the signature
    flat = InputStructure.of(model.forward, {"mask": mask, "ids": ids, "return_dict": False})
    assert flat._arguments == (2, ("ids", "mask", "return_dict"))
    for args, kwargs in [((), {"return_dict": False, "mask": mask, "ids": ids}), ((ids,), {"return_dict": False,
                         "mask": mask}), ((ids, mask), {"return_dict": False})]:
        assert flat._direct(args, kwargs) is not None
        got = flat.tensors(args, kwargs)
        assert len(got) == 2 and got[0] is ids and got[1] is mask
    with pytest.raises(InputMismatchError, match=r"\(return_dict is left at its default, traced as False\)"):
        flat.tensors((), {"return_dict": True, "mask": mask, "ids": ids})  # True: the default
    with pytest.raises(InputMismatchError, match=r"\(mask is left at its default, traced as mask; scale is given, "
                                                 r"left at its default when traced\)"):
        flat.tensors((ids,), {"scale": 3.0, "return_dict": False})


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_a_module_optimized_with_keyword_inputs_is_called_as_the_model(backend: str) -> None:
    model, example = Keyed().eval(), _keyed_example()
    module = opsched.optimize(model, example, cost="analytic", backend=backend)  # verified: called as the model
    assert [i.name for i in module.graph.inputs] == ["ids", "mask", "pair_0", "pair_1"]
    ids, mask, pair = example["ids"], example["mask"], example["pair"]
    with torch.no_grad():
        want = model(**example)
        for args, kwargs in [((), example), ((ids, mask), {"scale": 2.0, "return_dict": False, "pair": pair})]:
            got = module(*args, **kwargs)
            assert isinstance(got, tuple) and len(got) == 1
            assert_close(list(got), list(want))
        with pytest.raises(InputMismatchError, match="argument scale was 2.0 when the model was traced.*got 3.0"):
            module(ids, mask, scale=3.0, pair=pair, return_dict=False)
        with pytest.raises(InputMismatchError, match=r"called as forward\(ids, mask, scale=2.0, pair=\(pair\[0\], "
                                                     r"pair\[1\]\), return_dict=False\), got forward\(<tensor 2x4 "
                                                     r"int64>, scale=2.0"):
            module(ids, scale=2.0, pair=pair, return_dict=False)
        with pytest.raises(InputMismatchError, match="unexpected keyword argument 'bogus'"):
            module(**example, bogus=1)
        with pytest.raises(InputMismatchError, match=r"input 'mask' of graph 'Keyed': expected f32\[2,4\]"):
            module(ids, mask[:1], scale=2.0, pair=pair, return_dict=False)


class IdsAndMask(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = Keyed()

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> object:
        return self.inner(ids, mask, return_dict=False)[0]


def test_a_module_made_from_a_graph_takes_its_inputs_by_name(tmp_path: Path) -> None:
    model, example = IdsAndMask().eval(), {"ids": torch.randint(0, 10, (2, 4)), "mask": torch.rand(2, 4)}
    path = tmp_path / "keyed.onnx"
    # named as files of other tools name them; called with the file's names, as ONNX Runtime's feeds are keyed
    torch.onnx.export(model, (example["ids"], example["mask"]), str(path), dynamo=False,
                      input_names=["input.1", "serving:mask"])
    module = opsched.optimize_graph(opsched.from_onnx(path), cost="analytic")
    assert module.inputs.describe() == "forward(input_1, serving_mask)"
    with torch.no_grad():
        want = tensors(model(**example))
        assert_close([module(**{"serving:mask": example["mask"], "input.1": example["ids"]})], want)
        assert_close([module(serving_mask=example["mask"], input_1=example["ids"])], want)
        with pytest.raises(InputMismatchError, match="missing a required argument: 'serving_mask'"):
            module(**{"input.1": example["ids"], "mask": example["mask"]})
        with pytest.raises(InputMismatchError, match="'input_1' must be a tensor, got ndarray \\(torch.from_numpy"):
            module(**{"input.1": example["ids"].numpy(), "serving:mask": example["mask"]})
    graph = opsched.from_torch(model, example)
    module = opsched.optimize_graph(graph, cost="analytic")
    assert module.inputs.describe() == "forward(ids, mask)"
    with pytest.raises(InputMismatchError, match="missing a required argument: 'mask'"):
        module(ids=example["ids"])


def test_onnx_input_names_that_become_one_identifier_stay_two_inputs(tmp_path: Path) -> None:
    """``a.b`` made an identifier is ``a_b``, the name of another input: the import failed with a
    duplicate name. The input already named ``a_b`` keeps its name; ``a.b`` is numbered."""
    import onnx
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("a.b", "a_b")]
    graph = helper.make_graph([helper.make_node("Sub", ["a.b", "a_b"], ["y"])], "names", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "names.onnx")
    module = opsched.optimize_graph(opsched.from_onnx(tmp_path / "names.onnx"), cost="analytic")
    assert module.inputs.describe() == "forward(a_b_1, a_b)"
    with torch.no_grad():
        assert_close(module(a_b=torch.ones(2), a_b_1=torch.full((2,), 3.0)), torch.full((2,), 2.0))
    with pytest.raises(InputMismatchError, match="missing a required argument: 'a_b_1'"):
        module(**{"a.b": torch.ones(2), "a_b": torch.ones(2)})  # "a.b" would be "a_b" too: not guessed


def test_a_saved_schedule_loads_for_keyword_inputs(tmp_path: Path) -> None:
    model, example = Keyed().eval(), _keyed_example()
    opsched.optimize(model, example, **ANALYTIC).save(tmp_path / "s.json")
    module = opsched.load(model, tmp_path / "s.json", example)
    with torch.no_grad():
        assert_close(tensors(module(**example)), tensors(model(**example)))


def test_a_schedule_saved_for_an_onnx_file_loads_for_it_and_names_what_differs(tmp_path: Path) -> None:
    """An ONNX file's schedule had no way back in: load() takes an nn.Module."""
    model, example = IdsAndMask().eval(), {"ids": torch.randint(0, 10, (2, 4)), "mask": torch.rand(2, 4)}
    path = tmp_path / "keyed.onnx"
    torch.onnx.export(model, (example["ids"], example["mask"]), str(path), dynamo=False, input_names=["ids", "mask"],
                      dynamic_axes={"ids": {0: "batch"}, "mask": {0: "batch"}})
    at_two = {"ids": (2, 4), "mask": (2, 4)}
    opsched.optimize_graph(opsched.from_onnx(path, input_shapes=at_two), cost="analytic").save(tmp_path / "s.json")
    module = opsched.load_graph(opsched.from_onnx(path, input_shapes=at_two), tmp_path / "s.json")
    with torch.no_grad():
        assert_close([module(mask=example["mask"], ids=example["ids"])], tensors(model(**example)))
    with pytest.raises(ScheduleMismatchError, match=r"made for graph main_graph with inputs ids int64\[2,4\], mask "
                                                    r"f32\[2,4\], not for 'main_graph', whose inputs are ids "
                                                    r"int64\[1,4\], mask f32\[1,4\]"):
        opsched.load_graph(opsched.from_onnx(path, input_shapes={"ids": (1, 4), "mask": (1, 4)}), tmp_path / "s.json")
    with pytest.raises(ScheduleMismatchError, match=r"whose inputs are ids int64\[2,4\], mask f16\[2,4\]"):
        opsched.load_graph(opsched.from_onnx(path, input_shapes=at_two), tmp_path / "s.json", dtype="float16")
    with pytest.raises(FrontendError, match=r"takes an imported Graph, got str: opsched.load_graph\(opsched.from_onnx"):
        opsched.load_graph(str(path), tmp_path / "s.json")


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_a_module_saved_whole_or_copied_runs_as_the_original(backend: str, tmp_path: Path) -> None:
    """torch.save(module) and copy.deepcopy(module) failed on its ONNX Runtime sessions and lane
    functions; now the copy binds its plan again, and loads without torch's tree-spec warnings."""
    import copy
    import gc
    import warnings

    cases = [(Nested().eval(), (torch.randn(1, 3, 6, 6),), {}), (Keyed().eval(), (), _keyed_example())]
    for model, args, kwargs in cases:
        module = opsched.optimize(model, kwargs or args, cost="analytic", backend=backend, scheduler="greedy",
                                  max_lanes=2)
        torch.save(module, tmp_path / "m.pt")
        copied, lanes = copy.deepcopy(module), module.plan.max_lanes
        del module
        gc.collect()  # a copy runs on its own executor, not on the original's closed one
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            loaded = torch.load(tmp_path / "m.pt", weights_only=False)
        with torch.no_grad():
            want = model(*args, **kwargs)
            for again in (copied, loaded):
                assert again.plan.max_lanes == lanes == 2
                got = again(*args, **kwargs)
                assert torch.utils._pytree.tree_structure(got) == torch.utils._pytree.tree_structure(want)
                assert_close(tensors(got), tensors(want))


def test_a_module_whose_opaque_callable_does_not_pickle_says_how_to_save_it(tmp_path: Path) -> None:
    import copy

    model, x = WithBranchy().eval(), torch.randn(1, 3, 4, 4)
    module = opsched.optimize(model, x, cost="analytic", leaf_modules=[Branchy])
    with pytest.raises(OpschedError, match=r"node 'inner' \(opaque\) runs a Python callable that does not pickle.*"
                                           r"module.save\(path\) and reapply it with opsched.load"):
        torch.save(module, tmp_path / "m.pt")
    equal_on_fresh_inputs(model, copy.deepcopy(module), (x,))  # a copy shares the callable


@dataclasses.dataclass
class Running:
    """What a model keeps for its caller between calls, as a Hugging Face cache is: it rebinds
    the fields (new tensors; the caller's are left as they were) and returns the object itself."""

    total: torch.Tensor
    peak: torch.Tensor


torch.export.register_dataclass(Running)


class Accumulate(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, state: Running) -> tuple[torch.Tensor, Running]:
        y = self.proj(x).relu()
        state.total = state.total + y
        state.peak = torch.maximum(state.peak, y)
        return y, state


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_an_argument_the_model_returns_changed_is_the_callers_own_object_changed(backend: str, tmp_path: Path
                                                                                ) -> None:
    """A decoder appends to the cache it is passed and returns it: a loop that passes one cache
    object on got a rebuilt copy back and its own cache left as it was, so the next step ran on
    stale state, silently. Now the caller's object takes the new contents and is returned, saved
    modules included."""
    def fresh() -> Running:
        return Running(torch.zeros(2, 8), torch.full((2, 8), -1.0))

    model = Accumulate().eval()
    module = opsched.optimize(model, (torch.randn(2, 8), fresh()), backend=backend, cost="analytic")
    torch.save(module, tmp_path / "m.pt")
    loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    for scheduled in (module, loaded):
        ours, theirs = fresh(), fresh()
        for step in range(3):
            x = torch.randn(2, 8, generator=torch.Generator().manual_seed(step))
            with torch.no_grad():
                got, want = scheduled(x, ours), model(x, theirs)
            assert got[1] is ours and want[1] is theirs
            assert_close([got[0], ours.total, ours.peak], [want[0], theirs.total, theirs.peak])


# --- precision ------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["dtype=", "model.bfloat16()"])
def test_bfloat16_runs_on_torch_kernels_where_onnx_runtime_cannot_hold_it(how: str) -> None:
    """The ONNX Runtime backend passes values as NumPy arrays, which have no bfloat16: optimize()
    failed in NumPy; now "auto" picks torch's kernels, and asking for ONNX Runtime says why not."""
    model, example = Keyed().eval(), _keyed_example()
    options: dict[str, object] = {"dtype": "bfloat16"}
    if how != "dtype=":
        model, options = model.bfloat16(), {}
        example = torch.utils._pytree.tree_map(
            lambda v: v.bfloat16() if isinstance(v, torch.Tensor) and v.is_floating_point() else v, example)
    module = opsched.optimize(model, example, cost="analytic", **options)  # verified against the model in bfloat16
    assert module.backend.name == "torch" and module.graph.inputs[1].type.dtype == "bfloat16"
    with pytest.raises(OpschedError, match="backend 'ort' cannot run a graph holding bfloat16.*NumPy has no "
                                           "bfloat16; backend='torch' can"):
        opsched.optimize(model, example, cost="analytic", backend="ort", **options)


def test_half_precision_is_checked_against_the_model_in_half_precision() -> None:
    """The check placed the model in its first input's dtype: with token ids first, it compared
    float16 outputs with the float32 model at float32's tolerance, and refused them."""
    model, example = Keyed().eval(), _keyed_example()
    module = opsched.optimize(model, example, dtype="float16", cost="analytic")
    assert module.backend.name == "ort" and module.graph.inputs[1].type.dtype == "float16"


# --- bad input gets a named error ----------------------------------------------------------------
def test_bad_inputs_and_arguments_are_named() -> None:
    model = Dilated().eval()
    with pytest.raises(InputMismatchError, match="zero-size dimension"):
        opsched.optimize(model, torch.randn(0, 4, 12, 12), **ANALYTIC)
    with pytest.raises(InputMismatchError, match="on the meta device"):
        opsched.optimize(model, torch.randn(1, 4, 12, 12, device="meta"), **ANALYTIC)
    with pytest.raises(ScheduleError, match="a scheduler's name or a sequence of names, got None"):
        opsched.optimize(model, torch.randn(1, 4, 12, 12), scheduler=None, **ANALYTIC)  # type: ignore[arg-type]
    with pytest.raises(FrontendError, match="takes a torch.nn.Module or a torch.export program, got function"):
        opsched.optimize(lambda x: x + 1, torch.randn(2), **ANALYTIC)  # type: ignore[arg-type]
    with pytest.raises(FrontendError, match=r"got the path 'model.onnx': for an ONNX file, opsched.optimize_graph.* "
                                             r"or opsched.optimize_per_shape\(path, inputs\)"):
        opsched.optimize("model.onnx", torch.randn(2), **ANALYTIC)  # type: ignore[arg-type]
    module = opsched.optimize(model, torch.randn(1, 4, 12, 12), **ANALYTIC)
    with pytest.raises(InputMismatchError, match="is for inference"):
        module(torch.randn(1, 4, 12, 12, requires_grad=True))
    with torch.no_grad():
        module(torch.randn(1, 4, 12, 12, requires_grad=True))


class Branchy(nn.Module):
    """Python control flow on a tensor's value: torch.fx cannot trace it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.relu() if float(x.sum()) > 0 else x.sigmoid()


class WithBranchy(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv, self.inner = nn.Conv2d(3, 3, 1), Branchy()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.conv(x)) + x


def test_leaf_modules_reach_the_importer_through_optimize() -> None:
    model, x = WithBranchy().eval(), torch.randn(1, 3, 4, 4)
    with pytest.raises(UntraceableModuleError, match="leaf_modules=\\[Branchy\\]"):
        opsched.optimize(model, x, **ANALYTIC)
    module = opsched.optimize(model, x, cost="analytic", leaf_modules=[Branchy])
    equal_on_fresh_inputs(model, module, (x,))


def test_onnx_input_shapes_must_name_the_model_inputs(tmp_path: Path) -> None:
    path = tmp_path / "d.onnx"
    torch.onnx.export(Dilated().eval(), (torch.randn(1, 4, 12, 12),), str(path), dynamo=False, input_names=["x"])
    with pytest.raises(FrontendError, match="input_shapes names 'y'.*inputs are 'x'"):
        opsched.from_onnx(path, input_shapes={"y": (1, 4, 12, 12)})


# --- the command line ----------------------------------------------------------------------------
def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    heavy = "('torch', 'onnx', 'onnxruntime', 'matplotlib')"
    probe = ("import sys; from opsched.cli.main import main; code = main(sys.argv[1:]); "
             f"print('imported:', sorted(m for m in {heavy} if m in sys.modules)); raise SystemExit(code)")
    return subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True)


def test_help_and_version_answer_without_importing_torch() -> None:
    version = _cli("--version")
    assert version.returncode == 0 and version.stdout.startswith(f"opsched {opsched.__version__}")
    assert "imported: []" in version.stdout
    top = _cli("--help")
    assert top.returncode == 0 and "optimize" in top.stdout and "imported: []" in top.stdout


def test_arguments_are_checked_before_any_work(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # the scheduler is checked before the (missing) model is looked for
    assert main(["optimize", "no_such_model", "--scheduler", "iso", "--cost", "analytic"]) == 1
    assert "no scheduler 'iso' (did you mean 'ios'?)" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:
        main(["optimize", "squeezenet1_1", "--rounds", "0"])
    assert exit_.value.code == 2 and "expected at least 1" in capsys.readouterr().err
    (tmp_path / "binary.json").write_bytes(bytes(range(256)))
    assert main(["show", str(tmp_path / "binary.json")]) == 1
    assert "not JSON, so not a schedule" in capsys.readouterr().err
    assert main(["cache", "export", "--cache-dir", str(tmp_path / "c"), str(tmp_path / "e.jsonl")]) == 0
    assert "wrote 0 measurements" in capsys.readouterr().out


def test_a_plan_runs_where_the_model_is_unless_told() -> None:
    """``optimize()``, ``load()`` and their graph forms without ``device``: the device of the
    model's weights, else of its inputs (a model of no weights), else the CPU; weights split
    across devices are refused, naming them. Meta stands in for a GPU: it is refused as a device to run on, by name,
    which shows it was the one taken."""
    from opsched.api import home_device

    model, x = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)).eval(), torch.randn(1, 3, 8, 8)
    meta = copy.deepcopy(model).to("meta")
    assert home_device(model, x) == torch.device("cpu")
    assert home_device(meta, x) == torch.device("meta")
    assert home_device(nn.ReLU(), {"input": x.to("meta")}) == torch.device("meta")
    assert home_device(nn.ReLU()) == torch.device("cpu")
    program = torch.export.export(nn.Linear(3, 2).to("meta"), (torch.randn(1, 3, device="meta"),))
    assert home_device(program) == torch.device("meta")
    split = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3).to("meta"))
    with pytest.raises(OpschedError, match=r"Sequential's weights are on 2 devices \(cpu, meta\); its plan runs on "
                                           r"one: pass device="):
        opsched.optimize(split, torch.randn(1, 3), **ANALYTIC)
    with pytest.raises(OpschedError, match="device 'meta' is not supported by this opsched"):
        opsched.optimize(meta, x.to("meta"), **ANALYTIC)
    module = opsched.optimize(model, x, **ANALYTIC)
    assert module.device == torch.device("cpu")
    equal_on_fresh_inputs(model, module, (x,))
    # an imported graph: where its weights are (an ONNX file's: the CPU)
    graph = opsched.from_torch(meta, x.to("meta"))
    assert home_device(graph) == torch.device("meta")
    with pytest.raises(OpschedError, match="device 'meta' is not supported by this opsched"):
        opsched.optimize_graph(graph, cost="analytic")
    assert opsched.optimize_graph(module.graph, cost="analytic").device == torch.device("cpu")


class PooledView(nn.Module):
    """Returns its tokens, a view of their first row (DINOv2's pooler output), and a flat view of
    its input."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = self.proj(x).relu()
        return tokens, tokens[:, 0], x.view(-1)


@pytest.mark.parametrize("backend", ["ort", "torch"])
def test_outputs_that_view_an_input_or_another_output_are_views_as_in_eager(backend: str, tmp_path: Path) -> None:
    """Eager's pooled row is a view of its tokens, and its flat input a view of the caller's
    tensor: so are the module's, a saved and loaded module's too, and what is written into one
    in place shows in the other."""
    model, x = PooledView().eval(), torch.randn(2, 3, 8)
    module = opsched.optimize(model, x, backend=backend, **ANALYTIC)
    module.save(tmp_path / "s.json")
    for m in (module, opsched.load(model, tmp_path / "s.json", x)):
        with torch.no_grad():
            mine, theirs = x.clone(), x.clone()
            got, want = m(mine), model(theirs)
        assert_close(list(got), list(want))
        tokens, pooled, flat = got
        assert pooled.untyped_storage().data_ptr() == tokens.untyped_storage().data_ptr()
        assert flat.untyped_storage().data_ptr() == mine.untyped_storage().data_ptr()
        for written in (tokens, want[0]):
            written.add_(1)
        for written in (mine, theirs):
            written.mul_(3)
        assert_close(list(got), list(want))  # the pooled rows and the flat inputs, changed alike
    assert [(v.output, v.base, v.of_input) for v in module.outputs.views] == [(2, 0, True), (1, 0, False)]


def test_a_view_of_an_input_passed_laid_out_otherwise_is_the_modules_own_tensor_of_its_values() -> None:
    """The module takes inputs of the example's shape whatever their strides: a transposed one
    is not laid out as the view was taken of the example, so that output is the module's own
    tensor, of the values eager's view has (a view taken by the example's strides would read
    other elements)."""
    class FirstRow(nn.Module):
        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return x.relu(), x[:, 0]

    model = FirstRow().eval()
    module = opsched.optimize(model, torch.randn(2, 3, 8), **ANALYTIC)
    across = torch.randn(3, 2, 8).transpose(0, 1)  # (2, 3, 8), strides of another order
    with torch.no_grad():
        got, want = module(across), model(across)
    assert_close(list(got), list(want))
    assert got[1].untyped_storage().data_ptr() != across.untyped_storage().data_ptr()


def test_a_view_of_an_output_laid_out_otherwise_is_taken_of_it_laid_out_as_the_models() -> None:
    """Where the module's output is laid out otherwise than the model's (strides of another
    order), it is laid out as the model's first, so that the view takes the model's elements."""
    from opsched.structure.returns import View

    base = torch.arange(6.0).reshape(2, 3)
    row = View(output=1, base=0, of_input=False, size=(3,), stride=(1,), offset=3, base_size=(2, 3), base_stride=(3, 1))
    other = base.t().contiguous().t()  # the same values, column-major
    laid, view = row.made(other)
    assert laid.stride() == (3, 1) and torch.equal(laid, base) and torch.equal(view, base[1])
    assert view.untyped_storage().data_ptr() == laid.untyped_storage().data_ptr()
    same, again = row.made(base)
    assert same is base and again.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()

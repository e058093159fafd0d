"""``torch.compile(model, backend="opsched")``: equal to eager on the zoo and on third-party models,
through graph breaks, new shapes and new weights; options checked; what cannot be scheduled runs
eagerly with the reason recorded (or raises, when asked)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from torch import nn

import opsched.dynamo as od
from opsched.cli.main import main
from opsched.errors import OpschedError
from opsched.models import example_inputs, get_model, list_models
from opsched.schedule import Schedule
from opsched.testing import assert_close
from opsched.testing.corpus import corpus, corpus_available, wide_corpus

FAST = {"cost": "analytic", "verify": False}


@pytest.fixture(autouse=True)
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dynamo and the backend with nothing compiled, and a schedule cache of the test's own."""
    monkeypatch.setenv("OPSCHED_CACHE_DIR", str(tmp_path))
    _restart()


def _restart() -> None:
    """What a new process meets: neither Dynamo nor the backend holds a graph (files stay)."""
    torch._dynamo.reset()
    od.reset()


def _compiled(model: nn.Module, **options: object) -> nn.Module:
    return torch.compile(model, backend="opsched", options={**FAST, **options})  # type: ignore[return-value]


def _leaves(out: object) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


class Branchy(nn.Module):
    """Two parallel convolutions, a graph break, two more: two graphs for Dynamo."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 1)
        self.c, self.d = nn.Conv2d(16, 4, 3, padding=1), nn.Conv2d(16, 4, 1)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.cat([self.a(x).relu(), self.b(x).sigmoid()], 1)
        torch._dynamo.graph_break()
        return self.c(y) + self.d(y), y.mean((2, 3))


def test_the_backend_is_found_through_its_entry_point_with_no_import() -> None:
    code = textwrap.dedent("""
        import sys, torch
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).eval()
        f = torch.compile(m, backend="opsched", options={"cost": "analytic"})
        x = torch.randn(1, 3, 8, 8)
        with torch.no_grad():
            assert torch.allclose(f(x), m(x), atol=1e-5)
        assert "opsched.dynamo" in sys.modules
        print(len(__import__("opsched.dynamo").dynamo.compiled_graphs()))
    """)
    assert "opsched" in torch._dynamo.list_backends(exclude_tags=())
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "1"


def test_a_new_process_loads_the_schedule_an_earlier_one_searched(tmp_path: Path) -> None:
    """Two processes compile one model: the second loads the first's schedule from the schedule
    cache, with no search (Dynamo's graph code, and so the key, is the same in both)."""
    code = textwrap.dedent("""
        import torch, opsched.dynamo as od
        from opsched.models import example_inputs, get_model
        m, x = get_model("squeezenet1_1").eval(), example_inputs("squeezenet1_1", 1)
        with torch.no_grad():
            assert torch.allclose(torch.compile(m, backend="opsched", options={"cost": "analytic"})(*x), m(*x),
                                  atol=1e-4)
        (bucket,) = od.compiled_graphs()[0].buckets
        print(bucket.searched, bucket.cached is not None)
    """)

    def run() -> str:
        env = {**os.environ, "OPSCHED_CACHE_DIR": str(tmp_path)}
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()

    assert run() == "True False"
    assert len(list((tmp_path / "schedules").glob("*.json"))) == 1
    assert run() == "False True"


def _schedule_files(cache: Path) -> dict[int, Path]:
    """The schedule cache's files by the operator count of the graph each was searched for."""
    return {json.loads(p.read_text())["cached"]["about"]["operators"]: p
            for p in (cache / "schedules").glob("*.json")}


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_schedule_searched_once_is_loaded_after_a_restart_equal_to_eager(
        tmp_path: Path, device: str, capsys: pytest.CaptureFixture[str]) -> None:
    model, x = Branchy().eval().to(device), torch.randn(1, 3, 16, 16, device=device)
    with torch.no_grad():
        expected = _leaves(model(x))
        assert_close(_leaves(_compiled(model)(x)), expected, "searched")
        searched = od.compiled_graphs()
        files = _schedule_files(tmp_path)
        assert sorted(files) == sorted(g.operators for g in searched)  # one schedule each side of the break
        _restart()
        assert_close(_leaves(_compiled(model)(x)), expected, "loaded")
    loaded = od.compiled_graphs()
    assert [g.searches for g in searched] == [1, 1] and [g.searches for g in loaded] == [0, 0]
    assert [g.buckets[0].cached for g in loaded] == [str(files[g.operators]) for g in loaded]
    assert [g.buckets[0].schedule for g in loaded] == [g.buckets[0].schedule for g in searched]
    assert "(0 searched, 1 from the schedule cache)" in od.report() and "the schedule cache's" in od.report()
    for graph in loaded:  # a cached file is a schedule file: Schedule.load, opsched.load and opsched show read it
        saved, summary = Schedule.load(files[graph.operators]), graph.buckets[0].schedule
        assert summary is not None and (saved.scheduler, saved.estimated_ms) == (summary.scheduler,
                                                                               summary.estimated_ms)
    assert main(["cache", "list", "--cache-dir", str(tmp_path), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert sorted((e["about"]["operators"], e["scheduler"], e["backend"]) for e in listed) == sorted(
        (g.operators, "ios", g.buckets[0].backend) for g in loaded)
    assert {b.backend for g in loaded for b in g.buckets} == {"cuda" if device == "cuda" else "ort"}


def test_the_schedule_cache_serves_only_the_same_graph_inputs_and_options(tmp_path: Path) -> None:
    def conv(width: int) -> nn.Module:  # the same code whatever the width: the weights' sizes differ
        return nn.Sequential(nn.Conv2d(3, width, 3), nn.ReLU(), nn.Conv2d(width, 4, 1)).eval()

    x = torch.randn(1, 3, 12, 12)
    with torch.no_grad():
        _compiled(conv(8))(x)
        for model, inputs, options in [(conv(8), torch.randn(1, 3, 14, 14), {}),  # another shape
                                       (conv(16), x, {}),                        # other weights' sizes
                                       (conv(8), x, {"scheduler": "sequential"}),  # another option
                                       (conv(8), x, {"schedule_cache": False})]:   # not asked to
            _restart()
            assert_close(_compiled(model, **options)(inputs), model(inputs), str(options))
            assert od.compiled_graphs()[0].searches == 1, (options, od.report())
        _restart()
        _compiled(conv(8), verify=True)(x)  # a setting that does not change the plan: loaded
        assert od.compiled_graphs()[0].searches == 0, od.report()
    assert len(_schedule_files(tmp_path)) == 1 and len(list((tmp_path / "schedules").glob("*.json"))) == 4


def test_a_corrupt_or_foreign_cache_file_is_set_aside_or_replaced_and_the_graph_searched(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    model, x = Branchy().eval(), torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        expected = _leaves(model(x))
        _compiled(model)(x)
        files = _schedule_files(tmp_path)
        first, second = (files[g.operators] for g in od.compiled_graphs())
        foreign = json.loads(second.read_text())
        data = json.loads(first.read_text())
        first.write_text(json.dumps({**foreign, "cached": data["cached"]}))  # the other graph's schedule, this key
        second.write_text(second.read_text()[:100])                           # truncated
        _restart()
        assert_close(_leaves(_compiled(model)(x)), expected, "searched again")
    assert [g.searches for g in od.compiled_graphs()] == [1, 1], od.report()

    def made_for(path: Path) -> str:
        return str(json.loads(path.read_text())["graph_hash"])

    assert made_for(first) == data["graph_hash"] != foreign["graph_hash"]  # replaced by one that fits
    assert second.with_suffix(".corrupt").exists() and made_for(second) == foreign["graph_hash"]
    assert "cannot be used" in caplog.text and second.name in caplog.text


def test_an_unwritable_schedule_cache_warns_once_and_loses_nothing(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "schedules").write_text("a file where the directory would be")
    model, x = Branchy().eval(), torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        assert_close(_leaves(_compiled(model)(x)), _leaves(model(x)), "unwritable cache")
    assert [g.searches for g in od.compiled_graphs()] == [1, 1]
    assert caplog.text.count("cannot be written") == 1


@pytest.mark.parametrize("name", list_models())
def test_every_zoo_model_compiles_equal_to_eager(name: str) -> None:
    model, inputs = get_model(name), example_inputs(name)
    compiled = _compiled(model, scheduler="greedy")
    with torch.no_grad():
        assert_close(_leaves(compiled(*inputs)), _leaves(model(*inputs)), name)
    (graph,) = od.compiled_graphs()
    (bucket,) = graph.buckets
    assert bucket.schedule is not None and bucket.fallback is None, bucket
    assert bucket.shapes == (tuple(inputs[0].shape),)


@pytest.mark.parametrize("specialize", ["graph", "shape"])
def test_graph_breaks_and_new_shapes_each_get_a_plan(specialize: str) -> None:
    model = Branchy().eval()
    compiled = _compiled(model, scheduler="ios", specialize=specialize)
    with torch.no_grad():
        for batch in (1, 2, 3, 2):
            x = torch.randn(batch, 3, 16, 16)
            assert_close(_leaves(compiled(x)), _leaves(model(x)), f"batch {batch}")
    graphs = od.compiled_graphs()
    # Dynamo: two graphs at batch 1, then both again with a dynamic batch; opsched: a bucket per batch
    assert len(graphs) == 4
    assert [len(g.buckets) for g in graphs] == [1, 1, 2, 2]
    assert [b.shapes[0][0] for b in graphs[2].buckets] == [2, 3]
    assert graphs[2].buckets[1].reason == "new input shapes"
    assert all(b.schedule is not None for g in graphs for b in g.buckets)
    assert sum(g.recompiles for g in graphs) == 2
    # a dynamic graph searches once and reapplies that schedule at batch 3, unless asked per shape
    reused = [b.schedule_of for g in graphs for b in g.buckets]
    assert reused == ([None, None, None, 0, None, 0] if specialize == "graph" else [None] * 6)
    assert [g.searches for g in graphs] == ([1, 1, 1, 1] if specialize == "graph" else [1, 1, 2, 2])
    text = od.report()
    assert "4 graphs, 2 recompiles" in text and "new input shapes" in text
    assert ("bucket 0's schedule" in text) == (specialize == "graph")


@pytest.mark.gpu
def test_on_a_gpu_a_dynamic_graphs_schedule_is_reapplied_captured_equal_to_eager() -> None:
    model = Branchy().eval().cuda()
    compiled = _compiled(model, scheduler="ios")
    with torch.no_grad():
        for batch in (1, 2, 3):
            x = torch.randn(batch, 3, 16, 16, device="cuda")
            assert_close(_leaves(compiled(x)), _leaves(model(x)), f"batch {batch}")
    graphs = od.compiled_graphs()
    assert [b.schedule_of for g in graphs for b in g.buckets] == [None, None, None, 0, None, 0], od.report()
    assert {b.backend for g in graphs for b in g.buckets} == {"cuda"}


class _Reshapes(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.fc = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 1), nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.cat([self.a(x).relu(), self.b(x)], 1)
        return self.fc(y.mean((2, 3))).reshape(x.shape[0], 2, 2)


def test_inputs_marked_dynamic_are_imported_at_their_sizes_with_nothing_opaque(
        caplog: pytest.LogCaptureFixture) -> None:
    """``torch._dynamo.mark_dynamic`` on the caller's inputs: Dynamo captures a dynamic graph, and
    each shape's import (the graph's sizes made constants) still goes through torch.export, which
    would otherwise take the mark on the input for a dynamic size and refuse the graph."""
    model = _Reshapes().eval()
    compiled = _compiled(model)
    with torch.no_grad():
        for batch in (3, 5, 2):
            x = torch.randn(batch, 3, 12, 12)
            torch._dynamo.mark_dynamic(x, 0)
            assert_close(_leaves(compiled(x)), _leaves(model(x)), f"batch {batch}")
    assert not [r for r in caplog.records if "opaque" in r.getMessage()]
    (graph,) = od.compiled_graphs()
    assert [b.schedule_of for b in graph.buckets] == [None, 0, 0]


def test_a_shape_past_max_shapes_runs_as_captured_and_is_reported_once(caplog: pytest.LogCaptureFixture) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    compiled = _compiled(model, scheduler="greedy", max_shapes=2)
    with torch.no_grad(), caplog.at_level("WARNING", logger="opsched.dynamo"):
        for batch in (1, 2, 3, 4, 5, 3):
            x = torch.randn(batch, 3, 8, 8)
            assert_close(compiled(x), model(x), f"batch {batch}")
    graphs = od.compiled_graphs()
    # batch 1 (static), then a dynamic graph: 2 and 3 hold plans, 4 and 5 run as captured, with no bucket kept
    assert [[b.schedule is not None for b in g.buckets] for g in graphs] == [[True], [True, True]]
    assert [b.shapes[0][0] for b in graphs[1].buckets] == [2, 3]
    assert len([r for r in caplog.records if "max_shapes" in r.getMessage()]) == 1
    assert "2 calls past max_shapes=2, eagerly: [4x3x8x8] to [5x3x8x8]" in od.report()


@pytest.mark.parametrize(("batches", "planned"), [
    ((1, 2, 3, 4, 5, 3, 6, 5), [2, 3, 5]),  # 3 again served by its plan; 4, 5, 6 as captured; 5 met again planned
    ((1, 2, 3, 2, 4, 2, 5, 2, 6), [2, 3, 4, 5, 6]),  # a shape that recurs between new ones: never in a row
])
def test_a_dynamic_graph_whose_shapes_are_new_at_every_call_plans_only_shapes_met_again(
        batches: tuple[int, ...], planned: list[int], caplog: pytest.LogCaptureFixture) -> None:
    """A plan pays off where its shape recurs. A detector's post-processing meets a new count of
    boxes at almost every call (RetinaNet's box decoding rebuilt a plan at each, 0.4-0.9 s against
    its 0.3 s call on this CPU): past ``max_new_in_a_row`` new shapes in a row, a new shape runs as
    captured at its first call and gets a plan at its second; the shapes that hold plans keep them."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    compiled = _compiled(model, scheduler="greedy", max_new_in_a_row=2)
    with torch.no_grad(), caplog.at_level("WARNING", logger="opsched.dynamo"):
        for batch in batches:
            x = torch.randn(batch, 3, 8, 8)
            assert_close(compiled(x), model(x), f"batch {batch}")
    static, dynamic = od.compiled_graphs()
    assert [b.shapes[0][0] for b in dynamic.buckets if b.schedule is not None] == planned, od.report()
    assert len(dynamic.buckets) == len(planned)
    churned = len(planned) < len(set(batches)) - 1  # a shape the dynamic graph met (all but 1) holds no bucket
    said = [r for r in caplog.records if "max_new_in_a_row" in r.getMessage()]
    assert len(said) == churned
    assert [str(c) for c in dynamic.as_captured] == churned * [
        "3 calls after max_new_in_a_row=2 new shapes in a row, eagerly: [4x3x8x8] to [6x3x8x8]"]


class Normalizes(nn.Module):
    """Normalises its input in place before its convolutions, as preprocessing code does."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.sub_(0.5).div_(0.25)
        return self.a(x) + self.b(x)


def test_an_input_the_graph_changes_in_place_is_changed_as_eager_changes_it() -> None:
    model = Normalizes().eval()
    compiled = _compiled(model, scheduler="ios")
    for _ in range(2):
        x = torch.rand(1, 3, 8, 8)
        theirs, mine = x.clone(), x.clone()
        with torch.no_grad():
            assert_close(compiled(mine), model(theirs))
        assert_close(mine, theirs)
    (graph,) = od.compiled_graphs()
    assert graph.buckets[0].schedule is not None  # scheduled by opsched, not run eagerly


class WritesAfterABreak(nn.Module):
    """Returns views across a graph break, then writes in place into what they view: the first
    graph's ``flat`` views its input, ``rows`` the layer's output it returns beside it."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        flat, h = x.view(-1), self.lin(x)
        rows = h[:, :4]
        torch._dynamo.graph_break()
        x.mul_(2)
        h.add_(1)
        return flat, rows, h


def test_views_a_graph_returns_share_memory_as_in_eager_so_writes_after_it_show_in_them() -> None:
    """A graph whose outputs view its input or another output returns views: what the code after
    the graph writes in place into the input or that output shows in them, as in eager (they were
    copies, 2.3 and 1.0 from eager)."""
    model = WritesAfterABreak().eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        want = model(x.clone())
        got = _compiled(model, scheduler="ios")(x.clone())
    assert_close(list(got), list(want))
    (first, _) = od.compiled_graphs()
    assert first.buckets[0].schedule is not None  # scheduled by opsched, not run eagerly


class Counts(nn.Module):
    """Counts its calls in a buffer, through a view: state that must change as it does eagerly."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 1)
        self.register_buffer("calls", torch.zeros(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls[0].add_(1)
        return self.conv(x)


def test_a_graph_that_changes_the_models_state_runs_as_captured_and_counts_every_call() -> None:
    """Its buffer's version changed at every call, so each call was a new bucket, optimized anew
    (the check's runs counting calls too): three calls counted nine."""
    model = Counts().eval()
    compiled = _compiled(model)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(1, 3, 8, 8)
            assert_close(compiled(x), model.conv(x))
    assert float(model.calls[0]) == 3
    (graph,) = od.compiled_graphs()
    assert len(graph.buckets) == 1 and graph.recompiles == 0
    assert "changes l_self_buffers_calls_ in place" in (graph.buckets[0].fallback or "")


def test_new_weights_and_another_instance_are_never_served_stale_results() -> None:
    first, second = Branchy().eval(), Branchy().eval()
    x = torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        compiled = _compiled(first)
        assert_close(_leaves(compiled(x)), _leaves(first(x)), "first")
        first.a.weight.mul_(2)  # in place: the same tensor, a new version
        assert_close(_leaves(compiled(x)), _leaves(first(x)), "weights changed in place")
        other = _compiled(second)  # the same code: Dynamo reuses its graphs, with second's weights as inputs
        assert_close(_leaves(other(x)), _leaves(second(x)), "another instance")
    reasons = [[b.reason for b in g.buckets] for g in od.compiled_graphs()]
    # self.a is read before the graph break: its change renews the first graph's schedule alone
    assert reasons == [["first call", "new weights", "new weights"], ["first call", "new weights"]]


def test_a_graph_dynamo_hands_over_again_reapplies_its_twins_schedule_and_no_other() -> None:
    """Calling under ``inference_mode`` after ``no_grad`` makes Dynamo capture the same graph anew
    (its guards differ): the new graph reapplies the first's schedule, with no search. A graph of
    as many operators whose import differs (a kernel size) is searched for itself."""
    model, x = Branchy().eval(), torch.randn(1, 3, 16, 16)
    compiled = _compiled(model, scheduler="ios")
    with torch.no_grad():
        expected = _leaves(model(x))
        assert_close(_leaves(compiled(x)), expected, "no_grad")
    with torch.inference_mode():
        assert_close(_leaves(compiled(x)), expected, "inference_mode")
    graphs = od.compiled_graphs()
    assert len(graphs) == 4, od.report()  # two graphs either side of the break, under each mode
    assert [(b.schedule_of, b.graph_of) for g in graphs for b in g.buckets] == [
        (None, None), (None, None), (0, 0), (0, 1)]
    assert [g.buckets[0].schedule for g in graphs[2:]] == [g.buckets[0].schedule for g in graphs[:2]]
    assert "graph 0's bucket 0's schedule" in od.report()

    other = Branchy().eval()
    other.a = nn.Conv2d(3, 8, 5, padding=2)  # as many operators, another convolution
    torch._dynamo.reset()  # Dynamo forgets; the backend's graphs stay, twins for the new ones
    with torch.no_grad():
        assert_close(_leaves(_compiled(other, scheduler="ios")(x)), _leaves(other(x)), "another structure")
    first, second = od.compiled_graphs()[4:]
    assert (first.buckets[0].schedule_of, first.buckets[0].graph_of) == (None, None)  # searched: a 5x5 kernel
    # after the break the same graph: the schedule reapplied is the one searched, graph 1's
    assert (second.buckets[0].schedule_of, second.buckets[0].graph_of) == (0, 1)


def test_a_graph_dynamo_lets_go_of_is_freed_with_its_plans_and_still_reported_and_reapplied() -> None:
    """The backend kept every graph it was handed, and each graph its modules, weights and
    sessions, for the life of the process; it keeps only their report and schedules now. (A
    model with a graph break is not the test: Dynamo itself keeps a compiled function of such a
    model in the model's module after ``torch._dynamo.reset()``.)"""
    import gc
    import weakref

    handed: list[weakref.ref[od.OpschedGraph]] = []

    def keeping_count(gm: torch.fx.GraphModule, example: list[torch.Tensor]) -> od.OpschedGraph:
        graph = od.backend(gm, example, options={**FAST, "scheduler": "ios"})
        handed.append(weakref.ref(graph))
        return graph

    model, x = Parallel().eval(), torch.randn(1, 3, 16, 16)
    with torch.no_grad():
        expected = model(x)
        assert_close(torch.compile(model, backend=keeping_count)(x), expected)
    assert len(handed) == 1 and handed[0]() is not None
    torch._dynamo.reset()  # Dynamo lets go of the graph
    gc.collect()
    assert handed[0]() is None
    assert [len(g.buckets) for g in od.compiled_graphs()] == [1]  # still reported
    with torch.no_grad():  # the same graph again: its schedule reapplied, as a twin's, with no search
        assert_close(_compiled(model, scheduler="ios")(x), expected)
    assert [(b.schedule_of, b.graph_of) for b in od.compiled_graphs()[1].buckets] == [(0, 0)]


class Parallel(nn.Module):
    """Two parallel convolutions, concatenated: one graph for Dynamo."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(3, 8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.a(x).relu(), self.b(x).sigmoid()], 1)


class _Anchored(nn.Module):
    """torchvision's anchor generator: a list of tensors the model assigns anew at each call
    (``.to()``, which under Dynamo makes new tensors), plus ``step`` (0: the same values)."""

    def __init__(self, step: float) -> None:
        super().__init__()
        self.conv, self.step = nn.Conv2d(3, 8, 3, padding=1), step
        self.anchors = [torch.arange(8.0).view(1, 8, 1, 1)]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.anchors = [a.to(dtype=x.dtype, device=x.device) + self.step for a in self.anchors]
        return self.conv(x) * self.anchors[0]


@pytest.mark.parametrize("step", [0.0, 1.0])
def test_a_weight_assigned_anew_at_each_call_keeps_its_plan_where_its_values_do(step: float) -> None:
    """A new tensor in a weight's place is compared by value with the one the plan was made
    with: Faster R-CNN's region proposals rebuilt their plan at every call (a second a call
    on this CPU), and past max_shapes ran eagerly. Values that do change get a plan of their
    own, never a stale one."""
    model = _Anchored(step).eval()
    twin = _Anchored(step).eval()
    twin.load_state_dict(model.state_dict())
    compiled = _compiled(model)
    with torch.no_grad():
        for i in range(4):
            x = torch.randn(1, 3, 8, 8)
            assert_close(compiled(x), twin(x), f"call {i}")
    (graph,) = od.compiled_graphs()
    assert [b.reason for b in graph.buckets] == ["first call"] + ["new weights"] * 3 * bool(step), od.report()


def test_a_graph_that_failed_to_schedule_fails_again_when_its_weights_are_assigned_anew() -> None:
    """With ``fallback=False`` a graph opsched cannot hold raises; its weights were remembered as
    though it held a plan, and the next call, its anchors assigned anew, met a KeyError."""
    class Float8Anchored(_Anchored):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x).to(torch.float8_e4m3fn).to(torch.float32)

    compiled = _compiled(Float8Anchored(0.0).eval(), fallback=False)
    with torch.no_grad():
        for _ in range(2):
            with pytest.raises(OpschedError, match="float8_e4m3fn"):
                compiled(torch.randn(1, 3, 8, 8))


@pytest.mark.parametrize("skipped", ["stance", "filter"])
def test_with_dynamos_guards_skipped_new_weights_are_never_stale_and_a_new_shape_is_refused(skipped: str) -> None:
    """Dynamo's guards skipped, by ``set_stance(skip_guard_eval_unsafe=True)`` or by
    ``guard_filter_fn=skip_all_guards_unsafe``: the backend's own check of the weights still
    gives new weights a plan of their own; a new shape, which the skipped guards would have sent
    to a new graph, is refused (by Dynamo itself under the stance; by the backend under the
    filter, naming the shapes, where the graph's baked sizes would otherwise fail or be wrong)."""
    first, second = Branchy().eval(), Branchy().eval()
    x = torch.randn(1, 3, 16, 16)
    options = {"guard_filter_fn": torch.compiler.skip_all_guards_unsafe} if skipped == "filter" else {}
    with torch.no_grad():
        compiled, other = _compiled(first, **options), _compiled(second, **options)
        compiled(x)
        with (torch.compiler.set_stance("default", skip_guard_eval_unsafe=True) if skipped == "stance"  # set on call
              else contextlib.nullcontext()):
            first.c.weight.mul_(2)
            assert_close(_leaves(compiled(x)), _leaves(first(x)), "weights changed in place")
            assert_close(_leaves(other(x)), _leaves(second(x)), "another instance, never compiled itself")
            refused = (pytest.raises(RuntimeError, match="Recompilation") if skipped == "stance" else
                       pytest.raises(OpschedError, match=r"graph 0 .* captured by Dynamo for inputs \[1x3x16x16 "
                                     r"float32\] on cpu and is called with \[2x3x16x16 float32\] on cpu"))
            with refused:
                compiled(torch.randn(2, 3, 16, 16))
    reasons = [[b.reason for b in g.buckets] for g in od.compiled_graphs()]
    assert reasons == [["first call", "new weights"], ["first call", "new weights", "new weights"]]


def test_a_graph_opsched_cannot_hold_runs_eagerly_with_the_reason_or_raises_when_asked() -> None:
    class Float8RoundTrip(nn.Module):  # the rounding of an 8-bit float, simulated
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.to(torch.float8_e4m3fn).to(torch.float32) * 2 + 1

    model, x = Float8RoundTrip(), torch.randn(2, 8)
    with torch.no_grad():
        assert_close(_compiled(model)(x), model(x), "fallback")
        (graph,) = od.compiled_graphs()
        assert graph.buckets[0].schedule is None
        assert "float8_e4m3fn, which opsched does not hold" in str(graph.buckets[0].fallback)
        torch._dynamo.reset()
        with pytest.raises(OpschedError, match="node '.*'.*float8_e4m3fn"):
            _compiled(model, fallback=False)(x)


def test_a_graph_of_weights_alone_runs_eagerly() -> None:
    class Constant(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = nn.Parameter(torch.randn(4))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.w * 2

    model = Constant()
    with torch.no_grad():
        assert_close(_compiled(model)(torch.randn(3)), model(torch.randn(3)), "constant")
    assert "reads no input tensor" in str(od.compiled_graphs()[0].buckets[0].fallback)


def test_a_graph_met_with_an_empty_input_runs_eagerly_saying_so_and_a_full_one_is_scheduled() -> None:
    """Higgs-audio's text-only call hands its audio layers inputs of shape (0, 64)."""
    class Gated(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x).relu() + self.b(x)

    model = Gated()
    compiled = _compiled(model)
    with torch.no_grad():
        for rows in (0, 3):
            x = torch.randn(rows, 8)
            assert_close(compiled(x), model(x), f"{rows} rows")
    buckets = [b for g in od.compiled_graphs() for b in g.buckets]
    assert [b.schedule is None for b in buckets] == [True, False]
    assert "its input tensor 0 has shape (0, 8), with no elements" in str(buckets[0].fallback)


@pytest.mark.parametrize("options, mode, message", [
    ({"schedular": "ios"}, None, "no scheduler of \\['ios'\\] has option 'schedular'"),
    ({"scheduler": "iso"}, None, "iso"),
    ({"dtype": "float16"}, None, "option 'dtype' is not taken by the opsched backend"),
    ({}, "turbo", "mode 'turbo' is not one of"),
    ({"specialize": "batch"}, None, "specialize is one of 'shape', 'graph', got 'batch'"),
    ({"max_shapes": 0}, None, "max_shapes is a positive number of input shapes, got 0"),
    ({"max_new_in_a_row": True}, None, "max_new_in_a_row is a positive number of calls, got True"),
    ({"schedule_cache": "off"}, None, "schedule_cache is True or False, got 'off'"),
])
def test_bad_options_fail_at_compile_time_naming_what_is_accepted(options: dict[str, object], mode: str | None,
                                                                  message: str) -> None:
    with pytest.raises(Exception, match=message):
        od.backend(torch.fx.symbolic_trace(nn.ReLU()), [torch.randn(2)], mode=mode, options=options)


def test_max_autotune_races_two_schedulers() -> None:
    model = Branchy().eval()
    # torch.compile takes a mode or options, never both: the backend is called as torch would with the mode
    compiled = torch.compile(model, backend=lambda gm, xs: od.backend(gm, xs, mode="max-autotune", options=FAST))
    with torch.no_grad():
        x = torch.randn(1, 3, 16, 16)
        assert_close(_leaves(compiled(x)), _leaves(model(x)), "max-autotune")
    assert all(b.schedule is not None and b.schedule.scheduler in ("ios", "est")
               for g in od.compiled_graphs() for b in g.buckets)


CORPUS = ["bert", "convnext", "resnet"]
WIDE = wide_corpus() if corpus_available() else {}


@pytest.mark.skipif(not corpus_available(), reason="needs Hugging Face transformers")
@pytest.mark.parametrize("name", CORPUS)
def test_third_party_models_compile_equal_to_eager(name: str) -> None:
    model, inputs = corpus()[name].build()
    compiled = _compiled(model, scheduler="greedy")
    with torch.no_grad():
        assert_close(_leaves(compiled(*inputs)), _leaves(model(*inputs)), name)
    assert all(b.schedule is not None for g in od.compiled_graphs() for b in g.buckets), od.report()


@pytest.mark.slow
@pytest.mark.parametrize("name", list(WIDE))
def test_the_wide_corpus_compiles_equal_to_eager_with_every_graph_scheduled(name: str) -> None:
    """``benchmarks/sweep.py``'s torch.compile column. The eager call comes first, as a user's
    would: RWKV rescales its weights in place on its first call in eval mode. Every graph that
    reads an input is scheduled; one that reads none runs eagerly (Dynamo breaks Encodec's graph
    at each convolution's data-dependent padding, leaving its weight normalisations alone). Where
    the outputs differ from eager's by more than the tolerance (HGNetV2's trained-looking batch
    norms amplify rounding), they are as near its float64 outputs as eager's own."""
    model, inputs = WIDE[name].build()
    with torch.no_grad():
        expected = _leaves(model(*inputs))
        assert_close(_leaves(_compiled(model, scheduler="greedy")(*inputs)), expected, name, model=model, inputs=inputs)
    eager = {b.fallback for g in od.compiled_graphs() for b in g.buckets if b.schedule is None}
    assert eager <= {"the graph reads no input tensor: it computes from its weights alone"}, od.report()


@pytest.mark.skipif(not corpus_available(), reason="needs Hugging Face transformers")
def test_a_model_torch_export_cannot_trace_compiles_through_its_graph_breaks() -> None:
    """Longformer: ``optimize()`` cannot import it (its global attention asks ``.item()`` of the
    mask), Dynamo breaks the graph there. Its encoder chunks the sequence by ``as_strided`` over
    a transposed tensor, which ran 1e-3 off on ONNX Runtime and so ran eagerly."""
    import transformers as hf

    torch.manual_seed(0)
    model = hf.LongformerModel(hf.LongformerConfig(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128,
        attention_window=[8, 8], max_position_embeddings=80)).eval()
    ids = torch.randint(0, 100, (1, 32))
    compiled = _compiled(model, scheduler="greedy", backend="ort")
    with torch.no_grad():
        assert_close(_leaves(compiled(ids)), _leaves(model(ids)), "longformer")
    graphs = od.compiled_graphs()
    assert len(graphs) >= 2, od.report()
    assert all(b.schedule is not None for g in graphs for b in g.buckets), od.report()


class _Vmapped(nn.Module):
    """A region under ``torch.vmap`` (Mamba's scan vmaps its combine step)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.vmap(lambda row: self.lin(row).relu() * row.sum())(x) + 1


def test_a_vmapped_region_is_scheduled_as_the_aten_calls_it_batches() -> None:
    """Dynamo's graph of it calls vmap's pre-dispatch functions, which torch.export keeps until
    its decompositions run; they were skipped for a program that writes nothing in place, and
    the graph ran eagerly ("not an ATen operator")."""
    model, x = _Vmapped().eval(), torch.randn(3, 4)
    with torch.no_grad():
        assert_close(_compiled(model, scheduler="greedy")(x), model(x))
    (graph,) = od.compiled_graphs()
    assert [b.schedule is not None for b in graph.buckets] == [True], od.report()


def _llama() -> nn.Module:
    import transformers as hf

    torch.manual_seed(0)
    return hf.LlamaForCausalLM(hf.LlamaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                              num_attention_heads=2, num_key_value_heads=1,
                                              intermediate_size=64)).eval()


@pytest.mark.skipif(not corpus_available(), reason="needs Hugging Face transformers")
def test_generation_with_a_static_cache_is_two_schedules_made_once() -> None:
    """Hugging Face ``generate()`` through the backend: the prompt and a decoding step are the two
    graphs, each scheduled on its first call; the static cache keeps every step at one shape,
    so a second generation makes nothing new, and the tokens are eager's."""
    model = _llama()
    prompt = torch.randint(0, 100, (1, 5))
    settings = {"max_new_tokens": 6, "do_sample": False, "cache_implementation": "static"}
    want = model.generate(prompt, **settings)
    model.forward = torch.compile(model.forward, backend="opsched", options=FAST)
    for _ in range(2):
        assert torch.equal(model.generate(prompt, **settings), want)
    graphs = od.compiled_graphs()
    assert len(graphs) == 2 and all(g.recompiles == 0 for g in graphs), od.report()
    assert all(b.schedule is not None for g in graphs for b in g.buckets), od.report()


@pytest.mark.skipif(not corpus_available(), reason="needs Hugging Face transformers")
def test_generation_with_a_growing_cache_searches_once_per_graph() -> None:
    """With the default dynamic cache every decoding step is a new length: Dynamo makes the step's
    graph dynamic at its second length, and the backend searches that graph once, reapplying its
    schedule at each later length (a search a token, before), until max_new_in_a_row (4) lengths
    in a row have each been new: later steps run as Dynamo captured them, as a plan would serve one
    step; the tokens are eager's."""
    model = _llama()
    prompt = torch.randint(0, 100, (1, 5))
    settings = {"max_new_tokens": 7, "do_sample": False}
    want = model.generate(prompt, **settings)
    model.forward = torch.compile(model.forward, backend="opsched", options=FAST)
    assert torch.equal(model.generate(prompt, **settings), want)
    graphs = od.compiled_graphs()
    prompt_graph, first_step, steps = graphs  # the prompt; the first step; every later one, dynamic
    assert [len(g.buckets) for g in graphs] == [1, 1, 4], od.report()
    assert all(b.schedule is not None for g in graphs for b in g.buckets), od.report()
    assert [b.schedule_of for b in steps.buckets] == [None, 0, 0, 0], od.report()
    assert [(c.why, c.calls) for c in steps.as_captured] == [("after max_new_in_a_row=4 new shapes in a row", 1)]
    assert [g.searches for g in graphs] == [1, 1, 1]

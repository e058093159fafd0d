"""The measured cost model: prices built from node prices, pairs timed together, ORT profiles."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
import torch
from torch import nn

import opsched
from opsched.backends import get_backend
from opsched.backends.ort import OrtBackend, OrtExecutor, ort_available
from opsched.backends.ort_profile import KernelEvent, KernelTimes, kernel_events, kernel_times
from opsched.cost import AnalyticCostModel, MeasuredCostModel, ProfileStore, SegmentCut, StageTiming, TimingPolicy
from opsched.cost.measured import Calibrations
from opsched.errors import ExecutionError
from opsched.execution import RunOptions
from opsched.ir import Graph, GraphBuilder, random_inputs
from opsched.runtime import lower_stage, run_graph, stage_inputs
from opsched.runtime.plan import cut_segments, lower
from opsched.schedule import Stage
from opsched.schedulers import schedule
from opsched.testing import assert_close

needs_ort = pytest.mark.skipif(not ort_available(), reason="needs onnxruntime")
RUN = RunOptions()


def branches(channels: int = 32, size: int = 14) -> Graph:
    """x -> a -> b, x -> c, x -> d, then a sum; 1x1, 3x3, 5x5 and 7x7 convolutions, so that no two
    are structurally equal (the store would rightly give them one price)."""
    b = GraphBuilder("branches")
    x = b.input("x", (1, channels, size, size))
    gen = torch.Generator().manual_seed(0)

    def conv(src: str, name: str, k: int) -> str:
        w = b.param(f"w_{name}", torch.randn(channels, channels, k, k, generator=gen) * 0.05)
        return b.add("conv2d", [src], name=name, params=[w], padding=k // 2, act="relu")

    a = conv(x, "a", 1)
    bb = conv(a, "b", 3)
    c = conv(x, "c", 5)
    d = conv(x, "d", 7)
    return b.build([b.add("add", [bb, c, d], name="out")]).verify()


class Scripted:
    """A backend that times by formula instead of by clock: node kernels from ``kernel``; run as
    several lanes, a stage's wall is 90% of its nodes' total; a merge's kernels are 70% of its
    members' and its split forces 0.1 ms of conversions each way."""

    name = "scripted"
    relative_pricing = True
    default_policy = TimingPolicy(warmup=0, repeat=3)

    def __init__(self) -> None:
        self.kernel = {"a": 1.0, "b": 2.0, "c": 0.5, "d": 3.0}

    def profile_tag(self, run: RunOptions) -> str:
        return "scripted-v1"

    def fingerprint(self, run: RunOptions) -> str:
        return "a test machine"

    def versions(self) -> str:
        return "none"

    def segment_cut(self, graph: Graph, run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> SegmentCut | None:
        return None

    def time_stages(self, graph: Graph, stages: Sequence[Stage], run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> list[StageTiming]:
        out = []
        for st in stages:
            work = sum(self.kernel[v] for v in st.nodes)
            if st.strategy == "merge":
                wall, segment = work, 0.7 * work + 2 * 0.1
            elif len(st.groups) > 1:
                wall, segment = 0.9 * work, work
            else:
                wall, segment = work + 0.5, work
            out.append(StageTiming((wall,) * 3, (segment,) * 3))  # three rounds alike
        return out


def test_prices_are_built_from_node_prices_and_timed_pairs(tmp_path: Path) -> None:
    graph, backend = branches(), Scripted()
    with ProfileStore(tmp_path) as store:
        cost = MeasuredCostModel(backend, store=store)
        assert cost.stage_latency(graph, Stage((("a",),))) == 1.0  # its kernel, not its call
        assert cost.stage_latency(graph, Stage((("a", "b"),))) == 3.0  # a stretch: the sum, nothing run
        assert cost.counts.timed == 2  # a and b alone
        # several lanes: nodes' sum x the phase's wall / serial kernels, timed as a pair
        together = 0.9 * 3.5  # a, b and c: 3.5 ms of kernels
        assert cost.stage_latency(graph, Stage((("a", "b"), ("c",)))) == pytest.approx(3.5 * together / 3.5)
        # never below its dearest group (monotone): with d at 30 ms, 30.5 x 0.9 < 30
        backend.kernel["d"] = 30.0
        assert cost.stage_latency(graph, Stage((("c",), ("d",)))) == 30.0
        # a merge: its kernels and the conversions out of and back into the blocked layout that
        # its split forces, against the members' serial kernels
        assert cost.stage_latency(graph, Stage((("a",), ("c",)), "merge")) == pytest.approx(0.7 * 1.5 + 2 * 0.1)


def test_parts_come_from_the_store(tmp_path: Path) -> None:
    graph = branches()
    with ProfileStore(tmp_path) as store:
        MeasuredCostModel(Scripted(), store=store).stage_latency(graph, Stage((("a",),)))
    with ProfileStore(tmp_path) as store:
        backend = Scripted()
        backend.kernel["a"] = 100.0  # a later measurement would disagree; the stored price stands
        cost = MeasuredCostModel(backend, store=store)
        assert cost.stage_latency(graph, Stage((("a", "b"),))) == 1.0 + 2.0
        assert cost.counts.timed == 1 and cost.counts.reused == 1  # b timed; a, stored earlier, reused


def test_a_pair_is_priced_at_the_upper_quartile_of_its_rounds() -> None:
    graph, backend = branches(), Scripted()
    plain = backend.time_stages

    def pair(graph: Graph, stages: Sequence[Stage], *rest: object) -> list[StageTiming]:
        if len(stages) == 1:
            return plain(graph, stages, *rest)  # type: ignore[arg-type]
        # running together paid in one round of four (ratio 0.5), cost more in the others
        return [StageTiming((0.5, 1.2, 1.1, 1.3), (9.0,) * 4), StageTiming((2.0,) * 4, (1.0,) * 4)]

    backend.time_stages = pair  # type: ignore[method-assign,assignment]
    price = MeasuredCostModel(backend).stage_latency(graph, Stage((("a",), ("c",))))
    assert price == pytest.approx(1.5 * 1.225)  # the upper quartile of 0.5, 1.1, 1.2, 1.3, interpolated


class Known(dict[str, float]):
    """Calibrations known in advance."""

    def remember(self, name: str, measure: Callable[[], float]) -> float:
        return self[name] if name in self else self.setdefault(name, measure())


@needs_ort
def test_segment_cut_on_ort_converts_what_crosses() -> None:
    graph = branches(channels=8, size=4)  # 8x4x4 float32: 512 bytes a value
    known = Known({"call_ms": 0.05, "layout_in_ms_per_mib": 2.0, "layout_out_ms_per_mib": 1.0,
                   f"cut_residual_ms/{graph.structural_hash()}": 0.1})
    cut = get_backend("ort").segment_cut(graph, RUN, TimingPolicy(), known)
    assert cut is not None and cut.resume_ms == pytest.approx(0.05 + 2 * 0.1)  # a call, and two cuts' residue
    mib = 8 * 4 * 4 * 4 / 2**20
    assert cut.leave_ms["x"] == pytest.approx(mib) and cut.enter_ms["a"] == pytest.approx(2 * mib)
    assert MeasuredCostModel(get_backend("torch")).segment_cut(graph) is None  # torch segments: no cost to cut


def test_the_layout_rates_are_the_least_of_probes_spread_in_time(monkeypatch: pytest.MonkeyPatch) -> None:
    # whatever slows one probe (about 10 ms) slows all of it: the rates are its probes' least medians
    import opsched.backends.ort as ort_module

    monkeypatch.setattr(ort_module, "PROBE_GAP_S", 0.0)
    backend = OrtBackend()
    # per probe, its rounds' (layout in, layout out) in ms: the first probe slowed throughout
    probes = iter([[(3.0, 2.0)] * 3, [(1.0, 0.9), (1.2, 0.5), (1.1, 0.6)], [(1.3, 0.8)] * 3,
                   [(1.05, 0.7)] * 3, [(2.0, 1.0)] * 3])
    calls: list[int] = []

    def profiled(graph: Graph, stages: Sequence[Stage], run: RunOptions, policy: TimingPolicy
                 ) -> list[tuple[list[float], list[KernelTimes]]]:
        calls.append(policy.repeat)
        rounds = next(probes)
        return [([1.0] * len(rounds), [KernelTimes(0.5, i, o) for i, o in rounds])]

    monkeypatch.setattr(backend, "_profiled", profiled)
    into, out = backend.layout_ms_per_mib(RUN, TimingPolicy(), Known())
    mib = 64 * 56 * 56 * 4 / 2**20
    assert len(calls) == ort_module.LAYOUT_PROBES == 5 and calls[0] == 11  # each probe: 11 rounds at least
    assert into == pytest.approx(1.05 / mib) and out == pytest.approx(0.6 / mib)  # the medians' least, each


@needs_ort
def test_a_cut_plan_computes_the_same_and_its_cost_is_measured_once(tmp_path: Path) -> None:
    graph = branches(channels=16, size=8)
    plan = lower(graph, schedule(graph, "sequential", AnalyticCostModel("CPU2")))
    cut = cut_segments(plan, [1, 3])
    assert [len(p.lanes[0]) for p in cut.phases] == [1, 2, len(plan.steps) - 3]
    x = random_inputs(graph)
    assert_close(OrtExecutor(graph, cut)(x), OrtExecutor(graph, plan)(x))
    with pytest.raises(ValueError, match="one one-lane phase"):
        cut_segments(cut, [2])
    ort = get_backend("ort")
    assert isinstance(ort, OrtBackend)
    policy = TimingPolicy(warmup=1, repeat=2)
    with ProfileStore(tmp_path) as store:
        model = MeasuredCostModel(ort, policy=policy, store=store)
        residue = ort.cut_residual_ms(graph, RUN, policy, model, cuts=2)
        assert residue >= 0.0 and model.counts.timed >= 1
        again = MeasuredCostModel(ort, policy=policy, store=store)
        assert ort.cut_residual_ms(graph, RUN, policy, again, cuts=2) == residue
        assert again.counts.timed == 0 and again.counts.reused >= 1  # from the store


def test_kernel_times_split_runs_and_layout(tmp_path: Path) -> None:
    events = [{"cat": "Session", "name": "model_run", "ts": 100, "dur": 50},
              {"cat": "Node", "name": "x_kernel_time", "ts": 101, "dur": 4000, "args": {"op_name": "ReorderInput"}},
              {"cat": "Node", "name": "c_nchwc_kernel_time", "ts": 110, "dur": 20000, "args": {"op_name": "Conv"}},
              {"cat": "Node", "name": "c_nchwc_fence_before", "ts": 110, "dur": 0, "args": {"op_name": "Conv"}},
              {"cat": "Session", "name": "model_run", "ts": 200, "dur": 50},
              {"cat": "Node", "name": "c_nchwc_kernel_time", "ts": 205, "dur": 30000, "args": {"op_name": "Conv"}},
              {"cat": "Node", "name": "y_kernel_time", "ts": 240, "dur": 1000, "args": {"op_name": "ReorderOutput"}}]
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(events))

    class Session:
        def end_profiling(self) -> str:
            return str(path)

    assert kernel_times(Session()) == [KernelTimes(20.0, 4.0, 0.0), KernelTimes(30.0, 0.0, 1.0)]
    assert not path.exists()  # the profile file is removed once read
    path.write_text(json.dumps(events))
    assert kernel_events(Session())[1] == [KernelEvent("c_nchwc", "Conv", 0.005, 30.0),
                                           KernelEvent("y", "ReorderOutput", 0.04, 1.0)]


@needs_ort
def test_ort_measurement_separates_kernels_from_the_call() -> None:
    graph = branches(channels=64, size=28)
    ort = get_backend("ort")
    assert isinstance(ort, OrtBackend)
    policy = TimingPolicy(warmup=1, repeat=3)
    stages = [Stage((("d",),)), Stage((("a",), ("d",)))]
    alone, together = ort.time_stages(graph, stages, RUN, policy, Known(call_ms=0.01))
    assert len(alone.wall_ms) == len(alone.segment_ms) == len(together.segment_ms) == 3
    assert all(0 < k < w for k, w in zip(alone.segment_ms, alone.wall_ms))  # kernels, without the call's overhead
    # two groups: two sessions on two lanes, their kernel times summed (what one lane would
    # run); each lane's kernels run within the call, though the lanes' may overlap in time
    assert all(0 < k < 2 * w for k, w in zip(together.segment_ms, together.wall_ms))
    ((_, kernels), _) = ort._profiled(graph, stages, RUN, policy)
    assert kernels is not None and min(k.layout_in_ms for k in kernels) > 0  # blocked convolutions: converted
    assert min(k.layout_out_ms for k in kernels) > 0                          # at the session's edges
    (t,) = get_backend("torch").time_stages(graph, [Stage((("d",),))], RUN, policy, Known(call_ms=0.01))
    assert t.segment_ms == tuple(w - 0.01 for w in t.wall_ms)  # torch: the call less an empty one


class _InversePermutation(nn.Module):
    """A mixture of experts' routing, in small: rows sorted by a score, and the inverse of that
    order written through it (``inv[perm] = arange``) over a tensor of out-of-range indices, then
    read as gather indices. Every entry is written only where ``perm`` is a permutation."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        perm = torch.sort(x[:, 0]).indices
        inverse = torch.full_like(perm, x.shape[0])
        inverse[perm] = torch.arange(x.shape[0])
        return (x[perm] * 2).relu()[inverse] + x


@pytest.mark.parametrize("backend", ["torch", pytest.param("ort", marks=needs_ort)])
def test_stages_are_timed_on_the_indices_their_graph_computes(backend: str, tmp_path: Path) -> None:
    """A stage is timed on drawn inputs, and the indices the graph computes were drawn as zeros:
    the inverse order, written through zeros, keeps its out-of-range entries, and the stage's
    gather fails (Qwen2-MoE's routing has this shape, over an ``empty_like``). The integer values
    a graph computes are now its own, computed from its drawn inputs; and the model optimizes,
    measured, equal to eager."""
    model, x = _InversePermutation(), torch.randn(8, 4)
    graph = opsched.from_torch(model, x)
    written = next(n for n in graph.nodes if n.attrs.get("target") == "aten::index_put.default")
    gather = next(n for n in graph.nodes if written.name in n.inputs)
    stage = Stage(((written.inputs[0], written.name, gather.name),))  # the sentinels, the writes, the gather
    sub, _ = lower_stage(graph, stage)
    assert [i.type.dtype for i in sub.inputs] == ["int64", "float32"]  # the order, and the rows
    with pytest.raises(ExecutionError, match="out of"):
        run_graph(sub, random_inputs(sub))
    run_graph(sub, stage_inputs(graph, sub))  # indices in range
    module = opsched.optimize(model, x, backend=backend, scheduler="ios", cache_dir=tmp_path, verify=True)
    assert_close(module(x), model(x))

"""Placement on heterogeneous units: HEFT and PEFT against hand-computed schedules, the chain
program against brute force, the unit simulator, and every placement scheduler's plan run
across two CPU units (and a simulated NPU, emulated) equal to eager."""

from __future__ import annotations

import functools
import itertools
import logging
import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import opsched
from opsched.cost import AnalyticCostModel
from opsched.cost.unit_costs import PlatformCost, UnitCosts
from opsched.cost.units import ConvRule, Link, Platform, Unit, platform
from opsched.errors import CostModelError, InvalidScheduleError, OpschedError, ScheduleError
from opsched.models import example_inputs, get_model
from opsched.module import ScheduledModule
from opsched.schedule import Lane, Schedule
from opsched.schedulers import schedule
from opsched.schedulers.chain_dp import place_chain
from opsched.schedulers.heft import heft, upward_ranks
from opsched.schedulers.peft import optimistic_costs, peft
from opsched.schedulers.placed_sim import simulate_placed
from opsched.schedulers.tasks import task_graph
from opsched.testing import assert_close, random_dag
from opsched.testing.fuzz import FuzzNet

PLACERS = ["partitiontuner", "heft", "peft", "type-based", "profiled"]
CPU = AnalyticCostModel("CPU2")

# The task graph of Topcuoglu, Hariri and Wu (IEEE TPDS 2002), Fig. 2: ten tasks, three processors.
W = [(14, 16, 9), (13, 19, 18), (11, 13, 19), (13, 8, 17), (12, 13, 10), (13, 16, 9), (7, 15, 11), (5, 11, 14),
     (18, 12, 20), (21, 7, 16)]
E = [(0, 1, 18), (0, 2, 12), (0, 3, 9), (0, 4, 11), (0, 5, 14), (1, 7, 19), (1, 8, 16), (2, 6, 23), (3, 7, 27),
     (3, 8, 23), (4, 8, 13), (5, 7, 15), (6, 9, 17), (7, 9, 11), (8, 9, 13)]


def test_heft_reproduces_the_papers_schedule() -> None:
    tasks = task_graph(W, E)
    assert [round(r, 3) for r in upward_ranks(tasks)] == [108.0, 77.0, 80.0, 80.0, 69.0, 63.333, 42.667, 35.667,
                                                          44.333, 14.667]
    s = heft(tasks)
    assert s.makespan == 80.0
    # the paper's Gantt chart: (processor, start) per task, P1..P3 numbered from 0
    assert list(zip(s.proc, s.start)) == [(2, 0), (0, 27), (2, 9), (1, 18), (2, 28), (1, 26), (2, 38), (0, 57),
                                          (1, 56), (1, 73)]


def test_peft_optimistic_costs_and_first_choices_by_hand() -> None:
    tasks = task_graph(W, E)
    table = optimistic_costs(tasks)
    # OCT(t, p) for t's only successor t10: min over q of w(t10, q) + c(t, t10) where q != p.
    # t7 (c = 17): p1 min(21, 7+17, 16+17) = 21; p2 7; p3 min(16, 7+17) = 16.
    assert table[6] == [21, 7, 16]
    assert table[7] == [18, 7, 16]   # t8, c = 11: p1 min(21, 7+11) = 18
    assert table[8] == [20, 7, 16]   # t9, c = 13: p1 min(21, 7+13) = 20
    assert table[9] == [0, 0, 0]
    s = peft(tasks)
    # t1 first: O_EFT = w + OCT = 14+48, 16+38, 9+53 -> p2
    assert table[0] == [48, 38, 53] and s.proc[0] == 1 and s.start[0] == 0
    # t4 (rank 31, highest after t1) on p2: 8 + 19 after t1, no copy: 16..24, O_EFT 43 (p1: 25+13+38 = 76)
    assert (s.proc[3], s.start[3]) == (1, 16)
    assert s.makespan <= sum(min(r) for r in W)  # never worse than running everything one after another


def _brute_chain(m, units, group, switch, exit_cost):
    best = math.inf
    for placed in itertools.product(units, repeat=m):
        # every way of cutting each same-unit run into groups: a cut or not between neighbours
        for cuts in itertools.product((True, False), repeat=m - 1):
            if any(not c and placed[k] != placed[k + 1] for k, c in enumerate(cuts)):
                continue
            starts = [0] + [k + 1 for k, c in enumerate(cuts) if c]
            bounds = list(zip(starts, starts[1:] + [m]))
            if any(j - i > 3 for i, j in bounds):
                continue
            total = sum(group(i, j, placed[i]) for i, j in bounds)
            total += sum(switch(k, placed[k - 1], placed[k]) for k in range(1, m) if placed[k - 1] != placed[k])
            best = min(best, total + exit_cost(placed[-1]))
    return best


@pytest.mark.parametrize("seed", range(40))
def test_chain_program_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    m, units = rng.randint(1, 6), ["a", "b", "c"][: rng.randint(2, 3)]
    exec_ms = {(k, u): (math.inf if rng.random() < 0.2 else rng.uniform(1, 10)) for k in range(m) for u in units}
    fused = {(i, j, u): rng.uniform(0.5, 1.0) * sum(exec_ms[(k, u)] for k in range(i, j))
             for i in range(m) for j in range(i + 2, min(m, i + 3) + 1) for u in units if rng.random() < 0.5}
    moves = {(k, a, b): rng.uniform(0, 4) for k in range(m) for a in units for b in units}
    exits = {u: rng.uniform(0, 3) for u in units}

    def group(i, j, u):
        return exec_ms[(i, u)] if j - i == 1 else fused.get((i, j, u), math.inf)

    args = (m, units, group, lambda k, a, b: moves[(k, a, b)], exits.__getitem__)
    want = _brute_chain(*args)
    if not math.isfinite(want):
        with pytest.raises(ValueError):
            place_chain(*args)
        return
    got = place_chain(*args)
    assert got.cost == pytest.approx(want)
    # the placement it returns costs what it says
    again = sum(group(i, j, got.units[i]) for i, j in got.groups)
    again += sum(moves[(k, got.units[k - 1], got.units[k])] for k in range(1, m) if got.units[k - 1] != got.units[k])
    assert again + exits[got.units[-1]] == pytest.approx(got.cost)


@pytest.fixture(scope="module", params=["squeezenet1_1", "googlenet", "resnet18", "randwire_small"])
def zoo(request: pytest.FixtureRequest) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], opsched.Graph]:
    model = get_model(request.param).eval()
    inputs = example_inputs(request.param)
    return model, inputs, opsched.from_torch(model, inputs)


@pytest.mark.parametrize("scheduler", PLACERS)
@pytest.mark.parametrize("where", ["cpu-pools", "cpu+npu", pytest.param("cpu+cuda", marks=pytest.mark.gpu)])
def test_placed_plans_equal_eager(zoo, scheduler: str, where: str, caplog: pytest.LogCaptureFixture,
                                  strict_float32: None) -> None:
    """On ``cpu+cuda`` the lanes on the GPU take their inputs across (pinned host memory,
    copies ordered by events) and the plan is compared in strict float32 with the CPU model."""
    model, inputs, graph = zoo
    with caplog.at_level(logging.ERROR):
        module = opsched.optimize_graph(graph, cost=CPU, scheduler=scheduler, platform=where, check=False)
    sched = module.schedule
    assert module.backend.name == "units" and sched.options["platform"] == where
    assert {lane.device for lane in sched.lanes} <= set(platform(where).names)
    with torch.no_grad():
        assert_close(module(*inputs), model(*inputs), f"{graph.name} / {scheduler} / {where}")


def test_partitiontuner_spreads_parallel_branches_over_identical_units() -> None:
    graph = opsched.from_torch(get_model("googlenet").eval(), example_inputs("googlenet"))
    sched = schedule(graph, "partitiontuner", CPU, platform="cpu-pools")
    assert sched.stats["spread"] > 0 and len(sched.lanes) == 2
    assert sched.estimated_ms < schedule(graph, "type-based", CPU, platform="cpu-pools").estimated_ms


def test_exhaustive_is_the_least_of_every_topological_placement() -> None:
    graph = opsched.from_torch(get_model("googlenet").eval(), example_inputs("googlenet"))
    block = [n.name for n in graph.nodes][8:24]  # the stem's end and the first inception block
    sub = graph.subgraph(block, name="googlenet.block")
    best = schedule(sub, "exhaustive", CPU, platform="cpu+npu")
    assert best.stats["placements"] > 1
    for name in ("partitiontuner", "type-based", "profiled"):
        assert best.estimated_ms <= schedule(sub, name, CPU, platform="cpu+npu").estimated_ms + 1e-9
    with pytest.raises(ScheduleError, match="max_placements=4"):
        schedule(sub, "exhaustive", CPU, platform="cpu+npu", max_placements=4)


def test_partitiontuner_refinement_reaches_the_optimum_on_squeezenet_fire_modules() -> None:
    # Three fire modules on the simulated CPU + NPU: the paper's summed-cost DP keeps each squeeze
    # on the CPU beside the concat it follows; the makespan refinement moves it to the NPU, where its
    # extra copy back overlaps the 3x3 expand, and lands on the exhaustive optimum.
    graph = opsched.from_torch(get_model("squeezenet1_0").eval(), example_inputs("squeezenet1_0"))
    sub = graph.subgraph([n.name for n in graph.nodes][2:14], name="squeezenet1_0.fires")
    best = schedule(sub, "exhaustive", CPU, platform="cpu+npu")
    pt = schedule(sub, "partitiontuner", CPU, platform="cpu+npu")
    paper = schedule(sub, "partitiontuner", CPU, platform="cpu+npu", refine=0)
    assert pt.estimated_ms == pytest.approx(best.estimated_ms)
    assert paper.estimated_ms > best.estimated_ms * 1.03
    assert pt.stats["unrefined_ms"] == pytest.approx(paper.estimated_ms) and pt.stats["moved"] == 3
    assert {v for lane in pt.lanes if lane.device == "npu" for v in lane.nodes} >= {
        "features_3_squeeze_0", "features_4_squeeze_0", "features_5_squeeze_0"}
    assert schedule(sub, "profiled", CPU, platform="cpu+npu").estimated_ms > pt.estimated_ms
    with pytest.raises(ScheduleError, match="refine of scheduler 'partitiontuner' must be 0 or more"):
        schedule(sub, "partitiontuner", CPU, platform="cpu+npu", refine=-1)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_partitiontuner_refinement_never_lengthens_the_makespan(seed: int) -> None:
    pc = PlatformCost(_random_platform(random.Random(seed)))
    graph = _fuzz_graph(seed % 30)
    refined = schedule(graph, "partitiontuner", pc)
    paper = schedule(graph, "partitiontuner", pc, refine=0)
    assert refined.stats["unrefined_ms"] == pytest.approx(paper.estimated_ms)
    assert refined.estimated_ms <= paper.estimated_ms + 1e-9
    assert (refined.stats["moved"] > 0) == (refined.estimated_ms < paper.estimated_ms - 1e-9)


@pytest.mark.parametrize("scheduler", ["heft", "peft"])
def test_list_schedulers_replay_no_slower_than_planned(scheduler: str) -> None:
    # the replay copies a value once per unit and fuses what the unit fuses: never slower than the plan
    for seed in range(5):
        graph = random_dag(14, seed)
        s = schedule(graph, scheduler, CPU, platform="cpu+npu")
        assert s.estimated_ms <= s.stats["planned_ms"] + 1e-9


def _random_platform(rng: random.Random) -> Platform:
    pool = ["conv2d", "add", "relu", "activation", "elementwise", "pool", "norm", "gemm", "data"]
    units = [Unit("host", AnalyticCostModel("CPU2").spec, device=None)]
    for k in range(rng.randint(1, 2)):
        units.append(Unit(f"acc{k}", AnalyticCostModel("V100").spec, device=None,
                          supports=frozenset(rng.sample(pool, rng.randint(1, 4))),
                          conv_rule=ConvRule(rng.choice((1, 2, 4)), rng.random() < 0.5),
                          fuses=(("conv", "activation"), ("elementwise", "activation"))))
    return Platform("random", tuple(units), Link(rng.uniform(1, 20), rng.uniform(0, 500)))


@functools.cache
def _fuzz_graph(seed: int) -> opsched.Graph:
    net = FuzzNet(seed, ops=10)
    return opsched.from_torch(net, (torch.randn(net.input_shape),))


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), scheduler=st.sampled_from([*PLACERS]))
def test_no_operator_lands_on_a_unit_that_lacks_it(seed: int, scheduler: str) -> None:
    rng = random.Random(seed)
    graph = _fuzz_graph(seed % 30)
    pc = PlatformCost(_random_platform(rng))
    sched = schedule(graph, scheduler, pc)
    costs = UnitCosts(graph, pc)
    for lane in sched.lanes:
        unit = pc.platform.unit(lane.device)
        for v in lane.nodes:
            assert unit.runs(graph, graph.node(v)), f"{v} ({graph.node(v).op}) on {unit.name}"
    assert simulate_placed(sched, costs).makespan_ms == pytest.approx(sched.estimated_ms)


def test_units_that_exist_are_measured_once_into_the_profile_store(tmp_path) -> None:
    """``cost="measured"`` with a platform: each real unit's operators and fused chains timed on
    its own backend and cores (kept in the store, so a second search times nothing); a unit
    that exists only in the simulator, or a GPU this machine lacks, keeps its analytic preset."""
    from opsched.cost import MeasuredCostModel, ProfileStore
    from opsched.costing import measured_cost, measured_platform
    from opsched.runtime import run_graph

    graph = random_dag(8, 1)
    with ProfileStore(tmp_path) as store:
        pools = measured_platform(measured_cost(store=store), "cpu-pools")
        assert all(isinstance(m, MeasuredCostModel) for m in pools.models.values())
        first = schedule(graph, "partitiontuner", pools)
        # the two pools are one kind (same backend, same cores): what one timed, the other reads
        assert sum(m.counts.timed for m in pools.models.values()) > 0  # type: ignore[attr-defined]
        again = measured_platform(measured_cost(store=store), "cpu-pools")
        assert schedule(graph, "partitiontuner", again).lanes == first.lanes
        assert sum(m.counts.timed for m in again.models.values()) == 0  # type: ignore[attr-defined]
        mixed = measured_platform(measured_cost(store=store), "cpu+cuda")
        assert isinstance(mixed.models["cpu"], MeasuredCostModel)
        gpu = MeasuredCostModel if torch.cuda.is_available() else AnalyticCostModel
        assert isinstance(mixed.models["cuda:0"], gpu)
        board = measured_platform(measured_cost(store=store), "cpu+npu")  # a modelled board: nothing to time
        assert all(isinstance(m, AnalyticCostModel) for m in board.models.values())
    x = [torch.randn(t.type.shape) for t in graph.inputs]
    with torch.no_grad():
        assert_close(ScheduledModule(graph, first)(*x), run_graph(graph, x), "measured placement")


def test_every_real_unit_is_measured_on_a_backend_of_its_own_device() -> None:
    """What ``cost="measured"`` times a unit on: a backend of the unit's device type (the GPU of
    ``cpu+cuda`` on the CUDA backend; the first GPU run found it asking torch's CPU kernels)."""
    from opsched.backends import get_backend
    from opsched.cost.units import platform_names

    for name in platform_names():
        for unit in platform(name).units:
            if unit.device is not None:
                assert get_backend(unit.backend).device_type == torch.device(unit.device).type, (name, unit.name)


def test_a_unit_off_the_host_prices_the_graph_with_its_weights_on_its_device() -> None:
    """A measured unit's model is handed the graph placed on the unit's device (a CUDA
    backend's replays read their weights there), once per unit; the host's unit gets the graph
    itself. A stand-in device, ``meta``, plays the GPU."""
    seen: dict[str, set[str]] = {}

    class Recording:  # a measured model's shape: it prices stages of the graph it is handed
        key = device = "recording"
        monotone = True

        def __init__(self, tag: str) -> None:
            self.tag = tag

        def stage_latency(self, graph: opsched.Graph, stage: object) -> float:
            seen.setdefault(self.tag, set()).update(str(p.device) for p in graph.params.values())
            return 1.0

        def segment_cut(self, graph: opsched.Graph) -> None:
            return None

    host, far = Recording("cpu"), Recording("far")
    plat = Platform("host+far", (Unit("cpu", CPU.spec), Unit("far", CPU.spec, device="meta")), Link(1.0))
    graph = opsched.from_torch(get_model("squeezenet1_1").eval(), example_inputs("squeezenet1_1"))
    costs = UnitCosts(graph, PlatformCost(plat, {"cpu": host, "far": far}))
    priced = [n.name for n in graph.nodes if not math.isinf(costs.exec_ms(n.name, "far"))]
    assert priced and seen == {"cpu": {"cpu"}, "far": {"meta"}}
    assert costs._graph_on(plat.unit("far")) is costs._graph_on(plat.unit("far"))  # placed once
    assert costs._graph_on(plat.unit("cpu")) is graph


def test_optimize_measures_the_units_of_its_platform(tmp_path, monkeypatch) -> None:
    from opsched import costing

    asked = []

    def spy(base, name=None):  # type: ignore[no-untyped-def]
        asked.append(name)
        return measured(base, name)
    measured = costing.measured_platform
    monkeypatch.setattr(costing, "measured_platform", spy)
    model = get_model("squeezenet1_1").eval()
    inputs = example_inputs("squeezenet1_1")
    module = opsched.optimize(model, inputs, scheduler="partitiontuner", platform="cpu-pools", cache_dir=tmp_path)
    assert asked == ["cpu-pools"]
    with torch.no_grad():
        assert_close(module(*inputs), model(*inputs), "optimize on measured units")


def test_placed_schedule_round_trips_and_reruns(tmp_path) -> None:
    model = get_model("squeezenet1_1").eval()
    inputs = example_inputs("squeezenet1_1")
    graph = opsched.from_torch(model, inputs)
    sched = schedule(graph, "partitiontuner", CPU, platform="cpu-pools")
    sched.save(tmp_path / "s.json")
    again = Schedule.load(tmp_path / "s.json")
    assert again == sched
    with torch.no_grad():
        assert_close(ScheduledModule(graph, again)(*inputs), model(*inputs), "reloaded placed schedule")


def test_outputs_made_off_the_host_are_copied_back_to_it() -> None:
    """A model output made on a unit with memory of its own comes back to the default unit by a
    copy on the lane that made it (on ``cpu+cuda`` a GPU lane's output would otherwise come back
    on ``cuda:0``); an output made on the host is returned as made, with no copy."""
    model = torch.nn.Sequential(torch.nn.Conv2d(16, 16, 3, padding=1), torch.nn.Conv2d(16, 16, 1)).eval()
    x = torch.randn(1, 16, 8, 8)
    graph = opsched.from_torch(model, (x,))
    first, second = (n.name for n in graph.nodes)
    on_npu = Schedule(graph.structural_hash(), (Lane((first, second), "npu"),), options={"platform": "cpu+npu"})
    back_on_cpu = Schedule(graph.structural_hash(), (Lane((first,), "npu"), Lane((second,), "cpu")),
                           waits=((second, first),), options={"platform": "cpu+npu"})
    for sched, copies_back in [(on_npu, 1), (back_on_cpu, 0)]:
        module = ScheduledModule(graph, sched)
        labels = [it.label for phase in module.executor.program.phases for lane in phase for it in lane]
        assert labels.count(f"copy {graph.outputs[0]} npu->cpu") == copies_back, labels
        with torch.no_grad():
            out = module(x)
            assert_close(out, model(x), "an output made on the NPU")
            assert out.device == x.device


def test_a_placed_plan_is_a_module_on_its_platforms_host() -> None:
    model = get_model("squeezenet1_1").eval()
    graph = opsched.from_torch(model, example_inputs("squeezenet1_1"))
    sched = schedule(graph, "heft", CPU, platform="cpu-pools")
    with pytest.raises(OpschedError, match=r"default unit 'cpu0' holds the inputs and outputs on cpu; make its module "
                                           r"with device='cpu' \(got 'cuda:0'\)"):
        ScheduledModule(graph, sched, device="cuda:0")


def test_bad_platforms_and_placements_are_named() -> None:
    graph = random_dag(6, 0)
    with pytest.raises(CostModelError, match="no platform 'cpu.gpu'"):
        schedule(graph, "heft", CPU, platform="cpu+gpu")
    with pytest.raises(CostModelError, match="default unit 'x'"):
        Platform("p", (Unit("a", CPU.spec),), Link(1.0), default="x")
    costs = UnitCosts(graph, PlatformCost(platform("cpu-pools")))
    names = [n.name for n in graph.nodes]
    two = Schedule(graph.structural_hash(), (Lane(tuple(names[:3]), "cpu0"), Lane(tuple(names[3:]), "cpu0")))
    with pytest.raises(InvalidScheduleError, match="two lanes on one unit"):
        simulate_placed(two, costs)
    with pytest.raises(CostModelError, match="has no unit 'npu'"):
        simulate_placed(Schedule(graph.structural_hash(), (Lane(tuple(names), "npu"),)), costs)


def test_fused_chain_costs_less_than_its_parts() -> None:
    graph = opsched.from_torch(get_model("resnet18").eval(), example_inputs("resnet18"))
    model = AnalyticCostModel("CPU2")
    add = next(n for n in graph.nodes if n.op == "add")
    relu = next(n for n in graph.nodes if n.op == "relu" and n.inputs == (add.name,))
    parts = model.op_latency(graph, add) + model.op_latency(graph, relu)
    assert 0 < model.fused_latency(graph, [add.name, relu.name]) < parts

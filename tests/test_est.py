"""The est list scheduler: its plan replays exactly, its guarantees hold, its schedules run."""

from __future__ import annotations

import dataclasses
import random

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opsched
from opsched.cost import AnalyticCostModel, OpDemand, RandomCostModel, ResourceModel, resources_for
from opsched.errors import CostModelError, IllegalMergeError, InvalidScheduleError
from opsched.ir import Graph, GraphBuilder, op_schema
from opsched.ir.analysis import critical_path, width
from opsched.models import example_inputs, get_model
from opsched.schedule import Schedule, Stage
from opsched.schedulers import schedule
from opsched.schedulers.est import bottom_levels, choose_merges, est_lanes
from opsched.schedulers.simulate import simulate
from opsched.testing import assert_close, fork_join, random_dag

V100 = AnalyticCostModel("V100")


def random_resources(g: Graph, seed: int, overlap: float) -> ResourceModel:
    rng = random.Random(seed)
    ops = {n.name: OpDemand(rng.choice([0.0, rng.uniform(0.1, 5.0)]) if rng.random() < 0.1 else rng.uniform(0.1, 5.0),
                            rng.choice([1.0, rng.uniform(0.05, 1.0)])) for n in g.nodes}
    return ResourceModel(ops, overlap=overlap)


def fan(k: int, kernels: tuple[int, ...] = (1,)) -> Graph:
    """k convolutions of one input, summed."""
    b = GraphBuilder(f"fan{k}")
    x = b.input("x", (1, 4, 8, 8))
    outs = []
    for i in range(k):
        kk = kernels[i % len(kernels)]
        w = b.param(f"w{i}", torch.randn(4, 4, kk, kk) * 0.2)
        outs.append(b.add("conv2d", [x], name=f"c{i}", params=[w], padding=kk // 2))
    return b.build([b.add("add", outs, name="out")]).verify()


def lane_schedule(g: Graph, plan) -> Schedule:  # type: ignore[no-untyped-def]
    return Schedule(g.structural_hash(), plan.lanes, waits=plan.waits, merges=plan.merges, graph_name=g.name)


def forking(res: ResourceModel, fork_ms: float) -> ResourceModel:
    """``res`` with every operator's fork cost set to ``fork_ms``."""
    return dataclasses.replace(res, ops={k: dataclasses.replace(d, fork_ms=fork_ms) for k, d in res.ops.items()})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 16), seed=st.integers(0, 10_000), lanes=st.sampled_from([1, 2, 3, None]),
       overlap=st.sampled_from([1.0, 0.5, 0.0]), share=st.booleans(), fork=st.sampled_from([0.0, 0.0, 2.0]))
def test_the_schedule_replays_exactly_as_planned_and_keeps_the_guarantees(n: int, seed: int, lanes: int | None,
                                                                         overlap: float, share: bool,
                                                                         fork: float) -> None:
    g = random_dag(n, seed, edge_prob=0.3)
    res = forking(dataclasses.replace(random_resources(g, seed, overlap), oversubscribe=share), fork)
    plan = est_lanes(g, res, lanes)
    sched = lane_schedule(g, plan).validate(g)
    assert lanes is None or len(sched.lanes) <= lanes
    sim = simulate(g, sched, res)
    assert sim.makespan_ms == pytest.approx(plan.makespan_ms, rel=1e-9, abs=1e-9)
    for e in sim.events:  # not just the makespan: every operator starts and ends as planned
        assert e.start_ms == pytest.approx(plan.start_ms[e.label], abs=1e-9)
        assert e.end_ms == pytest.approx(plan.end_ms[e.label], abs=1e-9)
    durations = [res[v.name].duration_ms for v in g.nodes]
    work = sum(durations)                                   # = the sequential schedule
    area = sum(res[v.name].area_ms for v in g.nodes)
    cp, _ = critical_path(g, durations)
    assert plan.makespan_ms <= work + 1e-9                  # never worse than sequential
    assert plan.makespan_ms >= max(cp, area) - 1e-9         # the model's lower bound holds
    if overlap == 1.0 and share and not fork:               # the list-scheduling bound of the rules
        cap = lanes if lanes is not None and lanes < width(g) else None
        bound = cp + area + (work / cap if cap else 0.0)
        assert plan.makespan_ms <= bound + 1e-9


def test_operators_that_each_fill_the_device_run_one_after_another_in_one_lane() -> None:
    # five independent convolutions that each fill the device: est starts the most urgent one
    # and, with the device full, the next only when it comes free, on the lane it left
    g = fan(5)
    ops = {n.name: OpDemand(1.0 + 0.1 * i, 1.0) for i, n in enumerate(g.nodes)}
    plan = est_lanes(g, ResourceModel(ops), max_lanes=None)
    assert plan.makespan_ms == pytest.approx(sum(o.duration_ms for o in ops.values()))
    assert plan.lanes == (("c4", "c3", "c2", "c1", "c0", "out"),) and not plan.waits  # longest first


def test_a_held_back_operator_waits_for_the_one_that_made_room() -> None:
    # c0 (0.6 of the device) and c1 (0.4) fill it at t=0; c2 and c3 (0.2 each) are held back.
    # When c1 ends at t=1 both start: c2 on c1's lane (the lane order carries the hold-back),
    # c3 on a new lane, with a wait on c1; otherwise it would start at 0 in the executors
    g = fan(4)
    ops = {"c0": OpDemand(4.0, 0.6), "c1": OpDemand(1.0, 0.4), "c2": OpDemand(1.0, 0.2), "c3": OpDemand(1.0, 0.2),
           "out": OpDemand(0.1, 1.0)}
    res = ResourceModel(ops)
    plan = est_lanes(g, res, max_lanes=None)
    assert plan.waits == (("c3", "c1"),)
    assert plan.lanes == (("c0", "out"), ("c1", "c2"), ("c3",))
    assert plan.start_ms["c3"] == pytest.approx(1.0)
    sched = lane_schedule(g, plan)
    assert simulate(g, sched, res).makespan_ms == pytest.approx(plan.makespan_ms)
    unwaited = Schedule(sched.graph_hash, sched.lanes)
    early = {e.label: e.start_ms for e in simulate(g, unwaited, res).events}
    assert early["c3"] == 0.0  # without the wait it would not have been held back


def test_nothing_starts_beside_others_for_less_than_the_cut_it_costs() -> None:
    g = fan(4)  # four convolutions that fit on the device together, then their sum
    ops = {**{f"c{i}": OpDemand(1.0 + 0.1 * i, 0.2) for i in range(4)}, "out": OpDemand(0.1, 1.0)}
    together = est_lanes(g, ResourceModel(ops), max_lanes=None)
    assert together.makespan_ms == pytest.approx(1.3 + 0.1) and len(together.lanes) == 4
    apart = est_lanes(g, forking(ResourceModel(ops), 1.5), max_lanes=None)  # each shorter than a fork
    assert apart.makespan_ms == pytest.approx(sum(o.duration_ms for o in ops.values()))
    assert len(apart.lanes) == 1
    # only c2 (1.2 ms) and c3 (1.3 ms) outlast a 1.15 ms fork: they run together, c1 and c0 alone
    some = est_lanes(g, forking(ResourceModel(ops), 1.15), max_lanes=None)
    starts = {v: round(some.start_ms[v], 9) for v in ("c0", "c1", "c2", "c3")}
    assert starts == {"c3": 0.0, "c2": 0.0, "c1": 1.3, "c0": 2.4}


def test_priority_is_the_longest_chain_to_the_end() -> None:
    g = random_dag(8, 1, edge_prob=0.4)
    durations = [1.0 + i for i in range(len(g.nodes))]
    level = bottom_levels(g.succs, durations)
    for i in range(len(g.nodes)):
        assert level[i] == pytest.approx(durations[i] + max((level[s] for s in g.succs[i]), default=0.0))
    assert max(level) == pytest.approx(critical_path(g, durations)[0])


def test_est_on_the_zoo_beats_sequential_and_replays() -> None:
    g = opsched.from_torch(get_model("inception_v3"), example_inputs("inception_v3"))
    sched = schedule(g, "est", V100)
    seq = schedule(g, "sequential", V100)
    res = V100.resources(g, sched.merges)
    assert simulate(g, sched, res).makespan_ms == pytest.approx(sched.estimated_ms, rel=1e-9)
    assert sched.estimated_ms < 0.8 * simulate(g, seq, V100.resources(g)).makespan_ms
    assert sched.stats["merges"] > 0 and len(sched.lanes) <= 8


def test_merges_are_siblings_that_cost_less_merged() -> None:
    g = opsched.from_torch(get_model("googlenet"), example_inputs("googlenet"))
    from opsched.cost.coster import StageCoster

    coster = StageCoster(g, V100)
    merges = choose_merges(g, coster)
    assert merges
    for m in merges:
        assert len({g.node(v).inputs[0] for v in m}) == 1
        assert coster.latency(Stage(tuple((v,) for v in m), "merge")) < coster.latency(Stage(tuple((v,) for v in m)))


@pytest.mark.parametrize("model", ["googlenet", "randwire_small", "nasnet_mobile"])
@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_est_schedules_with_waits_and_merges_execute_equal_to_eager(model: str, backend: str) -> None:
    m, inputs = get_model(model), example_inputs(model)
    module = opsched.optimize(m, inputs, cost=V100, scheduler="est", backend=backend, verify=False)
    sched = module.schedule
    assert sched.stages is None and len(sched.lanes) >= 2
    with torch.no_grad():
        assert_close(module(*inputs), m(*inputs), f"{model} / est / {backend}")


def test_lane_schedule_json_round_trip_with_waits_and_merges(tmp_path) -> None:  # type: ignore[no-untyped-def]
    g = opsched.from_torch(get_model("googlenet"), example_inputs("googlenet"))
    sched = schedule(g, "est", V100, max_lanes=3)
    assert sched.merges
    sched.save(tmp_path / "s.json")
    back = Schedule.load(tmp_path / "s.json").validate(g)
    assert back.lanes == sched.lanes and back.waits == sched.waits and back.merges == sched.merges
    assert "merge(" in str(back)


def test_bad_waits_and_merges_are_named() -> None:
    g = fan(4)
    a, b, c, d = "c0", "c1", "c2", "c3"
    h = g.structural_hash()
    with pytest.raises(InvalidScheduleError, match="not a node"):
        Schedule(h, ((a, b), (c, d, "out")), waits=((a, "nope"),)).validate(g)
    with pytest.raises(InvalidScheduleError, match="deadlock"):
        Schedule(h, ((a, b), (c, d, "out")), waits=((a, d), (c, b))).validate(g)  # a < b < c < d < a
    with pytest.raises(IllegalMergeError, match="next to each other"):
        Schedule(h, ((a, b, c), (d, "out")), merges=((a, c),)).validate(g)
    with pytest.raises(IllegalMergeError, match="two or more"):
        Schedule(h, ((a, b, c, d, "out"),), merges=((a,),)).validate(g)


def test_resource_model_checks_its_figures() -> None:
    with pytest.raises(CostModelError, match="demand"):
        OpDemand(1.0, 1.5)
    with pytest.raises(CostModelError, match="overlap"):
        ResourceModel({}, overlap=2.0)
    with pytest.raises(CostModelError, match="no operator 'x'"):
        ResourceModel({})["x"]


def test_rate_combines_capacity_and_contention() -> None:
    res = ResourceModel({}, overlap=0.5)
    assert res.rate(0.3, 1) == 1.0
    assert res.rate(0.3, 2) == pytest.approx(2 / 3) and res.rate(1.5, 2) == pytest.approx(2 / 3)
    assert res.rate(2.5, 3) == pytest.approx(1 / 2.5)


@pytest.mark.parametrize("device,preset", [("V100", "V100"),
                                           ("NVIDIA H100 80GB HBM3 sm_90 81559 MiB x132 SMs", "H100")])
def test_measured_style_cost_models_lend_durations_and_borrow_demands(device: str, preset: str) -> None:
    """Durations come from the cost model, demands from the preset its device is or names (a GPU
    measured model's device is the card's own name)."""
    g = random_dag(6, 2)

    class Doubled:  # any cost model: twice the analytic price of every stage
        monotone = True
        key = "doubled"

        def __init__(self) -> None:
            self.device = device

        def stage_latency(self, graph, stage):  # type: ignore[no-untyped-def]
            return 2 * V100.stage_latency(graph, stage)

        def segment_cut(self, graph):  # type: ignore[no-untyped-def]
            return None

    res = resources_for(g, Doubled())
    ref, shape = V100.resources(g), AnalyticCostModel(preset).resources(g)
    assert any(shape[n.name].demand != AnalyticCostModel("CPU2").resources(g)[n.name].demand for n in g.nodes)
    for n in g.nodes:
        assert res[n.name].duration_ms == pytest.approx(2 * ref[n.name].duration_ms)
        assert res[n.name].demand == pytest.approx(shape[n.name].demand)
        assert res[n.name].fork_ms == 0.0  # its segments cost nothing to cut


def test_a_fork_costs_the_cut_and_the_conversions_of_what_the_operator_reads_and_writes() -> None:
    g = fork_join("x")  # x -> a -> b; x -> c; d = b + c
    cost = RandomCostModel(3, cuts=True)
    cut = cost.segment_cut(g)
    assert cut is not None
    res = resources_for(g, cost, demands="CPU2", merges=[("a", "c")])
    assert res["b"].fork_ms == pytest.approx(cut.resume_ms + cut.leave_ms["a"] + cut.enter_ms["b"])
    assert res["d"].fork_ms == pytest.approx(cut.resume_ms + cut.leave_ms["b"] + cut.leave_ms["c"] + cut.enter_ms["d"])
    # a merge reads its shared input once and writes each member's output
    assert res["a+c"].fork_ms == pytest.approx(cut.resume_ms + cut.leave_ms["x"] + cut.enter_ms["a"]
                                               + cut.enter_ms["c"])


def test_without_oversubscription_only_what_fits_runs_at_once() -> None:
    g = fan(4)
    ops = {"c0": OpDemand(4.0, 0.6), "c1": OpDemand(1.0, 0.3), "c2": OpDemand(1.0, 0.2), "c3": OpDemand(1.0, 0.2),
           "out": OpDemand(0.1, 1.0)}
    plan = est_lanes(g, ResourceModel(ops, oversubscribe=False))
    running = [(plan.start_ms[v], plan.end_ms[v], ops[v].demand) for v in ops]
    for t, _, _ in running:  # at every start, the demands of what runs sum to at most 1
        assert sum(d for s, e, d in running if s <= t < e) <= 1.0 + 1e-9
    shared = est_lanes(g, ResourceModel(ops))
    # c0 and c1 load the device to 0.9: sharing admits c2 beside them (1.1), fitting does not
    assert shared.start_ms["c2"] == 0.0 and plan.start_ms["c2"] == pytest.approx(1.0)


@pytest.mark.parametrize("device", ["V100", "CPU2"])
def test_views_follow_their_producer_on_its_lane(device: str) -> None:
    g = opsched.from_torch(get_model("nasnet_mobile"), example_inputs("nasnet_mobile"))
    sched = schedule(g, "est", AnalyticCostModel(device), max_lanes=2)
    lane_of = {v: li for li, lane in enumerate(sched.lanes) for v in lane}
    views = [n for n in g.nodes if op_schema(n.op).is_view and any(u in g.index for u in n.inputs)]
    assert views  # NASNet slices its cells' outputs
    for n in views:
        assert any(lane_of.get(u) == lane_of[n.name] for u in n.inputs), f"{n.name} left its producer's lane"

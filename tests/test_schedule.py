"""Schedulers: the DP against brute force, validation, JSON, merges, partitioning."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from opsched import from_torch
from opsched._toposort import ancestor_masks
from opsched.cost import AnalyticCostModel, RandomCostModel, SegmentCut
from opsched.cost import estimate_stages as estimate
from opsched.cost.coster import StageCoster
from opsched.cost.cuts import cut_latency
from opsched.errors import (
    CycleError,
    IllegalMergeError,
    InvalidScheduleError,
    ScheduleError,
    ScheduleMismatchError,
)
from opsched.ir import Graph, GraphBuilder
from opsched.ir.analysis import live_values
from opsched.ir.ops.conv import check_merge, merge_class, merged_conv, merged_parameters
from opsched.models import example_inputs, get_model
from opsched.runtime import lower
from opsched.schedule import Schedule, Stage
from opsched.schedulers import schedule
from opsched.schedulers.endings import parallel_endings, predecessor_masks
from opsched.schedulers.ios import ios_stages
from opsched.schedulers.ios_memory import PartMemory, chain_bytes
from opsched.schedulers.ios_part import PartSolver, SearchStats, summarize
from opsched.schedulers.partition import ascending_down_sets, cut_units, down_sets, partition, split_to_fit, state_count
from opsched.schedulers.units import UnitGraph
from opsched.testing import fork_join, random_dag

V100 = AnalyticCostModel("V100")
CPU2 = AnalyticCostModel("CPU2")  # charges the cut of ONNX Runtime's one-lane segments


# --- brute force over all stage schedules -------------------------------------------------
def components(units: frozenset[int], ug: UnitGraph) -> list[frozenset[int]]:
    left, comps = set(units), []
    while left:
        todo, comp = [left.pop()], set()
        while todo:
            u = todo.pop()
            comp.add(u)
            for v in (*ug.preds[u], *ug.succs[u]):
                if v in left:
                    left.discard(v)
                    todo.append(v)
        comps.append(frozenset(comp))
    return comps


def ordered_partitions(items: list[int]):  # type: ignore[no-untyped-def]
    """Every sequence of disjoint non-empty blocks covering ``items``."""
    if not items:
        yield []
        return
    for k in range(1, len(items) + 1):
        for first in itertools.combinations(items, k):
            rest = [i for i in items if i not in first]
            for tail in ordered_partitions(rest):
                yield [frozenset(first), *tail]


def stage_peak(graph: Graph, ug: UnitGraph, done: set[str], block: frozenset[int], lanes: bool) -> int:
    """The peak of live bytes :mod:`opsched.schedulers.ios_memory` bounds a stage by, computed
    from node sets: each graph input or value made (in ``done``) that a node not yet run reads
    (an input nothing reads: always), and what the graph outputs; then everything the stage
    writes (``lanes``: its groups at once, or a merge), or, for one group run unit by unit, its
    first node beside what is live before it, then the rest of its chain (two consecutive values
    at a time) beside what is live once it has run, its own value counted once."""
    size = {n.name: n.out.nbytes for n in graph.nodes}
    readers: dict[str, set[str]] = {}
    for n in graph.nodes:
        for x in n.inputs:
            readers.setdefault(x, set()).add(n.name)
    def live(done: set[str]) -> int:
        inputs = sum(i.type.nbytes for i in graph.inputs if readers.get(i.name, set()) - done or i.name not in readers)
        return inputs + sum(size[v] for v in done if v in graph.outputs or readers.get(v, set()) - done)
    if lanes:
        return live(done) + sum(size[v] for u in block for v in ug.units[u])
    peak, ran = 0, set(done)
    for u in sorted(block):
        chain = chain_bytes(graph, ug.units[u])  # a constant it absorbed counts with its reader
        peak = max(peak, live(ran) + chain[0])
        ran |= set(ug.units[u])
        if len(chain) > 1:
            last = ug.units[u][-1]
            stays = last in graph.outputs or readers.get(last, set()) - ran
            peak = max(peak, live(ran) - (size[last] if stays else 0) + max(a + b for a, b in zip(chain, chain[1:])))
    return peak


def brute_force(graph: Graph, coster: StageCoster, r: int, s: int, merge: bool,
                memory_budget: float = float("inf")) -> float:
    """Independent of the DP: all ordered partitions into stages, each checked from scratch.

    The same pruning as the DP: P(r, s), and no stage spans two parts of the partition (a
    stage that straddles a cut vertex is outside the search space by design, as in IOS). A stage
    of several groups also pays its segment cuts where the cost model charges them. With a
    ``memory_budget``, a stage whose :func:`stage_peak` exceeds it is not a choice.
    """
    ug = UnitGraph.build(graph)
    part_of = {u: k for k, p in enumerate(partition(ug)) for u in p}
    order = {u: i for i, u in enumerate(range(len(ug)))}
    best = float("inf")
    for blocks in ordered_partitions(list(range(len(ug)))):
        where = {u: k for k, b in enumerate(blocks) for u in b}
        if any(where[p] > where[u] for u in range(len(ug)) for p in ug.preds[u]):
            continue  # a producer runs after its consumer
        if any(len({part_of[u] for u in b}) > 1 for b in blocks):
            continue
        total = 0.0
        done: list[str] = []
        for block in blocks:
            comps = components(block, ug)
            options = []
            fits = stage_peak(graph, ug, set(done), block, len(comps) > 1) <= memory_budget
            if len(comps) <= s and all(len(c) <= r for c in comps) and fits:
                groups = tuple(tuple(v for u in sorted(c, key=order.get) for v in ug.units[u]) for c in comps)
                cuts = cut_latency(graph, [Stage(groups)], coster.segment_cut, done)
                options.append(coster.latency(Stage(groups)) + cuts)
            names = [ug.units[u] for u in block]
            merge_fits = stage_peak(graph, ug, set(done), block, True) <= memory_budget
            if merge and merge_fits and len(block) > 1 and len(comps) == len(block) and all(len(n) == 1 for n in names):
                try:
                    check_merge(graph, [n[0] for n in names])
                    options.append(coster.latency(Stage(tuple(names), "merge")))
                except IllegalMergeError:
                    pass
            if not options:
                break
            total += min(options)
            done += [v for u in block for v in ug.units[u]]
        else:
            best = min(best, total)
    return best


def mergeable_dag(n: int, seed: int) -> Graph:
    """Random DAG of convolutions in which siblings often read one tensor (merge candidates)."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    b = GraphBuilder(f"merge{seed}")
    values = [b.input("x", (1, 4, 8, 8))]
    for i in range(n):
        src = rng.choice(values[-3:])
        k = rng.choice((1, 3))
        w = b.param(f"w{i}", torch.randn(4, 4, k, k, generator=gen))
        values.append(b.add("conv2d", [src], name=f"c{i}", params=[w], padding=k // 2, act="relu"))
    used = {v for node in b.nodes for v in node.inputs}
    sinks = [v for v in values[1:] if v not in used]
    out = sinks[0] if len(sinks) == 1 else b.add("concat", sinks, axis=1)
    return b.build([out]).verify()


def constant_dag(n: int, seed: int) -> Graph:
    """Random DAG of 1x1 convolutions, most scaled by a constant of activation size, the constants
    made before everything else (as an ONNX file may list them): a constant read once is absorbed
    into its reader's unit (:mod:`opsched.schedulers.units`); the shared one, read by several,
    stays a unit."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    wiring = [(rng.randrange(3), rng.choice(("own", "own", "shared", "none"))) for _ in range(n)]
    b = GraphBuilder(f"const{seed}")
    x = b.input("x", (1, 4, 8, 8))

    def scale(name: str) -> str:
        return b.add("constant", [], name=name, params=[b.param(name, torch.rand(1, 4, 8, 8, generator=gen))])
    scales = {i: scale(f"k{i}") for i, (_, kind) in enumerate(wiring) if kind == "own"}
    shared = scale("shared") if sum(kind == "shared" for _, kind in wiring) > 1 else None
    values = [x]
    for i, (back, kind) in enumerate(wiring):
        w = b.param(f"w{i}", torch.randn(4, 4, 1, 1, generator=gen))
        v = b.add("conv2d", [values[max(0, len(values) - 1 - back)]], name=f"c{i}", params=[w])
        if i in scales or (kind == "shared" and shared is not None):
            v = b.add("mul", [v, scales.get(i, shared)], name=f"m{i}")
        values.append(v)
    used = {u for node in b.nodes for u in node.inputs}
    sinks = [v for v in values[1:] if v not in used]
    out = sinks[0] if len(sinks) == 1 else b.add("add", sinks, name="out")
    return b.build([out]).verify()


def some_dag(n: int, seed: int) -> Graph:
    """One of the brute-force tests' generators, by seed (the constants' at most three
    convolutions: up to seven units, which the brute force enumerates in seconds)."""
    if seed % 3 == 2:
        graph = constant_dag(min(n, 3), seed)
        assume(len(UnitGraph.build(graph)) <= 7)  # a rare eighth unit would take the brute force minutes
        return graph
    return (random_dag, mergeable_dag)[seed % 3](n, seed)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 6), seed=st.integers(0, 10_000), r=st.integers(1, 3), s=st.integers(1, 3),
       model=st.sampled_from(["analytic", "analytic with cuts", "random", "random with cuts"]))
def test_dp_equals_brute_force(n: int, seed: int, r: int, s: int, model: str) -> None:
    graph = some_dag(n, seed)
    analytic = {"analytic": V100, "analytic with cuts": CPU2}
    cost = analytic.get(model) or RandomCostModel(seed, cuts=model == "random with cuts")
    coster = StageCoster(graph, cost)
    stages, _ = ios_stages(graph, cost, max_group_size=r, max_lanes=s, coster=coster)
    dp = estimate(graph, stages, coster)
    assert dp == pytest.approx(brute_force(graph, coster, r, s, merge=True), rel=1e-9)


@pytest.mark.parametrize("seed", range(12))
def test_the_memory_bound_holds_the_plan_whose_units_absorbed_constants(seed: int) -> None:
    """:mod:`opsched.schedulers.ios_memory` bounds each stage's peak as the plan will count it. A
    unit that absorbed constants runs each right before its reader, and the bound counts it with
    that reader: a sequential plan of such units never peaks above the largest bound. (With the
    constants sorted to the front of their unit, and counted as chain links, 240 of 300 such
    plans peaked above it.)"""
    for n in range(2, 7):
        graph = constant_dag(n, seed)
        ug = UnitGraph.build(graph)
        plan = lower(graph, Schedule.from_stages(graph.structural_hash(), [Stage((unit,)) for unit in ug.units]))
        bound = 0
        for part in partition(ug):
            memory = PartMemory.build(ug, part, budget=1 << 60)
            for i in range(len(part)):
                bound = max(bound, memory.stage_peak((1 << i) - 1, [1 << i], lanes=False))
        assert plan.peak_bytes([graph.types[v].nbytes for v in plan.slot_names]) <= bound


def widest_stage(graph: Graph, stages: list[Stage]) -> int:
    """The largest :func:`stage_peak` of a schedule's stages."""
    ug = UnitGraph.build(graph)
    done: set[str] = set()
    peak = 0
    for stage in stages:
        block = frozenset(ug.unit_of[v] for v in stage.nodes)
        peak = max(peak, stage_peak(graph, ug, done, block, stage.is_merge or len(stage.groups) > 1))
        done |= set(stage.nodes)
    return peak


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(2, 6), seed=st.integers(0, 10_000), r=st.integers(1, 3), s=st.integers(1, 3),
       below=st.floats(0.0, 0.05))
def test_dp_within_a_memory_budget_equals_brute_force(n: int, seed: int, r: int, s: int, below: float) -> None:
    """Optimal among the schedules whose every stage keeps within the budget (here just below
    the widest stage of the unconstrained optimum, so that it binds); where a part has none, the
    brute force finds none either and that part runs one unit at a time."""
    graph = some_dag(n, seed)
    coster = StageCoster(graph, V100)
    free, _ = ios_stages(graph, V100, max_group_size=r, max_lanes=s, coster=coster)
    budget = int(widest_stage(graph, free) * (1 - below)) - 1
    stages, stats = ios_stages(graph, V100, max_group_size=r, max_lanes=s, coster=coster, memory_budget=budget)
    best = brute_force(graph, coster, r, s, merge=True, memory_budget=budget)
    if best == float("inf"):
        assert stats.parts_over_memory > 0
    else:
        assert stats.parts_over_memory == 0 and widest_stage(graph, stages) <= budget
        assert estimate(graph, stages, coster) == pytest.approx(best, rel=1e-9)
        plan = lower(graph, Schedule.from_stages(graph.structural_hash(), stages))
        assert plan.peak_bytes([graph.types[v].nbytes for v in plan.slot_names]) <= budget  # as the plan counts


def test_cut_costs_by_hand() -> None:
    graph = fork_join("x")  # x -> a -> b; x -> c; d = b + c
    cut = SegmentCut(0.5, {"x": 1.0, "a": 2.0, "b": 4.0, "c": 8.0}, {"x": 10.0, "a": 20.0, "b": 40.0, "c": 80.0})
    assert live_values(graph, {"a"}) == ["x", "a"]  # x: c still to read it; a: b
    assert live_values(graph, {"a", "b", "c"}) == ["b", "c"]
    stages = [Stage((("a",),)), Stage((("b",), ("c",))), Stage((("d",),))]
    # the segment ends where x and a are live, and the next starts where b and c are
    assert cut_latency(graph, stages, cut) == 0.5 + (1.0 + 2.0) + (40.0 + 80.0)
    assert cut_latency(graph, [Stage((v,),) for v in ("a", "b", "c", "d")], cut) == 0.0  # one segment
    assert cut_latency(graph, stages, None) == 0.0  # a backend that charges nothing


@given(seed=st.integers(0, 10_000), n=st.integers(2, 14))
@settings(max_examples=60, deadline=None)
def test_cut_costs_are_the_live_values_at_each_cut(seed: int, n: int) -> None:
    """cut_latency keeps the live values as nodes run; at every cut it charges what
    :func:`live_values` finds afresh there: random stage sequences (chunks of a topological
    order after a prefix done, some split in two groups), costs on some values only."""
    graph, rng = random_dag(n, seed), random.Random(seed)
    values = [*(i.name for i in graph.inputs), *(nd.name for nd in graph.nodes)]
    priced = rng.sample(values, rng.randint(0, len(values)))
    cut = SegmentCut(0.25, {v: rng.random() for v in priced}, {v: rng.random() for v in priced[::2]})
    names = [nd.name for nd in graph.nodes]
    start = rng.randint(0, len(names) - 1)
    done, stages, k = names[:start], [], start
    while k < len(names):
        chunk = names[k:k + rng.randint(1, 4)]
        k += len(chunk)
        split = rng.randint(1, len(chunk) - 1) if len(chunk) > 1 and rng.random() < 0.6 else len(chunk)
        stages.append(Stage(tuple(g for g in (tuple(chunk[:split]), tuple(chunk[split:])) if g)))
    want, finished = 0.0, set(done)
    for stage in stages:
        if len(stage.groups) > 1:
            want += cut.resume_ms + sum(cut.leave_ms.get(v, 0.0) for v in live_values(graph, finished))
            finished.update(stage.nodes)
            want += sum(cut.enter_ms.get(v, 0.0) for v in live_values(graph, finished))
        else:
            finished.update(stage.nodes)
    assert cut_latency(graph, stages, cut, done) == pytest.approx(want, rel=1e-12, abs=1e-12)


def test_cpu_presets_charge_the_cut_of_their_segments_gpu_presets_do_not() -> None:
    graph = fork_join("x")
    stages = [Stage((("a",),)), Stage((("b",), ("c",))), Stage((("d",),))]
    assert CPU2.segment_cut(graph) == SegmentCut(0.8) and V100.segment_cut(graph) is None
    assert estimate(graph, stages, CPU2) == pytest.approx(sum(CPU2.stage_latency(graph, s) for s in stages) + 0.8)
    assert all(d.fork_ms == 0.8 for d in CPU2.resources(graph).ops.values() if d.duration_ms > 0)
    assert all(d.fork_ms == 0.0 for d in V100.resources(graph).ops.values())


@settings(max_examples=25, deadline=None)
@given(n=st.integers(3, 12), seed=st.integers(0, 10_000))
def test_dp_is_never_worse_than_greedy_or_sequential(n: int, seed: int) -> None:
    graph = random_dag(n, seed, edge_prob=0.25)
    ios = schedule(graph, "ios", V100, max_lanes=4)
    assert ios.estimated_ms <= schedule(graph, "sequential", V100).estimated_ms + 1e-12
    assert ios.estimated_ms <= schedule(graph, "greedy", V100, max_lanes=4).estimated_ms + 1e-12


@pytest.mark.parametrize(("seed", "r", "s"), [(seed, 2, 2) for seed in range(12)] + [(seed, 3, 3) for seed in range(6)]
                         + [(seed, 9, 1) for seed in range(3)])
def test_endings_are_exactly_the_successor_closed_sets_within_pruning(seed: int, r: int, s: int) -> None:
    graph = random_dag(9, seed, edge_prob=0.3)
    ug = UnitGraph.build(graph, contract=False)
    n = len(ug)
    succ = [sum(1 << v for v in ug.succs[u]) for u in range(n)]
    rng = random.Random(seed)
    state = (1 << n) - 1
    for u in range(n - 1, -1, -1):  # a random down-set: drop some sinks
        if rng.random() < 0.3 and not succ[u] & state:
            state &= ~(1 << u)
    found = [(m, tuple(sorted(c))) for m, c in parallel_endings(state, succ, predecessor_masks(succ), r, s)]
    want = set()
    members = [u for u in range(n) if state >> u & 1]
    for k in range(1, len(members) + 1):
        for sub in itertools.combinations(members, k):
            mask = sum(1 << u for u in sub)
            if any(succ[u] & state & ~mask for u in sub):
                continue
            comps = components(frozenset(sub), ug)
            if len(comps) <= s and all(len(c) <= r for c in comps):
                want.add((mask, tuple(sorted(sum(1 << u for u in c) for c in comps))))
    assert len(found) == len(set(found)) and set(found) == want  # each ending once, and no other


# --- the schedulers on real models --------------------------------------------------------
@pytest.fixture(scope="module")
def inception() -> Graph:
    return from_torch(get_model("inception_v3"), example_inputs("inception_v3"))


@pytest.mark.parametrize("name", ["sequential", "greedy", "ios", "est", "nimble", "opara"])
def test_every_scheduler_validates_on_inception(inception: Graph, name: str) -> None:
    sched = schedule(inception, name, V100)
    assert sched.validate(inception) is sched
    assert sorted(sched.nodes) == sorted(n.name for n in inception.nodes)


def test_ios_beats_greedy_beats_sequential_on_inception(inception: Graph) -> None:
    seq, greedy = schedule(inception, "sequential", V100), schedule(inception, "greedy", V100)
    both = schedule(inception, "ios", V100)
    par = schedule(inception, "ios", V100, strategies=("parallel",))
    merge = schedule(inception, "ios", V100, strategies=("merge",))
    assert both.estimated_ms < greedy.estimated_ms < seq.estimated_ms
    assert both.estimated_ms <= min(par.estimated_ms, merge.estimated_ms) + 1e-12
    assert any(s.strategy == "merge" for s in both.stages)
    assert both.stats["states"] > 0 and both.stats["distinct_stages"] <= both.stats["stage_requests"]


def test_json_round_trip_and_refusal_for_another_graph(inception: Graph, tmp_path) -> None:  # type: ignore[no-untyped-def]
    sched = schedule(inception, "ios", V100)
    path = tmp_path / "s.json"
    sched.save(path)
    loaded = Schedule.load(path)
    assert loaded == sched
    assert json.loads(path.read_text())["format"] == "opsched.schedule"
    assert "Sequential(" in str(loaded) and "Parallel(" in str(loaded)
    other = from_torch(get_model("squeezenet1_1"), example_inputs("squeezenet1_1"))
    with pytest.raises(ScheduleMismatchError, match="made for graph InceptionV3"):
        loaded.validate(other)
    assert list(loaded.inputs.values()) == ["f32[1,3,299,299]"]
    older = {k: v for k, v in sched.to_dict().items() if k != "inputs"}  # written before schedules kept inputs
    with pytest.raises(ScheduleMismatchError, match=r"\(structural hash [0-9a-f]{12}\), not for 'SqueezeNet' "
                                                    r"\([0-9a-f]{12}, inputs x f32\[1,3,224,224\]\)"):
        Schedule.from_dict(older).validate(other)


def test_bad_schedule_files(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(InvalidScheduleError, match="cannot read a schedule from"):
        Schedule.load(tmp_path / "none.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InvalidScheduleError, match="not JSON"):
        Schedule.load(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text('{"hello": 1}')
    with pytest.raises(InvalidScheduleError, match="not an opsched schedule"):
        Schedule.load(tmp_path / "other.json")
    (tmp_path / "future.json").write_text('{"format": "opsched.schedule", "version": 99}')
    with pytest.raises(InvalidScheduleError, match="version 99"):
        Schedule.load(tmp_path / "future.json")
    (tmp_path / "cores.json").write_text('{"format": "opsched.schedule", "version": 2, "graph_hash": "h", '
                                         '"lanes": [["a"]], "cores": 0}')
    with pytest.raises(InvalidScheduleError, match=r"cores.json: malformed schedule: .*a positive number of CPU "
                                                   r"cores or None \(all of them\), got 0"):
        Schedule.load(tmp_path / "cores.json")


def diamond() -> Graph:
    b = GraphBuilder("diamond")
    x = b.input("x", (1, 4, 8, 8))
    w = b.param("w", torch.randn(4, 4, 1, 1))
    a = b.add("relu", [x], name="a")
    left = b.add("conv2d", [a], name="l", params=[w])
    right = b.add("conv2d", [a], name="r", params=[w])
    return b.build([b.add("add", [left, right], name="d")])


def staged(h: str, *stages: Stage) -> Schedule:
    return Schedule.from_stages(h, stages)


def test_validate_names_each_offence() -> None:
    g = diamond()
    h = g.structural_hash()
    ok = staged(h, Stage((("a",),)), Stage((("l",), ("r",))), Stage((("d",),)))
    assert ok.validate(g) is ok
    assert ok.lanes[0].nodes == ("a", "l", "d") and ok.lanes[1].nodes == ("r",)
    assert ok.barriers == ((1, 0), (2, 1), (3, 1))
    cases = [
        (staged(h, Stage((("a",),)), Stage((("l",), ("r",)))), "never scheduled"),
        (staged(h, Stage((("a", "l"),)), Stage((("l",), ("r",))), Stage((("d",),))), "scheduled twice"),
        (staged(h, Stage((("l", "a"),)), Stage((("r",),)), Stage((("d",),))), "runs before 'a'"),
        (staged(h, Stage((("d",),)), Stage((("a",),)), Stage((("l",), ("r",)))), "reads 'l', which is scheduled "
                                                                               "later"),
        (staged(h, Stage((("ghost",),))), "not a node"),
        (Schedule(h, (("a", "d", "l"), ("r",))), "'d' runs before 'l', which it reads"),
        (Schedule(h, (("a", "l", "d"), ("r",)), waits=(("r", "d"),)), "deadlock"),
        (Schedule(h, (("a", "l", "d"), ("r",)), waits=(("a", "ghost"),)), "a wait names 'ghost'"),
        (Schedule(h, (("a", "l", "d"), ("r",)), barriers=((1,),)), "barrier 0 gives 1 lane position"),
        (Schedule(h, (("a", "l", "d"), ("r",)), barriers=((2, 1), (1, 1))), "barriers go forward"),
        (Schedule(h, (("a", "l", "d"), ("r",)), barriers=((4, 0),)), "expected 0 to 3"),
    ]
    for sched, message in cases:
        with pytest.raises(InvalidScheduleError, match=message):
            sched.validate(g)
    Schedule(h, (("a", "l", "d"), ("r",))).validate(g)
    # a read across lanes inside a part between barriers is an event wait, not an error
    Schedule(h, (("a", "l", "d"), ("r",)), barriers=((1, 0),)).validate(g)


def test_stages_round_trip_through_lanes_and_barriers() -> None:
    g = diamond()
    h = g.structural_hash()
    stages = (Stage((("a",),)), Stage((("l",), ("r",)), "merge"), Stage((("d",),)))
    sched = staged(h, *stages).validate(g)
    assert sched.stages == stages and sched.merges == (("l", "r"),)
    assert str(sched).splitlines()[1:] == ["Sequential(", "  [a],", "  Merge(l, r),", "  [d]", ")"]
    lanes = Schedule(h, (("a", "l", "d"), ("r",)))
    assert lanes.stages is None and "Lane 1: [r]" in str(lanes)


def test_version_1_files_still_load(tmp_path) -> None:  # type: ignore[no-untyped-def]
    g = diamond()
    h = g.structural_hash()
    v1 = {"format": "opsched.schedule", "version": 1, "graph": "diamond", "graph_hash": h, "batch": 1,
          "device": "V100", "scheduler": "ios", "options": {}, "estimated_ms": 1.0, "stats": {},
          "stages": [{"strategy": "parallel", "groups": [["a"]]}, {"strategy": "merge", "groups": [["l"], ["r"]]},
                     {"strategy": "parallel", "groups": [["d"]]}], "lanes": None, "waits": [], "merges": []}
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    loaded = Schedule.load(tmp_path / "v1.json").validate(g)
    assert [s.strategy for s in loaded.stages or ()] == ["parallel", "merge", "parallel"]
    v1_lanes = dict(v1, stages=[], lanes=[["a", "l", "d"], ["r"]], waits=[["d", "r"]])
    (tmp_path / "v1l.json").write_text(json.dumps(v1_lanes))
    lanes = Schedule.load(tmp_path / "v1l.json").validate(g)
    assert lanes.waits == (("d", "r"),) and lanes.barriers == ()
    lanes.save(tmp_path / "v2.json")
    assert json.loads((tmp_path / "v2.json").read_text())["version"] == 2
    assert Schedule.load(tmp_path / "v2.json") == lanes


def test_illegal_merge_is_named() -> None:
    g = diamond()
    h = g.structural_hash()
    staged(h, Stage((("a",),)), Stage((("l",), ("r",)), "merge"), Stage((("d",),))).validate(g)
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 8, 8))
    p = b.add("relu", [x], name="p")
    q = b.add("conv2d", [x], name="q", params=[b.param("w", torch.randn(4, 4, 1, 1))])
    g2 = b.build([b.add("add", [p, q], name="s")])
    with pytest.raises(IllegalMergeError, match="merge 0: cannot merge 'p': a relu, not a conv2d"):
        staged(g2.structural_hash(), Stage((("p",), ("q",)), "merge"), Stage((("s",),))).validate(g2)
    with pytest.raises(IllegalMergeError, match="no barrier between them"):
        Schedule(h, (("a", "l", "r", "d"),), merges=(("l", "r"),), barriers=((2,),)).validate(g)


def test_cyclic_graph_and_unknown_scheduler_or_option() -> None:
    g = diamond()
    cyclic = g.replace(nodes=(g.nodes[0].replace(inputs=("d",)),) + g.nodes[1:])
    with pytest.raises(CycleError):
        schedule(cyclic, "ios", V100)
    with pytest.raises(ScheduleError, match="no scheduler 'magic'"):
        schedule(g, "magic", V100)
    with pytest.raises(ScheduleError, match="no option.*max_group"):
        schedule(g, "greedy", V100, max_group=3)


def test_budget_keeps_a_valid_schedule(inception: Graph) -> None:
    sched = schedule(inception, "ios", V100, max_stage_costs=30)
    assert sched.stats["budget_exhausted"] and sched.stats["parts_fallback"] > 0
    assert sched.stats["parts_solved"] >= 1
    sched.validate(inception)


# --- merge --------------------------------------------------------------------------------
def test_merged_convolution_equals_its_members() -> None:
    """IOS's example: a 1x3 (pad 0,1) and a 3x1 (pad 1,0) conv become one 3x3 conv, pad 1."""
    b = GraphBuilder("m")
    x = b.input("x", (2, 6, 9, 9))
    gen = torch.Generator().manual_seed(0)
    specs = [((1, 3), (0, 1)), ((3, 1), (1, 0)), ((1, 1), (0, 0)), ((3, 3), (1, 1))]
    names = []
    for i, (k, p) in enumerate(specs):
        w = b.param(f"w{i}", torch.randn(5, 6, *k, generator=gen))
        bias = b.param(f"b{i}", torch.randn(5, generator=gen))
        names.append(b.add("conv2d", [x], name=f"c{i}", params=[w, bias], padding=p, act="relu"))
    g = b.build(names)
    check_merge(g, names)
    spec = merged_conv(g, names)
    assert spec.kernel == (3, 3) and spec.padding == (1, 1) and spec.out_channels == 20
    weight, bias = merged_parameters(g, spec)
    xin = torch.randn(2, 6, 9, 9, generator=gen)
    merged = F.relu(F.conv2d(xin, weight, bias, padding=spec.padding))
    for name, (c0, c1), (_, p) in zip(names, spec.channels, specs):
        node = g.node(name)
        ref = F.relu(F.conv2d(xin, g.params[node.params[0]], g.params[node.params[1]], padding=p))
        torch.testing.assert_close(merged[:, c0:c1], ref, rtol=1e-5, atol=1e-5)


def test_merge_classes() -> None:
    b = GraphBuilder("m")
    x = b.input("x", (1, 4, 8, 8))
    y = b.input("y", (1, 4, 8, 8))
    w = b.param("w", torch.randn(4, 4, 3, 3))
    dw = b.param("dw", torch.randn(4, 1, 3, 3))
    a = b.add("conv2d", [x], params=[w], padding=1)
    c = b.add("conv2d", [x], params=[w], padding=1, stride=2)
    d = b.add("conv2d", [y], params=[w], padding=1)
    e = b.add("conv2d", [x], params=[dw], padding=1, groups=4)
    g = b.build([a, c, d, e])
    assert merge_class(g, g.node(e)) is None
    with pytest.raises(IllegalMergeError, match="differ in input, stride"):
        check_merge(g, [a, c])
    with pytest.raises(IllegalMergeError, match="differ"):
        check_merge(g, [a, d])
    with pytest.raises(IllegalMergeError, match="grouped convolution"):
        check_merge(g, [a, e])


def test_merge_class_admits_only_buildable_merges() -> None:
    """Dilated convolutions whose paddings differ by other than a multiple of the dilation cannot
    share a kernel grid: the class keeps them apart, so no scheduler proposes the merge."""
    b = GraphBuilder("dilated")
    x = b.input("x", (1, 4, 12, 12))
    gen = torch.Generator().manual_seed(0)
    a = b.add("conv2d", [x], name="a", params=[b.param("wa", torch.randn(8, 4, 3, 3, generator=gen))], padding=2,
              dilation=2)
    c = b.add("conv2d", [x], name="c", params=[b.param("wc", torch.randn(8, 4, 2, 2, generator=gen))], padding=1,
              dilation=2)
    d = b.add("conv2d", [x], name="d", params=[b.param("wd", torch.randn(8, 4, 1, 1, generator=gen))], padding=0,
              dilation=2)
    g = b.build([b.add("add", [a, c, d], name="s")])
    assert merge_class(g, g.node(c)) != merge_class(g, g.node(a)) == merge_class(g, g.node(d)) is not None
    with pytest.raises(IllegalMergeError, match="padding modulo dilation"):
        check_merge(g, [a, c])
    spec = merged_conv(g, [a, d])
    weight, bias = merged_parameters(g, spec)
    xin = torch.randn(1, 4, 12, 12, generator=gen)
    merged = F.conv2d(xin, weight, bias, padding=spec.padding, dilation=spec.dilation)
    for name, (c0, c1) in zip((a, d), spec.channels):
        node = g.node(name)
        ref = F.conv2d(xin, g.params[node.params[0]], padding=node.attr("padding"), dilation=2)
        torch.testing.assert_close(merged[:, c0:c1], ref, rtol=1e-5, atol=1e-5)
    for name in ("ios", "est"):
        schedule(g, name, V100).validate(g)


# --- partitioning and units ---------------------------------------------------------------
def test_units_contract_light_chains_only(inception: Graph) -> None:
    ug = UnitGraph.build(inception)
    ops = [[inception.node(v).op for v in unit] for unit in ug.units]
    assert ["avg_pool2d", "conv2d"] in ops  # a pool absorbed into the conv it feeds
    # two dense convolutions are never contracted directly (a light operator may sit between them)
    assert not any(a == b == "conv2d" for o in ops for a, b in zip(o, o[1:]))
    nas = from_torch(get_model("nasnet_mobile"), example_inputs("nasnet_mobile"))
    nas_ops = [[nas.node(v).op for v in unit] for unit in UnitGraph.build(nas).units]
    # a whole separable stack: ReLU, depthwise, pointwise (+ReLU fused), depthwise, pointwise
    assert ["relu", "conv2d", "conv2d", "conv2d", "conv2d"] in nas_ops


def test_a_constant_read_once_joins_its_readers_unit() -> None:
    """A constant with one reader is in that reader's unit, right before it, and is no producer to
    the chain rule; one with two readers, or one that is an output, stays a unit of its own; units
    stay in topological order, by their chain's head, though an absorbed constant was made before
    an earlier unit's head."""
    b = GraphBuilder("consts")
    x = b.input("x", (1, 4))
    early = b.add("constant", [], name="early", params=[b.param("early", torch.ones(1, 4))])  # read late
    left = b.add("relu", [x], name="left")
    right = b.add("sigmoid", [x], name="right")
    shared = b.add("constant", [], name="shared", params=[b.param("shared", torch.ones(1, 4))])
    a = b.add("mul", [left, shared], name="a")
    c = b.add("add", [right, shared], name="c")
    d = b.add("add", [a, early], name="d")
    e = b.add("add", [d, c], name="e")
    kept = b.add("constant", [], name="kept", params=[b.param("kept", torch.ones(1, 4))])
    graph = b.build([e, kept]).verify()
    ug = UnitGraph.build(graph)
    # d's other producer, a, now heads its chain: the constant does not count as a producer
    assert ug.units == (("left",), ("right",), ("shared",), ("a", "early", "d"), ("c",), ("e",), ("kept",))
    assert all(p < u for u, ps in enumerate(ug.preds) for p in ps)  # topological
    assert UnitGraph.build(graph, contract=False).units == tuple((n.name,) for n in graph.nodes)
    for name in ("ios", "greedy", "est", "sequential"):
        schedule(graph, name, V100).validate(graph)


def test_constants_no_longer_multiply_the_states_of_a_part() -> None:
    """An ONNX import's initializer operands are constants; each one a free unit doubled the DP's
    states. Twenty biases on a chain of adds: one unit each, absorbed, and the DP sees a chain."""
    b = GraphBuilder("biases")
    v = b.input("x", (1, 8))
    for k in range(20):
        v = b.add("add", [v, b.add("constant", [], name=f"b{k}", params=[b.param(f"b{k}", torch.ones(1, 8))])])
    graph = b.build([v]).verify()
    ug = UnitGraph.build(graph)
    assert len(ug) == 1 and all(not ps for ps in ug.preds)
    sched = schedule(graph, "ios", V100)
    assert sched.stats["states"] <= 2 and not sched.stats["budget_exhausted"]


def fan(branches: int, depth: int, *more: tuple[int, int]) -> Graph:
    """``branches`` chains of ``depth`` dense 1x1 convolutions over one input, summed: each
    convolution its own unit (two dense ones never contract), (depth + 1) ** branches down-sets
    before the sum, and no cut inside (the shape of a detector's per-level heads). Each of
    ``more`` (branches, depth) is another such fan over the sum before it, a part of its own."""
    b = GraphBuilder(f"fan{branches}x{depth}")
    v = b.input("x", (1, 4, 8, 8))
    gen = torch.Generator().manual_seed(branches * 100 + depth)
    for f, (width, length) in enumerate(((branches, depth), *more)):
        ends = []
        for i in range(width):
            end = v
            for k in range(length):
                w = b.param(f"w{f}_{i}_{k}", torch.randn(4, 4, 1, 1, generator=gen) * 0.5)
                end = b.add("conv2d", [end], name=f"c{f}_{i}_{k}", params=[w])
            ends.append(end)
        v = b.add("add", ends, name=f"sum{f}")
    return b.build([v]).verify()


def brute_force_down_sets(ug: UnitGraph, part: list[int]) -> int:
    inside = set(part)
    return sum(1 for k in range(len(part) + 1) for sub in itertools.combinations(part, k)
               if all(p in sub or p not in inside for u in sub for p in ug.preds[u]))


@pytest.mark.parametrize("seed", range(8))
def test_the_dps_states_are_listed_each_once_after_their_subsets(seed: int) -> None:
    graph = random_dag(12, seed, edge_prob=0.2)
    ug = UnitGraph.build(graph, contract=False)
    n = len(ug)
    pred = [sum(1 << p for p in ug.preds[u]) for u in range(n)]
    want = sorted(sum(1 << u for u in sub) for k in range(n + 1) for sub in itertools.combinations(range(n), k)
                  if all(p in sub for u in sub for p in ug.preds[u]))
    assert ascending_down_sets(pred) == want  # every down-set, once, and each after its subsets (smaller numbers)
    calls = []
    ascending_down_sets([0] * 13, lambda: calls.append(1))  # 8192 sets: a budget check each 4096
    assert len(calls) == 2


def test_down_sets_by_hand() -> None:
    assert down_sets(ancestor_masks([[], [0], [0], [1, 2]])) == 6  # a diamond: {}, a, ab, ac, abc, abcd
    assert down_sets(ancestor_masks([[], [0], [1], [2], [3]])) == 6  # a chain of 5: its prefixes
    assert down_sets(ancestor_masks([[]] * 10)) == 2 ** 10  # independent nodes: every subset
    assert down_sets(ancestor_masks([[]] * 10), cap=100) == 101
    assert down_sets([]) == 1  # the empty set alone


@pytest.mark.parametrize("seed", range(8))
def test_state_count_is_the_number_of_down_sets_and_of_the_dps_states(seed: int) -> None:
    graph = random_dag(12, seed, edge_prob=0.2)
    ug = UnitGraph.build(graph, contract=False)
    part = list(range(len(ug)))
    want = brute_force_down_sets(ug, part)
    assert state_count(ug, part) == want
    assert state_count(ug, part, cap=want) == want and state_count(ug, part, cap=want - 1) == want
    assert state_count(ug, part[3:9]) == brute_force_down_sets(ug, part[3:9])  # a part of the graph, alone
    stats = SearchStats()
    PartSolver(ug, part, StageCoster(graph, V100), ("parallel",), 3, 2, lambda: None, stats, None).solve()
    assert stats.states + 1 == want  # every down-set but the empty one (solved from the start), once


def test_a_part_with_more_states_than_max_states_is_split_until_each_piece_fits() -> None:
    graph = fan(8, 3)
    ug = UnitGraph.build(graph)
    (block,) = (p for p in partition(ug, 50) if len(p) > 1)
    assert state_count(ug, block) == 4 ** 8 + 1  # the sum's unit adds the whole
    for bound in (2, 50, 1000, 4 ** 8 + 1):
        pieces = split_to_fit(ug, block, bound)
        assert [u for p in pieces for u in p] == block  # ranges of the order, in order
        assert all(state_count(ug, p) <= bound for p in pieces)
        assert (len(pieces) == 1) == (bound >= 4 ** 8 + 1)
        for piece in pieces[:-1]:  # each at least half the longest run that fits from its start
            lo = piece[0]
            longest = max(q for q in range(lo, block[-1] + 1) if state_count(ug, range(lo, q + 1)) <= bound)
            assert longest < block[-1] and piece[-1] >= lo + (longest - lo) // 2
    with pytest.raises(ValueError, match="max_states must be at least 2"):
        split_to_fit(ug, block, 1)


def test_max_states_bounds_a_wide_parts_search_and_keeps_it_exact_within_each_piece() -> None:
    """Twelve branches of three convolutions: 4 ** 12 (16.8 million) down-sets, past any search
    budget. Split, the DP solves each piece to its optimum in a fraction of a second and never
    falls back to a heuristic; the bound costs a small graph nothing the unbounded search finds."""
    graph = fan(12, 3)
    sched = schedule(graph, "ios", CPU2, max_lanes=2)
    stats = sched.stats
    assert stats["parts_split"] == 1 and not stats["budget_exhausted"] and stats["parts_fallback"] == 0
    assert stats["states"] < 20_000 * stats["parts"]
    assert sched.estimated_ms < schedule(graph, "sequential", CPU2).estimated_ms
    assert "(1 part over max_states split)" in summarize(stats)
    small = fan(3, 2)  # 28 down-sets: bounded at 4, split; unbounded, the exact optimum, no worse
    bounded = schedule(small, "ios", V100, max_states=4, max_lanes=3)
    exact = schedule(small, "ios", V100, max_states=None, max_lanes=3)
    assert bounded.stats["parts_split"] == 1 and exact.stats["parts_split"] == 0
    assert exact.estimated_ms <= bounded.estimated_ms + 1e-12
    with pytest.raises(ScheduleError, match="option max_states of scheduler 'ios' must be at least 2"):
        schedule(small, "ios", V100, max_states=1)


def test_a_search_budget_that_runs_out_leaves_the_largest_parts_to_the_heuristic_not_the_later_ones() -> None:
    """A wide part (4,097 states) before two small ones (5 states each): the budget, counted in
    stages priced so that the test does not depend on the machine's speed, cannot solve the wide
    part. Searched smallest first, the small parts are solved to their optimum and the wide one
    alone falls back; in the graph's order, it would have taken the small parts down with it."""
    graph = fan(6, 3, (2, 1), (2, 1))
    ug = UnitGraph.build(graph)
    parts = partition(ug, 50)
    assert sorted(state_count(ug, p) for p in parts) == [5, 5, 4 ** 6 + 1]
    assert state_count(ug, parts[0]) == 4 ** 6 + 1  # the wide one comes first in the graph
    bounded = schedule(graph, "ios", V100, max_stage_costs=30, max_states=None)
    stats = bounded.stats
    assert stats["budget_exhausted"] and stats["parts_fallback"] == 1
    assert stats["parts_solved"] + stats["parts_reused"] == 2
    exact = schedule(graph, "ios", V100, max_states=None)
    tail = {v for p in parts[1:] for u in p for v in ug.units[u]}
    assert [s for s in bounded.stages if set(s.nodes) <= tail] == [s for s in exact.stages if set(s.nodes) <= tail]


def test_inception_blocks_are_cut_at_module_outputs(inception: Graph) -> None:
    ug = UnitGraph.build(inception)
    cuts = cut_units(ug)
    concat_cuts = [u for u in cuts if any(inception.node(v).op == "concat" for v in ug.units[u])]
    assert len(concat_cuts) == 11  # every Inception module's output (the last one heads the classifier's unit)
    parts = partition(ug, 50)
    assert sorted(u for p in parts for u in p) == list(range(len(ug)))


def test_an_unrolled_loops_parts_are_solved_once_whatever_patch_each_reads() -> None:
    """An unrolled loop over the patches of its input (TimesFM's normalisation, small): each step
    selects its own patch, and parts that differ only in which patch they select are one part
    to the search (:func:`opsched.ir.hashing.cost_signature`), solved once and reused: of its 21
    parts, 4 are solved (9 while the select's index told them apart), and the schedule's
    estimate is what solving each part on its own gives."""

    class Loop(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = x.select(1, 0)
            for i in range(1, 6):
                p = x.select(1, i)
                y = (y * p.sigmoid() + p.tanh()).relu()
            return y

    g = from_torch(Loop(), (torch.randn(4, 6, 32),))
    sched = schedule(g, "ios", V100, max_lanes=4, max_part_size=4)
    assert (sched.stats["parts"], sched.stats["parts_solved"], sched.stats["parts_reused"]) == (21, 4, 17)
    ug = UnitGraph.build(g)
    alone = []
    for part in partition(ug, 4):
        stages, _ = ios_stages(g.subgraph([v for u in part for v in ug.units[u]]), V100, max_lanes=4)
        alone.append(estimate(g, stages, V100))
    assert sched.estimated_ms == pytest.approx(sum(alone))


def test_nasnet_parts_align_with_cells() -> None:
    nas = from_torch(get_model("nasnet_mobile"), example_inputs("nasnet_mobile"))
    ug = UnitGraph.build(nas)
    parts = partition(ug, 50)
    ends = [nas.node(ug.units[p[-1]][-1]) for p in parts[1:-2]]  # the last cell and head split by size
    assert all(n.op == "concat" and n.out.shape[1] in (44 * 6, 88 * 6, 176 * 6, 11 * 4, 22 * 4, 88 * 4, 176 * 4)
               for n in ends), [(n.name, n.op) for n in ends]
    sched = schedule(nas, "ios", V100)
    assert sched.stats["parts_reused"] >= 2  # repeated cells are solved once

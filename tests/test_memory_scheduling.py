"""Memory-hierarchy-aware scheduling (GraphTurbo): the hierarchy presets, each algorithm on its
own (SplitInfo, grouping, the instance order of the paper's Fig. 7, binding), the traffic
simulator, and split plans executed equal to eager on every CPU backend."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._dynamo.utils import counters

import opsched
from opsched import from_torch
from opsched.backends.ort_program import JOIN_IN_PLACE
from opsched.cost import DEVICES, AnalyticCostModel, ProfileStore, host_cpu_spec
from opsched.cost import hierarchy as hierarchy_module
from opsched.cost.bandwidth import copy_gbps
from opsched.cost.hierarchy import (
    MIB,
    Hierarchy,
    MemoryLevel,
    hierarchy,
    hierarchy_for,
    hierarchy_names,
    host_hierarchy,
    measured_host_hierarchy,
    probe_sizes,
    read_cpu_caches,
    register_hierarchy,
)
from opsched.costing import measured_cost
from opsched.errors import CostModelError, InvalidScheduleError, ScheduleError, ScheduleMismatchError
from opsched.ir import GraphBuilder
from opsched.models import example_inputs, get_model
from opsched.module import ScheduledModule
from opsched.runtime.plan import lower_instances
from opsched.runtime.reference import run_graph
from opsched.runtime.stream_program import stream_program
from opsched.schedule import Schedule
from opsched.schedulers import schedule
from opsched.schedulers.memory import (
    ALL,
    Group,
    SplitInfo,
    bind,
    breadth_first,
    depth_first,
    estimate_ms,
    group_nodes,
    instance_dag,
    instance_peak,
    simulate,
    singletons,
    split_info,
    split_pays,
)
from opsched.testing import check_stream_program
from opsched.transforms import Split, split_instances
from opsched.transforms.halos import row_plan, row_refusal

CPU = AnalyticCostModel(host_cpu_spec())
ATOL = 1e-4  # float32, kernels on batch slices against the whole batch


def _zoo_graph(name: str, batch: int):  # type: ignore[no-untyped-def]
    model = get_model(name).eval()
    inputs = example_inputs(name, batch)
    return model, inputs, from_torch(model, inputs)


def _small_cpu(fit_kib: int, cores: int = 2) -> Hierarchy:
    """A CPU whose per-core cache is ``fit_kib`` KiB, so that small test graphs must split."""
    h = host_hierarchy()
    levels = (MemoryLevel("L1", 8 * 1024, 150.0), MemoryLevel("L2", fit_kib * 1024, 60.0),
              MemoryLevel("L3", 4 * fit_kib * 1024, 40.0, cores), MemoryLevel("DRAM", None, 20.0, cores))
    return dataclasses.replace(h, cores=cores, levels=levels, fit="L2")


SMALL_CPU = "test-cpu-256k"  # a registered preset, so that schedules made for it are the same on any machine
if SMALL_CPU not in hierarchy_names():
    register_hierarchy(SMALL_CPU, lambda: dataclasses.replace(_small_cpu(256), name=SMALL_CPU))

SMALL_GPU = "test-gpu-1m"  # an H100 whose L2 holds 1 MiB: zoo models split at small batches
if SMALL_GPU not in hierarchy_names():
    def _small_gpu() -> Hierarchy:
        h100 = hierarchy("H100")
        levels = tuple(dataclasses.replace(lv, capacity=MIB) if lv.name == "L2" else lv for lv in h100.levels)
        return dataclasses.replace(h100, name=SMALL_GPU, levels=levels)
    register_hierarchy(SMALL_GPU, _small_gpu)


# --- the hierarchy --------------------------------------------------------------------------
def _sysfs(root):  # type: ignore[no-untyped-def]
    """A CPU's cache directory: 48 KiB L1d (and an L1i), 2 MiB L2 per core, 32 MiB L3 for 4 cores."""
    for k, (level, kind, size, shared) in enumerate([(1, "Data", "48K", "0"), (1, "Instruction", "64K", "0"),
                                                     (2, "Unified", "2048K", "0"), (3, "Unified", "32M", "0-3")]):
        d = root / f"index{k}"
        d.mkdir()
        for f, v in (("level", level), ("type", kind), ("size", size), ("shared_cpu_list", shared)):
            (d / f).write_text(f"{v}\n")
    return root


def test_cpu_preset_reads_sysfs(tmp_path):
    _sysfs(tmp_path)
    assert read_cpu_caches(tmp_path) == [(1, 48 * 1024, 1), (2, 2 * 2**20, 1), (3, 32 * 2**20, 4)]
    h = host_hierarchy(tmp_path)
    assert [lv.name for lv in h.levels] == ["L1", "L2", "L3", "DRAM"]
    assert h.fit == "L2" and h.fit_bytes == 2 * 2**20 and h.level("L3").shared_by == 4
    assert host_hierarchy(tmp_path / "missing").fit_bytes == 2 * 2**20  # the common server core


def test_copy_bandwidth_is_a_measurement_or_nothing():
    gbps = copy_gbps(8 * MIB)  # 4 MiB read, 4 MiB written: far above the call's own cost on any machine
    assert gbps is not None and 0.1 < gbps < 10_000
    assert copy_gbps(64) is None  # a copy of nothing is all call: no figure, rather than noise
    assert copy_gbps(2**62) is None  # buffers no machine has: no figure, and no crash


def test_measured_hierarchy_probes_each_level_once_per_store(tmp_path, monkeypatch):
    (tmp_path / "cache").mkdir()
    root = _sysfs(tmp_path / "cache")
    preset = host_hierarchy(root)
    sizes = probe_sizes(preset)
    dram, cores = sizes["DRAM"]
    assert sizes["L1"] == (24 * 1024, 1) and sizes["L2"] == (MIB, 1) and sizes["L3"] == (16 * MIB, 1)
    assert cores == preset.cores and 64 * MIB <= dram <= 128 * MIB  # 4x the L3, unless memory is short
    figures = {24 * 1024: 0.0, MIB: 90.0, 16 * MIB: 30.0, dram: 25.0}  # GB/s; 0: not measurable (the L1)
    probed = []

    def probe(nbytes: int, threads: int) -> float:
        probed.append((nbytes, threads))
        return figures[nbytes]
    monkeypatch.setattr(hierarchy_module, "_probe", probe)
    heard = []
    with ProfileStore(tmp_path / "store") as store:
        h = measured_host_hierarchy(measured_cost(store=store), root,
                                    progress=lambda done, total, text: heard.append((done, total, text)))
        assert sorted(probed) == sorted(sizes.values())
        assert heard == [(0, 4, "L1 bandwidth"), (1, 4, "L2 bandwidth"), (2, 4, "L3 bandwidth"),
                         (3, 4, "DRAM bandwidth"), (4, 4, "memory bandwidths")]
        again = measured_host_hierarchy(measured_cost(store=store), root)  # a new model, the same store
    assert len(probed) == len(sizes) and again == h
    by = {lv.name: lv for lv in h.levels}
    assert by["L1"] == preset.level("L1")  # kept: the preset's figure, not measured
    assert (by["L2"].bandwidth_gbps, by["L2"].measured_at) == (90.0, MIB)
    assert by["L3"].bandwidth_gbps == 30.0 * 4  # one core's figure, times the cores that share the L3
    assert by["DRAM"].bandwidth_gbps == 25.0    # every core copying: the whole DRAM's figure
    assert h.name.endswith("-measured") and "measured, 1 MiB copies" in str(h)
    # an L2 too quick to time keeps its preset, but never below what the L3 moves per core
    l2 = preset.level("L2").bandwidth_gbps
    figures.update({MIB: 0.0, 16 * MIB: l2 / 2})  # the L3: l2 / 2 per core, times 4 cores
    slow = {lv.name: lv for lv in measured_host_hierarchy(None, root).levels}
    assert (slow["L2"].bandwidth_gbps, slow["L2"].measured_at) == (l2, None)
    figures[16 * MIB] = 2 * l2
    fast = {lv.name: lv for lv in measured_host_hierarchy(None, root).levels}
    assert (fast["L2"].bandwidth_gbps, fast["L2"].measured_at) == (2 * l2, None)
    assert fast["L1"].bandwidth_gbps == max(preset.level("L1").bandwidth_gbps, 2 * l2)


def test_graphturbo_measures_the_hierarchy_with_a_measured_cost_model(tmp_path, monkeypatch):
    monkeypatch.setattr(hierarchy_module, "_probe", lambda nbytes, threads: 10.0)
    model, inputs, g = _zoo_graph("squeezenet1_1", 2)
    with ProfileStore(tmp_path) as store:
        measured = schedule(g, "graphturbo", measured_cost(store=store))
    assert measured.stats["hierarchy"].endswith("-measured")
    assert schedule(g, "graphturbo", CPU).stats["hierarchy"] == host_hierarchy().name  # analytic: the preset


def test_gpu_presets_and_lookup():
    for name, l2 in (("H100", 50), ("H200", 50), ("A100", 40), ("V100", 6)):
        h = hierarchy(name)
        assert h.fit == "L2" and h.fit_bytes == l2 * 2**20 and h.cores == 1
        assert [lv.name for lv in h.levels] == ["SMEM", "L2", "HBM"] and not h.levels[0].persists
    assert hierarchy_for("NVIDIA H200 141GB").name == "H200"
    assert hierarchy_for("cuda:0 (unknown)").name == "H100"
    assert hierarchy_for("CPU2", cores=3).cores == 3
    with pytest.raises(CostModelError, match="no memory hierarchy 'TPU'"):
        hierarchy("TPU")
    with pytest.raises(CostModelError, match="last level must be unbounded"):
        Hierarchy("bad", 1, (MemoryLevel("L1", 1024, 1.0),), "L1", host_cpu_spec())


# --- Algorithm 1 ----------------------------------------------------------------------------
def _chain(batch: int = 8, width: int = 16, size: int = 16):  # type: ignore[no-untyped-def]
    b = GraphBuilder("chain")
    x = b.input("x", (batch, width, size, size))
    w = b.param("w", torch.randn(width, width, 3, 3) * 0.1)
    a = b.add("conv2d", [x], params=[w], name="a", padding=(1, 1))
    r = b.add("relu", [a], name="r")
    c = b.add("conv2d", [r], params=[w], name="c", padding=(1, 1))
    return b.build([c])


def test_instance_peak_walks_the_live_values():
    g = _chain()
    one = 8 * 16 * 16 * 16 * 4  # a whole activation
    # running a, r, c: x and a live (a read by r), then r (x dead after a, a dead after r), then c
    assert instance_peak(g, ["a", "r", "c"]) == 2 * one
    assert instance_peak(g, ["a", "r", "c"], 4) == 2 * one // 4
    assert instance_peak(g, ["a"]) == 2 * one  # x in, a out


def test_split_info_takes_the_smallest_factor_that_fits():
    g = _chain()
    one = 8 * 16 * 16 * 16 * 4
    info = split_info(g, ["a", "r", "c"], capacity=2 * one // 3)
    assert (info.factor, info.fits) == (4, True)  # 2 would leave one instance at 2*one/2 > 2*one/3
    assert split_info(g, ["a", "r", "c"], capacity=10**9).factor == 1
    none = split_info(g, ["a", "r", "c"], capacity=100)
    assert (none.factor, none.fits) == (8, False)
    assert split_info(g, ["a"], capacity=2 * one // 3, max_factor=2) == split_info(g, ["a"], 2 * one // 3, 2)


# --- Algorithm 3: the paper's Fig. 7 --------------------------------------------------------
def _fig7() -> tuple[list[str], list[list[int]]]:
    """Sub-graphs a, b, c, d of 8, 4, 2 and 1 instances: b_j reads a_2j-1, a_2j and so on."""
    names, index = [], {}
    for g, n in (("a", 8), ("b", 4), ("c", 2), ("d", 1)):
        for i in range(1, n + 1):
            index[(g, i)] = len(names)
            names.append(f"{g}{i}")
    preds: list[list[int]] = [[] for _ in names]
    for prev, g, n in (("a", "b", 4), ("b", "c", 2), ("c", "d", 1)):
        for j in range(1, n + 1):
            preds[index[(g, j)]] = [index[(prev, 2 * j - 1)], index[(prev, 2 * j)]]
    return names, preds


def test_depth_first_order_reproduces_fig7():
    names, preds = _fig7()
    assert " ".join(names[u] for u in depth_first(preds)) == "a8 a7 b4 a6 a5 b3 c2 a4 a3 b2 a2 a1 b1 c1 d1"
    assert " ".join(names[u] for u in breadth_first(preds)) == "a1 a2 a3 a4 a5 a6 a7 a8 b1 b2 b3 b4 c1 c2 d1"


def test_orders_refuse_a_cycle():
    with pytest.raises(ValueError, match="cycle"):
        depth_first([[1], [0]])


# --- the split graph ------------------------------------------------------------------------
def test_split_graph_structure_between_factors():
    g = _chain()
    split = split_instances(g, [Split(("a", "r"), 4), Split(("c",), 2)])
    # instances in the graph's order, a slice of x per a-instance, a join of two r-instances per c-instance
    assert [n.name for n in split.nodes] == [
        "x@0-2", "a@0", "x@2-4", "a@1", "x@4-6", "a@2", "x@6-8", "a@3", "r@0", "r@1", "r@2", "r@3",
        "r@0-4", "c@0", "r@4-8", "c@1", "c"]
    # c's instance 0 reads samples 0-3 of r: r@0 and r@1 (2 samples each) joined, nothing else
    piece = split.node(split.node("c@0").inputs[0])
    assert piece.op == "concat" and piece.inputs == ("r@0", "r@1")
    # x is sliced per a-instance (a view), and c is joined under its own name for the output
    assert split.node(split.node("a@2").inputs[0]).attrs["start"] == 4
    assert split.node("c").op == "concat" and split.outputs == ("c",)
    assert split.node("a@0").out.shape == (2, 16, 16, 16)


def test_split_refuses_what_cannot_split():
    g = _chain()
    with pytest.raises(InvalidScheduleError, match="factor 3 does not divide the batch of 8"):
        split_instances(g, [Split(("a",), 3)])
    with pytest.raises(InvalidScheduleError, match="'a' is in splits 0 and 1"):
        split_instances(g, [Split(("a",), 2), Split(("a", "r"), 4)])
    with pytest.raises(InvalidScheduleError, match="'zz', which is not a node"):
        split_instances(g, [Split(("zz",), 2)])
    with pytest.raises(InvalidScheduleError, match="factor is an int of at least 2"):
        Split(("a",), 1)
    b = GraphBuilder("softmaxes")
    x = b.input("x", (4, 8))
    m = b.add("softmax", [x], name="m", axis=0)
    with pytest.raises(InvalidScheduleError, match="node 'm' \\(softmax\\).*works along the batch axis"):
        split_instances(b.build([m]), [Split(("m",), 2)])


# --- Algorithm 2 ----------------------------------------------------------------------------
def test_grouping_merges_a_residual_block_and_inception_branches():
    _, _, g = _zoo_graph("resnet18", 2)
    # a 2 MiB per-core cache, not this machine's: how far grouping goes depends on the size
    # (1 MiB: 18 groups of 40 nodes; 2 MiB: 8; 4 MiB: 1)
    groups = group_nodes(g, _small_cpu(2048), pays=lambda parts, merged: True)
    assert sorted(v for nodes, _ in groups for v in nodes) == sorted(n.name for n in g.nodes)
    assert len(groups) < len(g.nodes) // 4  # layers became blocks and stages
    assert all(info.fits for nodes, info in groups if len(nodes) > 1)  # a merge is kept only if it still fits
    forced = group_nodes(g, _small_cpu(1), pays=lambda parts, merged: True)
    assert all(len(nodes) == 1 for nodes, info in forced if not info.fits)


def test_grouping_without_rounds_is_layer_by_layer():
    _, _, g = _zoo_graph("squeezenet1_1", 2)
    assert [nodes for nodes, _ in group_nodes(g, host_hierarchy(), max_rounds=0)] == [
        grp.nodes for grp in singletons(g)]


# --- Algorithm 4 and the simulator ----------------------------------------------------------
def test_binding_keeps_slices_on_their_core_and_demotes_crossing_values():
    g = _chain()
    dag = instance_dag(g, [Group(("a", "r"), 4), Group(("c",), 2)])
    order = depth_first(dag.preds)
    b = bind(dag, order, 2)
    core = {dag.units[u].nodes[0]: b.cores[u] for u in range(len(dag.units))}
    assert [core[f"a@{i}"] for i in range(4)] == [0, 0, 1, 1]
    assert [core[f"c@{i}"] for i in range(2)] == [0, 1]
    assert core["c"] == ALL  # the join of c's instances for the graph output runs on every core
    # no value read on another core keeps its core-local scope
    for u, ps in enumerate(dag.preds):
        for p in ps:
            if b.cores[p] != b.cores[u] or b.cores[u] == ALL:
                assert p in b.shared


@pytest.mark.parametrize("name", ["squeezenet1_1", "resnet18", "googlenet", "inception_v3", "nasnet_mobile",
                                  "randwire_small", "resnet50"])
def test_depth_first_never_moves_more_dram_bytes_than_breadth_first(name):
    _, _, g = _zoo_graph(name, 8)
    h = _small_cpu(512)  # caches small enough that order matters at this size
    found = group_nodes(g, h)
    dag = instance_dag(g, [Group(nodes, info.factor, info.axis) if info.fits else Group(nodes)
                           for nodes, info in found])
    runs = {}
    for label, order in (("dfs", depth_first(dag.preds)), ("bfs", breadth_first(dag.preds))):
        runs[label] = simulate(dag, order, bind(dag, order, h.cores), h)
    assert runs["dfs"].bytes["DRAM"] <= runs["bfs"].bytes["DRAM"]
    assert sum(runs["dfs"].bytes.values()) > 0


@settings(max_examples=25, deadline=None)
@given(width=st.sampled_from([4, 8, 16]), size=st.sampled_from([8, 16, 32]), fit_kib=st.integers(16, 512),
       batch=st.sampled_from([1, 2, 4, 8, 16]))
def test_every_instance_peak_fits_its_level(width, size, fit_kib, batch):
    g = _chain(batch, width, size)
    h = _small_cpu(fit_kib)
    for nodes, info in group_nodes(g, h):
        if info.fits:
            rest = [Group((v,)) for v in g.index if v not in nodes]
            dag = instance_dag(g, [Group(nodes, info.factor, info.axis), *rest])
            for unit in dag.units:
                if unit.group == 0 and info.factor > 1:
                    assert instance_peak(dag.graph, unit.nodes) <= h.fit_bytes
            assert info.peak <= h.fit_bytes


def test_a_gpu_core_is_the_whole_chip_and_a_cpu_core_its_share():
    """On a GPU the one lane's kernels spread over every SM: a core has the chip's peak and every
    level's whole bandwidth (the first GPU run found the simulator giving it one SM's share, and
    its estimates 132 times too slow on an H200). A CPU core has its share of each."""
    gpu = hierarchy("H200")
    assert gpu.cores == 1 and gpu.slots() == DEVICES["H200"].slots
    assert gpu.gflops() == DEVICES["H200"].peak_gflops
    assert [gpu.share_gbps(lv) for lv in gpu.levels] == [lv.bandwidth_gbps for lv in gpu.levels]
    cpu = _small_cpu(64, cores=4)
    assert cpu.gflops() == pytest.approx(cpu.device.peak_gflops / cpu.device.slots)
    assert cpu.share_gbps(cpu.dram) == pytest.approx(cpu.dram.bandwidth_gbps / cpu.dram.shared_by)
    assert cpu.share_gbps(cpu.dram, cores=4) == pytest.approx(cpu.dram.bandwidth_gbps * min(4, cpu.dram.shared_by)
                                                              / cpu.dram.shared_by)


@pytest.mark.parametrize("name,batch", [("googlenet", 16), ("resnet18", 8), ("squeezenet1_1", 8)])
@pytest.mark.parametrize("preset", ["H200", "V100"])
def test_simulated_layer_by_layer_time_agrees_with_the_analytic_model_on_a_gpu(name, batch, preset):
    """The traffic simulator's latency of the layer-by-layer order and the analytic model's
    sequential estimate price the same kernels on the same preset: they agree to within their
    different sums (the simulator adds compute to traffic, the analytic model takes the larger
    and adds launches). Observed 1.00-1.12x on these models."""
    _, _, g = _zoo_graph(name, batch)
    dag = instance_dag(g, singletons(g))
    order = depth_first(dag.preds)
    simulated = simulate(dag, order, bind(dag, order, 1), hierarchy(preset)).latency_ms
    analytic = schedule(g, "sequential", AnalyticCostModel(preset)).estimated_ms
    assert 0.8 < simulated / analytic < 1.3


def test_split_when_pays_keeps_the_splits_the_estimate_prices_below_the_whole_sub_graph():
    """By default a sub-graph splits only where its instances cost less than it does whole in
    :func:`estimate_ms`; ``split_when="fits"`` splits every one whose instances fit (the paper).
    On a V100's 6 MiB of L2 at batch 32 the paper's rule splits ResNet-18 into batch instances
    of a few samples, which the estimate prices above the whole sub-graphs."""
    _, _, g = _zoo_graph("resnet18", 32)
    h = hierarchy("V100")
    paid = schedule(g, "graphturbo", AnalyticCostModel("V100"), hierarchy="V100")
    fits = schedule(g, "graphturbo", AnalyticCostModel("V100"), hierarchy="V100", split_when="fits")
    assert fits.splits and len(paid.splits) < len(fits.splits)
    for nodes, info in group_nodes(g, h):
        whole = SplitInfo(1, instance_peak(g, nodes), False)
        assert split_pays(g, nodes, info, h) == (info.factor == 1 or estimate_ms(g, nodes, info, h) <
                                                 estimate_ms(g, nodes, whole, h))
    with pytest.raises(ScheduleError, match="split_when of scheduler 'graphturbo' must be one of"):
        schedule(g, "graphturbo", AnalyticCostModel("V100"), split_when="always")


# --- the scheduler, executed ----------------------------------------------------------------
@pytest.mark.parametrize("name", ["squeezenet1_1", "resnet18", "googlenet", "inception_v3", "randwire_small"])
@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_split_plans_equal_eager(name, backend):
    model, inputs, g = _zoo_graph(name, 4)
    s = schedule(g, "graphturbo", CPU, hierarchy="cpu", max_lanes=2, split_when="fits")
    assert s.splits and len(s.lanes) == 2
    _assert_equals_eager(ScheduledModule(g, s, backend=backend), model, inputs)


def _assert_equals_eager(module, model, inputs):  # type: ignore[no-untyped-def]
    """On the example inputs and on fresh ones."""
    with torch.no_grad():
        torch.testing.assert_close(module(*inputs), model(*inputs), atol=ATOL, rtol=ATOL)
        fresh = torch.randn_like(inputs[0])
        torch.testing.assert_close(module(fresh), model(fresh), atol=ATOL, rtol=ATOL)


def test_ort_joins_batch_slices_in_place():
    """A join of instances along the batch costs no concat: the sessions making its parts write
    into their samples of the whole value, and the join runs no kernel."""
    model, inputs, g = _zoo_graph("squeezenet1_1", 4)
    s = schedule(g, "graphturbo", CPU, hierarchy="cpu", max_lanes=2, split_when="fits")
    module = ScheduledModule(g, s, backend="ort")
    batch_joins = {n.name for n in module.graph.nodes if n.op == "concat" and n.attrs["axis"] == 0}
    events = module.profile(*inputs)
    in_place = {e.label for e in events if e.op == JOIN_IN_PLACE}
    assert in_place and in_place <= batch_joins  # joins across the lanes; those within a lane stay in a session
    assert not [e for e in events if e.label in in_place and e.op != JOIN_IN_PLACE]  # no Concat kernel for them
    one_lane = ScheduledModule(g, schedule(g, "graphturbo", CPU, hierarchy="cpu", max_lanes=1), backend="ort")
    assert one_lane.report().executor.startswith("onnxruntime: 1 session")  # nothing in place to cut it
    _assert_equals_eager(module, model, inputs)


def test_split_plan_on_inductor_segments_equals_eager():
    model, inputs, g = _zoo_graph("squeezenet1_1", 4)
    s = schedule(g, "graphturbo", CPU, max_lanes=2, split_when="fits")
    module = ScheduledModule(g, s, backend="inductor")
    with torch.no_grad():
        torch.testing.assert_close(module(*inputs), model(*inputs), atol=ATOL, rtol=ATOL)


# --- splits along the rows -------------------------------------------------------------------
def test_row_plan_computes_the_halos_exactly():
    g = _chain(batch=1)  # a: 3x3 conv, padding 1; r: relu; c: 3x3 conv, padding 1; 16 rows
    plan = row_plan(g, ["a", "r", "c"], 2)
    assert plan.shares == {"c": ((0, 8), (8, 16))}  # only c is read outside: each instance its half
    assert plan.computes == {"c": ((0, 8), (8, 16)), "r": ((0, 9), (7, 16)), "a": ((0, 9), (7, 16))}
    assert plan.reads == {("c", "r"): ((-1, 9), (7, 17)), ("r", "a"): ((0, 9), (7, 16)),
                          ("a", "x"): ((-1, 10), (6, 17))}  # -1 and 17: the convolutions' padding rows
    assert plan.outside == {"x": ((0, 10), (6, 16))}
    assert 1.0 < plan.recompute(g) < 18 / 16  # a and r compute 18 of 16 rows, c none twice


def test_row_split_graph_structure():
    g = _chain(batch=1)
    split = split_instances(g, [Split(("a", "r", "c"), 2, axis=2)])
    assert [n.name for n in split.nodes] == [
        "x@rows0-10", "a@0:pad", "a@0", "x@rows6-16", "a@1:pad", "a@1", "r@0", "r@1",
        "c@0:pad", "c@0", "c@1:pad", "c@1", "c"]
    assert split.node("a@0:pad").attrs["pads"] == (0, 0, 1, 0)  # the top padding row, on the top band only
    assert split.node("a@1:pad").attrs["pads"] == (0, 0, 0, 1)
    assert split.node("a@0").attrs["padding"] == (0, 1) and split.node("a@0").out.shape == (1, 16, 9, 16)
    assert split.node("c").op == "concat" and split.node("c").inputs == ("c@0", "c@1")
    # bands of 4 reading bands of 2: c@1 (rows 4-8) reads rows 3-9 of r, from both r instances
    split = split_instances(g, [Split(("a", "r"), 2, axis=2), Split(("c",), 4, axis=2)])
    band = split.node(split.node("c@1").inputs[0])
    assert (band.name, band.op, band.inputs) == ("r@rows3-9", "concat", ("r@0:3-8", "r@1:8-9"))
    assert split.node("r@1:8-9").attrs == {"axis": 2, "start": 0, "end": 1}  # r@1 computes rows 8-16
    inputs = [torch.randn(1, 16, 16, 16)]
    torch.testing.assert_close(run_graph(split, inputs)[0], run_graph(g, inputs)[0], atol=ATOL, rtol=ATOL)


def test_row_split_refusals_name_the_node_and_why():
    b = GraphBuilder("rows")
    x = b.input("x", (1, 4, 9, 9))
    p = b.add("avg_pool2d", [x], name="p", kernel=2, ceil_mode=True)
    c = b.add("concat", [x, x], name="cat", axis=2)
    f = b.add("flatten", [x], name="f", start_dim=1)
    g = b.build([p, c, f])
    assert "clipped count" in row_refusal(g, g.node("p"))
    assert "along axis 2" in row_refusal(g, g.node("cat"))
    assert "not known" in row_refusal(g, g.node("f"))
    with pytest.raises(InvalidScheduleError, match=r"node 'cat' \(concat\).*cannot be split along the rows"):
        split_instances(g, [Split(("cat",), 2, axis=2)])
    with pytest.raises(InvalidScheduleError, match="node 'a'.*its 16 rows cannot be shared by 17 instances"):
        split_instances(_chain(batch=1), [Split(("a",), 17, axis=2)])
    with pytest.raises(InvalidScheduleError, match=r"axis 0 \(the batch\) or 2 \(the rows\), got 1"):
        Split(("a",), 2, axis=1)


def _row_runs(g):  # type: ignore[no-untyped-def]
    """Every maximal run (in the graph's order) of nodes that can split along the rows."""
    runs, run = [], []
    for n in g.nodes:
        if row_refusal(g, n) is None:
            run.append(n.name)
        elif run:
            runs.append(run)
            run = []
    return runs + ([run] if run else [])


@pytest.mark.parametrize("name", ["squeezenet1_1", "resnet18", "googlenet", "inception_v3", "nasnet_mobile",
                                  "randwire_small", "resnet50"])
def test_every_zoo_model_cut_into_bands_of_rows_equals_eager(name):
    """Every run of row-separable nodes cut into 3 bands (2, or none, where a value is too short):
    strides, dilations, ceil-mode and padded pools, residual adds and channel concats, with their
    halos, against eager PyTorch."""
    model, inputs, g = _zoo_graph(name, 1)
    splits = []
    for run in _row_runs(g):
        for factor in (3, 2):
            try:
                row_plan(g, run, factor)
            except InvalidScheduleError:
                continue
            splits.append(Split(tuple(run), factor, axis=2))
            break
    assert sum(len(s.nodes) for s in splits) > len(g.nodes) // 3
    split = split_instances(g, splits)
    assert any(n.op == "pad" for n in split.nodes)
    with torch.no_grad():
        torch.testing.assert_close(run_graph(split, inputs)[0], model(*inputs), atol=ATOL, rtol=ATOL)


@pytest.mark.parametrize("name", ["squeezenet1_1", "resnet18", "googlenet"])
@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_row_split_plans_equal_eager(name, backend):
    model, inputs, g = _zoo_graph(name, 1)
    s = schedule(g, "graphturbo", CPU, hierarchy=SMALL_CPU, max_lanes=2, split_when="fits")
    assert s.splits and all(split.axis == 2 for split in s.splits)  # at batch 1, only the rows can split
    _assert_equals_eager(ScheduledModule(g, s, backend=backend), model, inputs)


@pytest.mark.parametrize("name,batch", [("squeezenet1_1", 4), ("googlenet", 4), ("resnet18", 1)])
def test_split_plans_lower_to_correct_cuda_stream_programs(name, batch):
    """What the CUDA executor would run (checked here on the CPU against stream semantics): a GPU
    hierarchy's split plan, instances one after another on one lane, as a stream program."""
    _, _, g = _zoo_graph(name, batch)
    s = schedule(g, "graphturbo", AnalyticCostModel("H100"), hierarchy=SMALL_GPU, split_when="fits")
    assert s.splits and all(split.axis == (0 if batch > 1 else 2) for split in s.splits)
    check_stream_program(stream_program(lower_instances(g, s)[1]))


@pytest.mark.gpu
@pytest.mark.parametrize("name,batch", [("squeezenet1_1", 4), ("googlenet", 4), ("resnet18", 1)])
def test_split_plans_through_the_cuda_executor_equal_eager(name, batch):
    """Batch and row instances captured into one CUDA graph, against eager PyTorch (TF32 off)."""
    model, inputs, g = _zoo_graph(name, batch)
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        module = opsched.optimize_graph(opsched.place(g, "cuda", "float32"), device="cuda", scheduler="graphturbo",
                                        cost="analytic", check=False, hierarchy=SMALL_GPU, split_when="fits")
        assert module.schedule.splits and "captured into one CUDA graph" in module.executor.describe()
        xs = [t.cuda() for t in inputs]
        with torch.no_grad():
            torch.testing.assert_close(module(*xs), model.cuda()(*xs), atol=ATOL, rtol=ATOL)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_row_split_plan_on_inductor_segments_equals_eager_and_compiles_each_segment_once():
    model, inputs, g = _zoo_graph("squeezenet1_1", 1)
    s = schedule(g, "graphturbo", CPU, hierarchy=SMALL_CPU, max_lanes=2, split_when="fits")
    module = ScheduledModule(g, s, backend="inductor")
    compiled = counters["stats"]["unique_graphs"]
    with torch.no_grad():
        torch.testing.assert_close(module(*inputs), model(*inputs), atol=ATOL, rtol=ATOL)
    # each segment was compiled on what its producer gives (a band of rows is a view, Inductor's
    # convolutions write channels-last), so the first call compiles none again
    assert counters["stats"]["unique_graphs"] == compiled


def test_row_split_schedule_travels_as_json(tmp_path):
    model, inputs, g = _zoo_graph("resnet18", 1)
    s = schedule(g, "graphturbo", CPU, hierarchy=SMALL_CPU, max_lanes=2, split_when="fits")
    s.save(tmp_path / "s.json")
    assert {d.get("axis") for d in json.loads((tmp_path / "s.json").read_text())["splits"]} == {2}
    loaded = Schedule.load(tmp_path / "s.json")
    assert loaded.splits == s.splits and "ways along the rows" in str(loaded)
    assert s.stats["row splits"] == len(s.splits)


def test_split_schedule_travels_as_json_and_refuses_another_graph(tmp_path):
    model, inputs, g = _zoo_graph("resnet18", 4)
    s = schedule(g, "graphturbo", CPU, max_lanes=2, split_when="fits")
    path = tmp_path / "s.json"
    s.save(path)
    assert json.loads(path.read_text())["splits"][0]["factor"] in (2, 4)
    loaded = Schedule.load(path)
    assert loaded.splits == s.splits and "split" in str(loaded)
    module = opsched.load(model, path, inputs, backend="torch")
    with torch.no_grad():
        torch.testing.assert_close(module(*inputs), model(*inputs), atol=ATOL, rtol=ATOL)
    with pytest.raises(ScheduleMismatchError):
        loaded.validate(_zoo_graph("resnet18", 2)[2])


def test_optimize_races_the_split_plan_at_a_batch(tmp_path):
    model, inputs, _ = _zoo_graph("squeezenet1_1", 4)
    module = opsched.optimize(model, inputs, cache_dir=str(tmp_path), budget_s=5)
    race = module.outcome.race
    assert race is not None and "graphturbo" in race.times_ms and "sequential" in module.outcome.contenders
    assert module.schedule.scheduler == race.kept.removesuffix(" on torch").removesuffix(" on 1 core")
    with torch.no_grad():
        torch.testing.assert_close(module(*inputs), model(*inputs), atol=ATOL, rtol=ATOL)

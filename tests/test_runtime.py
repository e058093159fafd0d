"""Plans and the CPU executor: every scheduler on every zoo model equals eager PyTorch."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch import nn

import opsched
from opsched.backends import get_backend
from opsched.backends.affinity import worker_affinities
from opsched.backends.ort import ort_available
from opsched.cost import AnalyticCostModel
from opsched.costing import host_cpu_model
from opsched.errors import (
    ExecutionError,
    InputMismatchError,
    InvalidScheduleError,
    OpschedError,
    ScheduleError,
    ScheduleMismatchError,
)
from opsched.execution import RunOptions
from opsched.ir import GraphBuilder, random_inputs
from opsched.models import example_inputs, get_model, list_models
from opsched.runtime.plan import lower
from opsched.schedule import Schedule
from opsched.schedulers import schedule
from opsched.testing import assert_close, fork_join, random_dag

CPU = host_cpu_model()


def from_torch_zoo(name: str):  # type: ignore[no-untyped-def]
    return opsched.from_torch(get_model(name), example_inputs(name))
SLOW_SEARCH = {"randwire_large": 5.0, "nasnet_large": 5.0, "nasnet_mobile": 5.0}


@pytest.mark.parametrize("backend", ["torch", "ort"])
@pytest.mark.parametrize("scheduler", ["sequential", "greedy", "ios", "est"])
@pytest.mark.parametrize("name", list_models())
def test_every_scheduler_on_every_zoo_model_equals_eager(zoo_case: Callable[[str], Any], name: str, scheduler: str,
                                                         backend: str) -> None:
    """Each model traced once (test_zoo checks the trace; here, what is made of it)."""
    _, inputs, expected, graph = zoo_case(name)
    options = {"budget_s": SLOW_SEARCH[name]} if scheduler == "ios" and name in SLOW_SEARCH else {}
    module = opsched.optimize_graph(graph, cost=CPU, scheduler=scheduler, backend=backend, **options)
    assert module.backend.name == backend
    assert_close(module(*inputs), expected, f"{name} / {scheduler} / {backend}")


def test_merge_stages_lower_to_one_step_and_run() -> None:
    model, inputs = get_model("inception_v3"), example_inputs("inception_v3")
    with torch.no_grad():
        expected = model(*inputs)
    module = opsched.optimize(model, inputs, cost=opsched.cost.AnalyticCostModel("V100"), verify=False)
    merges = [s for s in module.schedule.stages if s.strategy == "merge"]
    steps = [st for st in module.plan.steps if st.op == "conv2d(merged)"]
    assert merges and len(steps) == len(merges) and all(len(st.outputs) >= 2 for st in steps)
    assert_close(module(*inputs), expected)


def test_plan_phases_and_frees() -> None:
    g = random_dag(10, 7, edge_prob=0.3)
    sched = schedule(g, "greedy", CPU, max_lanes=3)
    plan = lower(g, sched)
    multi = [s for s in sched.stages if len(s.groups) > 1]
    assert len([p for p in plan.phases if len(p.lanes) > 1]) == len(multi)
    assert sorted(s for p in plan.phases for lane in p.lanes for s in lane) == list(range(len(plan.steps)))
    freed = [slot for p in plan.phases for slot in p.frees] + [f for st in plan.steps for f in st.frees]
    assert len(freed) == len(set(freed)) and not set(freed) & set(plan.output_slots)
    # every intermediate is freed, and never read after it is freed
    produced = {o for st in plan.steps for o in st.outputs}
    assert produced - set(plan.output_slots) <= set(freed) | set(plan.output_slots)
    for k, phase in enumerate(plan.phases):
        later = {i for p in plan.phases[k + 1:] for lane in p.lanes for s in lane for i in plan.steps[s].inputs}
        assert not set(phase.frees) & later
        for lane in phase.lanes:
            for pos, s in enumerate(lane):
                after = {i for t in lane[pos + 1:] for i in plan.steps[t].inputs}
                others = {i for other in phase.lanes if other is not lane for t in other for i in plan.steps[t].inputs}
                assert not set(plan.steps[s].frees) & (after | others | later)


def test_a_value_read_by_two_lanes_then_one_is_freed_after_its_last_reader() -> None:
    """``a`` is read by both lanes of a phase, then by ``d`` in a one-lane stretch that runs on
    into ``e``: it is dead once ``d`` has run (the phase of two lanes is over by then), so ``d``
    frees it, not the end of the stretch."""
    from opsched.schedule import Stage

    b = GraphBuilder("two_then_one")
    x = b.input("x", (1, 8))
    a = b.add("relu", [x], name="a")
    left, right = b.add("relu", [a], name="b"), b.add("sigmoid", [a], name="c")
    d = b.add("add", [a, left], name="d")
    e = b.add("add", [b.add("relu", [d], name="e0"), right], name="e")
    g = b.build([e])
    stages = [Stage((("a",),)), Stage((("b",), ("c",))), Stage((("d",),)), Stage((("e0",), )), Stage((("e",),))]
    plan = lower(g, Schedule.from_stages(g.structural_hash(), stages))
    slot = plan.slot_names.index("a")
    (d_step,) = [st for st in plan.steps if st.label == "d"]
    assert slot in d_step.frees and not any(slot in p.frees for p in plan.phases)
    assert [len(p.lanes) for p in plan.phases] == [1, 2, 1]  # d, e0 and e: one stretch
    x_in = torch.randn(1, 8)
    assert_close(opsched.ScheduledModule(g, Schedule.from_stages(g.structural_hash(), stages), backend="torch")(x_in),
                 [(torch.relu(torch.relu(x_in) + torch.relu(torch.relu(x_in))) + torch.sigmoid(torch.relu(x_in)))])


def test_sequential_plan_frees_as_it_goes() -> None:
    g = from_torch_zoo("googlenet")
    plan = lower(g, schedule(g, "sequential", CPU))
    sizes = [g.types[name].nbytes for name in plan.slot_names]
    everything = sum(sizes)
    assert plan.peak_bytes(sizes) < everything / 4  # a chain of blocks never needs all activations at once


@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_lane_schedule_executes_with_cross_lane_waits(backend: str) -> None:
    g = random_dag(12, 3, edge_prob=0.35)
    names = [n.name for n in g.nodes]
    lanes = (tuple(names[0::2]), tuple(names[1::2]))  # topological within each lane
    sched = Schedule(g.structural_hash(), lanes, graph_name=g.name).validate(g)
    plan = lower(g, sched)
    assert plan.max_lanes == 2 and any(step.waits for step in plan.steps)
    phase_of = {s: k for k, p in enumerate(plan.phases) for lane in p.lanes for s in lane}
    assert all(phase_of[w] == phase_of[s] for s, step in enumerate(plan.steps) for w in step.waits)
    x = torch.randn(g.inputs[0].type.shape)
    assert_close(get_backend(backend).prepare(g, plan, RunOptions())([x]), opsched.run_graph(g, [x]))


def test_concurrent_calls_on_one_module() -> None:
    model, inputs = get_model("googlenet"), example_inputs("googlenet", batch=1)
    module = opsched.optimize(model, inputs, cost=CPU, scheduler="greedy")
    xs = [torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    with torch.no_grad():
        expected = [model(x) for x in xs]
    results: dict[int, torch.Tensor] = {}
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            for _ in range(2):
                results[i] = module(xs[i])
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, e in enumerate(expected):
        assert_close(results[i], e, f"call {i}")



def test_searches_in_several_threads_measure_the_machine_one_at_a_time(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    """Two threads' optimize_graph() with measured costs, each its own profile store: every
    timed stretch (a stage's profile, the race) of one lies outside every one of the other's,
    so neither times plans under the other's load and keeps those times. A search within a
    Dynamo compile (a user's own torch.compile backend that calls opsched) goes on at once
    where another holds the machine: that one may wait for Dynamo's compile lock."""
    import opsched.backends.base
    import opsched.race
    from opsched import timing

    stretches: list[tuple[str, float, float]] = []

    def recorded(interleave: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return interleave(*args, **kwargs)
            finally:
                stretches.append((threading.current_thread().name, start, time.perf_counter()))
        return timed

    for module in (opsched.backends.base, opsched.race):
        monkeypatch.setattr(module, "interleave", recorded(module.interleave))
    errors: list[BaseException] = []

    def search(k: int) -> None:
        try:
            opsched.optimize_graph(random_dag(8, seed=k), backend="torch", cache_dir=str(tmp_path / str(k)))
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=search, args=(k,), name=f"search{k}") for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors and not any(t.is_alive() for t in threads)
    assert {name for name, _, _ in stretches} == {"search0", "search1"}
    for a, a0, a1 in stretches:
        for b, b0, b1 in stretches:
            assert a == b or a1 <= b0 or b1 <= a0, f"{a} timed {a0:.3f}-{a1:.3f} while {b} timed {b0:.3f}-{b1:.3f}"

    from torch._dynamo.convert_frame import compile_lock

    done = threading.Event()

    def within_a_compile() -> None:
        with compile_lock:
            opsched.optimize_graph(random_dag(6, seed=3), backend="torch", cost="analytic")
        done.set()

    with timing.alone("a search in this thread") as held:
        assert held
        thread = threading.Thread(target=within_a_compile)
        thread.start()
        assert done.wait(timeout=120), "a search within a Dynamo compile waited for the machine"
    thread.join()

    reported: list[tuple[str, int, int]] = []

    def phase(name: str) -> Callable[[int, int, str], None]:
        return lambda done, total, _: reported.append((name, done, total))

    with timing.alone("a search in this thread"):  # one outside a compile waits, and its progress says so
        thread = threading.Thread(target=lambda: opsched.optimize_graph(random_dag(6, seed=4), cost="analytic",
                                                                        progress=phase))
        thread.start()
        deadline = time.monotonic() + 120
        while not reported and time.monotonic() < deadline:
            time.sleep(0.05)
        assert reported == [("waiting for another thread's search", 0, 1)] and thread.is_alive()
    thread.join()
    assert reported[1] == ("waiting for another thread's search", 1, 1)


@pytest.mark.parametrize("backend", ["torch", "ort"])
def test_concurrent_calls_of_a_plan_whose_worker_lanes_wait_on_each_other_all_finish(backend: str) -> None:
    """Two lanes run by workers, one waiting for the other: calls sharing one crew of workers could
    each hold a worker waiting for a lane queued behind the other's, and hang."""
    g = random_dag(40, 3, edge_prob=0.3)
    names = [n.name for n in g.nodes]
    sched = Schedule(g.structural_hash(), tuple(tuple(names[k::5]) for k in range(5)), graph_name=g.name).validate(g)
    plan = lower(g, sched)
    lane_of = {s: k for p in plan.phases for k, lane in enumerate(p.lanes) for s in lane}
    assert any(lane_of[s] and lane_of[w] and lane_of[w] != lane_of[s]
               for s, step in enumerate(plan.steps) for w in step.waits)  # a worker lane waits for another
    executor = get_backend(backend).prepare(g, plan, RunOptions())
    xs = [torch.randn(g.inputs[0].type.shape, generator=torch.Generator().manual_seed(i)) for i in range(8)]
    expected = [opsched.run_graph(g, [x]) for x in xs]
    wrong: list[int] = []
    errors: list[BaseException] = []

    def caller(i: int) -> None:
        try:
            for _ in range(25):
                if not torch.allclose(executor([xs[i]])[0], expected[i][0], rtol=1e-4, atol=1e-5):
                    wrong.append(i)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(len(xs))]
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads taking turns between any two bytecodes: calls' submissions interleave
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
    finally:
        sys.setswitchinterval(switching)
    try:
        assert not [t for t in threads if t.is_alive()], "calls hung"
        assert not errors and not wrong
    finally:
        if not any(t.is_alive() for t in threads):
            executor.close()

def test_a_plan_of_lanes_leaves_torchs_thread_count_as_the_caller_set_it_whatever_calls_overlap() -> None:
    """A phase of k lanes gives each lane cores // k of torch's threads (a process-wide count):
    each call put back the count its executor was made with, undoing what the caller set since,
    and calls that overlap must not leave one call's lane count behind."""
    g = random_dag(16, 3, edge_prob=0.3)
    names = [n.name for n in g.nodes]
    plan = lower(g, Schedule(g.structural_hash(), (tuple(names[0::2]), tuple(names[1::2])),
                             graph_name=g.name).validate(g))
    executor = get_backend("torch").prepare(g, plan, RunOptions(cores=2))
    x = torch.randn(g.inputs[0].type.shape)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(3)  # the caller's choice, made after the executor
        executor([x])
        assert torch.get_num_threads() == 3
        threads = [threading.Thread(target=lambda: [executor([x]) for _ in range(20)]) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert torch.get_num_threads() == 3
    finally:
        torch.set_num_threads(before)
        executor.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_forked_process_runs_a_plan_of_several_lanes_its_parent_ran() -> None:
    """A server forking its workers from a parent that loaded (and called) the model: the lanes'
    workers are not in the child, which makes its own. (On ONNX Runtime: torch's OpenMP pool is
    not fork-safe, and eager SqueezeNet hung in such a child too.)"""
    g = random_dag(12, 3, edge_prob=0.35)
    names = [n.name for n in g.nodes]
    plan = lower(g, Schedule(g.structural_hash(), (tuple(names[0::2]), tuple(names[1::2])),
                             graph_name=g.name).validate(g))
    assert plan.max_lanes == 2
    executor = get_backend("ort").prepare(g, plan, RunOptions())
    x = torch.randn(g.inputs[0].type.shape)
    expected = opsched.run_graph(g, [x])
    assert_close(executor([x]), expected)  # the parent's crew made and used
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports by its exit status
        signal.alarm(60)
        ok = False
        try:
            ok = all(torch.allclose(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(executor([x]), expected))
        finally:
            os._exit(0 if ok else 1)
    deadline = time.monotonic() + 90
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 0, "the child hung or computed otherwise"
    executor.close()


def test_save_load_round_trip_and_mismatch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model, inputs = get_model("squeezenet1_1"), example_inputs("squeezenet1_1")
    module = opsched.optimize(model, inputs, cost=CPU)
    module.save(tmp_path / "s.json")
    again = opsched.load(model, tmp_path / "s.json", inputs)
    assert again.schedule == module.schedule
    assert_close(again(*inputs), module(*inputs))
    with pytest.raises(ScheduleMismatchError, match=r"with inputs x f32\[1,3,224,224\], not for 'SqueezeNet', whose "
                                                    r"inputs are x f32\[2,3,224,224\]"):
        opsched.load(model, tmp_path / "s.json", example_inputs("squeezenet1_1", batch=2))
    with pytest.raises(ScheduleMismatchError, match="the inputs are alike, but the operators differ"):
        opsched.load(get_model("squeezenet1_0"), tmp_path / "s.json", inputs)


def test_a_schedule_retargets_to_other_shapes_of_its_model_and_no_other(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model, inputs = get_model("squeezenet1_1"), example_inputs("squeezenet1_1")
    made = opsched.optimize(model, inputs, cost=CPU, scheduler="greedy", verify=False)
    made.save(tmp_path / "s.json")
    for batch, size in ((2, 224), (1, 160)):
        x = torch.randn(batch, 3, size, size)
        moved = opsched.load(model, tmp_path / "s.json", x, retarget=True, verify=True)
        assert moved.schedule.lanes == made.schedule.lanes and moved.schedule.barriers == made.schedule.barriers
        assert moved.schedule.batch == batch and moved.schedule.estimated_ms is None  # priced for the other shape
        with torch.no_grad():
            assert_close(moved(x), model(x), f"batch {batch} at {size}")
    with pytest.raises(InvalidScheduleError, match="which is not a node of graph"):
        opsched.load(get_model("googlenet"), tmp_path / "s.json", example_inputs("googlenet"), retarget=True)


def test_bad_calls_and_options() -> None:
    model, inputs = get_model("squeezenet1_1"), example_inputs("squeezenet1_1")
    module = opsched.optimize(model, inputs, cost=CPU)
    with pytest.raises(InputMismatchError, match="expected f32\\[1,3,224,224\\]"):
        module(torch.randn(1, 3, 200, 200))
    with pytest.raises(InputMismatchError, match="float64"):
        module(inputs[0].double())
    with pytest.raises(InputMismatchError, match=r"must be a tensor, got ndarray \(torch.from_numpy\(array\)"):
        module(inputs[0].numpy())
    graph_module = opsched.optimize_graph(module.graph, cost=CPU)  # called by the graph's input names
    with pytest.raises(InputMismatchError, match=r"must be a tensor, got ndarray \(torch.from_numpy\(array\)"):
        graph_module(inputs[0].numpy())
    with pytest.raises(InputMismatchError, match=r"SqueezeNet fails on the example inputs \(\w+ \[1, 3, 224\] "
                                                 r"float32\): \w+Error: .*; give inputs the model takes"):
        opsched.optimize(model, torch.randn(1, 3, 224), cost=CPU)  # the model's own error, said as ours
    assert module.to("cpu") is module and module.float() is module  # where it is, as it is
    with pytest.raises(OpschedError, match=r"runs on cpu in float32, .*for cpu in float16, optimize the model again "
                                           r"with device='cpu', dtype='float16'"):
        module.half()
    with pytest.raises(OpschedError, match="for cpu in float64"):
        nn.Sequential(module).to(torch.float64)  # as a submodule of the caller's model
    with pytest.raises(OpschedError, match="device 'tpu' is not supported"):
        opsched.optimize(model, inputs, device="tpu")
    with pytest.raises(OpschedError, match="cost must be"):
        opsched.optimize(model, inputs, cost="psychic")


def test_tracers_are_refused_for_no_tracer_sees_into_a_plan_but_torch_compile_runs_it_between_graphs() -> None:
    """torch.jit.trace of a scheduled module made a module that returned the traced call's outputs
    for every input (ONNX Runtime's outputs became constants; it warned of a NumPy conversion)."""
    model, inputs = get_model("squeezenet1_1"), example_inputs("squeezenet1_1")
    module = opsched.optimize(model, inputs, cost=CPU)
    why = "cannot trace this scheduled module of 'SqueezeNet': its plan runs on ort's kernels"
    with pytest.raises(OpschedError, match=f"torch.jit.trace {why}"):
        torch.jit.trace(module, tuple(inputs))
    with pytest.raises(OpschedError, match=f"torch.fx {why}"):
        torch.fx.symbolic_trace(module)
    with pytest.raises(OpschedError, match=f"torch.export {why}"):
        torch.export.export(module, tuple(inputs))
    outer = nn.Sequential(module, nn.Linear(1000, 10)).eval()
    with torch.no_grad():
        expected = nn.Sequential(model, outer[1])(*inputs)
        assert_close(torch.compile(outer, backend="eager")(*inputs), expected)
    assert_close(module(*inputs), model(*inputs))  # called again as it was


def test_ort_backend_runs_opaque_steps_with_torch() -> None:
    b = GraphBuilder("g")
    x = b.input("x", (1, 4, 6, 6))
    w = b.param("w", torch.randn(4, 4, 3, 3))
    c = b.add("conv2d", [x], params=[w], padding=1, act="relu")
    o = b.add("opaque", [c], name="cum", out=b.type(c), fn=lambda t: torch.cumsum(t, 1), target="cumsum")
    g = b.build([b.add("conv2d", [o], params=[w], padding=1)])
    plan = lower(g, schedule(g, "sequential", CPU))
    executor = get_backend("ort").prepare(g, plan, RunOptions())
    kinds = [it.op for lane in executor.program.phases[0] for it in lane]  # type: ignore[attr-defined]
    assert kinds == ["onnxruntime[1 steps]", "opaque", "onnxruntime[1 steps]"]
    xin = torch.randn(1, 4, 6, 6)
    assert_close(executor([xin]), opsched.run_graph(g, [xin]))


def test_kernel_failure_names_the_node() -> None:
    b = GraphBuilder("g")
    x = b.input("x", (1, 4))

    def broken(t: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("boom")

    y = b.add("opaque", [x], name="bad", out=b.type(x), fn=broken, target="broken")
    g = b.build([b.add("relu", [y])])
    sched = schedule(g, "sequential", CPU)
    with pytest.raises(ExecutionError, match="node 'bad' \\(opaque\\) failed: RuntimeError: boom"):
        get_backend("torch").prepare(g, lower(g, sched), RunOptions())([torch.randn(1, 4)])


def test_multiple_outputs_come_back_as_a_tuple() -> None:
    class Two(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = nn.Conv2d(3, 4, 1), nn.Conv2d(3, 5, 3, padding=1)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.a(x), self.b(x)

    model, x = Two().eval(), torch.randn(1, 3, 8, 8)
    out = opsched.optimize(model, x, cost=CPU)(x)
    assert isinstance(out, tuple) and len(out) == 2
    with torch.no_grad():
        assert_close(list(out), list(model(x)))


def test_measured_cost_model_and_store(tmp_path) -> None:  # type: ignore[no-untyped-def]
    graph = from_torch_zoo("squeezenet1_1")
    # check=False: compare the searched schedules (the end-to-end race may pick either plan)
    first = opsched.api.optimize_graph(graph, cost="measured", cache_dir=str(tmp_path), check=False)
    counts = first.outcome.measurements
    assert counts is not None and counts.timed > 0 and counts.reused == 0
    second = opsched.api.optimize_graph(graph, cost="measured", cache_dir=str(tmp_path), check=False)
    again = second.outcome.measurements
    assert again is not None and again.timed == 0 and again.reused > 0
    assert second.schedule.stages == first.schedule.stages


def test_optimize_never_returns_a_plan_slower_than_sequential_or_torchs_kernels_in_its_race(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """On a CPU the sequential plan on torch's kernels (eager PyTorch's, op by op) races too:
    where ONNX Runtime's lose, the module stays as fast as eager."""
    model, inputs = get_model("squeezenet1_1"), example_inputs("squeezenet1_1")
    module = opsched.optimize(model, inputs, cost="measured", cache_dir=str(tmp_path))
    race = module.outcome.race
    one_core = {"sequential on 1 core"} if torch.get_num_threads() > 1 else set()
    assert race is not None and module.outcome.contenders == {"ios", "sequential", "sequential on torch", *one_core}
    assert set(module.outcome.same_plan) <= {"sequential"}  # where ios's plan is the sequential one, raced once
    assert race.kept == race.standings.fastest and race.relative[race.kept] == 1.0
    on_torch = race.kept == "sequential on torch"
    assert race.kept.removesuffix(" on torch").removesuffix(" on 1 core") == module.schedule.scheduler
    assert (module.backend.name == "torch") == on_torch
    assert (module.schedule.cores == 1) == (race.kept == "sequential on 1 core")
    assert f"end-to-end check: {race}" in str(module.report())


@pytest.mark.skipif(torch.get_num_threads() < 2 or not ort_available(), reason="one core, or no onnxruntime")
def test_a_plan_on_one_core_runs_its_session_on_one_thread_and_saves_and_loads_so(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A schedule that says it runs on one core (what optimize()'s race keeps where a small model's
    one ONNX Runtime session runs fastest so) builds its session on one intra-op thread, computes
    what the model computes, and keeps its cores through save and load; one that asks for more
    cores than torch is given runs on those torch has."""
    model, inputs = get_model("squeezenet1_1").eval(), example_inputs("squeezenet1_1")
    module = opsched.optimize(model, inputs, cost="analytic", scheduler="sequential")
    assert module.schedule.cores is None and module.run.cores is None
    one = opsched.ScheduledModule(module.graph, dataclasses.replace(module.schedule, cores=1), backend="ort")
    assert one.run.cores == 1 and one.executor.describe().endswith("on 1 core")
    session = next(s for s in one.executor.program.sessions if s is not None)
    assert session.get_session_options().intra_op_num_threads == 1
    with torch.no_grad():
        assert_close(one(*inputs), model(*inputs))
    one.save(tmp_path / "one.json")
    assert json.loads((tmp_path / "one.json").read_text())["cores"] == 1
    loaded = opsched.load(model, tmp_path / "one.json", inputs)
    assert loaded.schedule.cores == 1 and loaded.run.cores == 1 and "on 1 core" in str(loaded.schedule)
    many = opsched.ScheduledModule(module.graph, dataclasses.replace(module.schedule, cores=10_000), backend="ort")
    assert many.run.cores == torch.get_num_threads()


def test_plans_race_on_every_backend_named_and_the_kept_one_loads_onto_its_own(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """backend=("ort", "torch"): the plan is made for ONNX Runtime and races there and on torch's
    kernels; the one kept names its backend in its schedule, so it saves and loads onto it, and
    computes what the model does."""
    model, inputs = get_model("squeezenet1_1").eval(), example_inputs("squeezenet1_1")
    module = opsched.optimize(model, inputs, cost="analytic", backend=("ort", "torch"))
    race = module.outcome.race
    assert race is not None and module.outcome.contenders == {"ios", "ios on torch"}
    assert race.kept == race.standings.fastest
    assert module.backend.name == ("torch" if race.kept == "ios on torch" else "ort")
    module.save(tmp_path / "kept.json")
    loaded = opsched.load(model, tmp_path / "kept.json", inputs)
    assert loaded.backend.name == module.backend.name
    with torch.no_grad():
        assert_close([loaded(*inputs), module(*inputs)], [model(*inputs)] * 2)
    for named, said in [(("ort", "ort"), "'ort' named twice"), ((), "name at least one backend"),
                        (("ort", "tpu"), "no backend 'tpu'")]:
        with pytest.raises(OpschedError, match=said):
            opsched.optimize(model, inputs, cost="analytic", backend=named)


def test_a_plan_kept_on_torchs_kernels_loads_on_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A schedule whose lanes name a backend runs there under backend="auto", so the plan that won
    optimize()'s race on torch's kernels saves and loads as it was kept; an ONNX file's graph
    (whose generic nodes torch runs as one-node sessions) and an analytic search race no such plan."""
    model, inputs = get_model("squeezenet1_1"), example_inputs("squeezenet1_1")
    graph = opsched.from_torch(model, inputs)
    kept = schedule(graph, "sequential", CPU).on_backend("torch")
    module = opsched.ScheduledModule(graph, kept)
    assert module.backend.name == "torch"
    module.save(tmp_path / "kept.json")
    loaded = opsched.load(model, tmp_path / "kept.json", inputs)
    assert loaded.backend.name == "torch"
    assert opsched.load(model, tmp_path / "kept.json", inputs, backend="torch").backend.name == "torch"
    with pytest.raises(OpschedError, match="places a lane on the module device with backend torch"):
        opsched.load(model, tmp_path / "kept.json", inputs, backend="ort")
    with torch.no_grad():
        assert_close([loaded(*inputs)], [model(*inputs)])
    analytic = opsched.optimize(model, inputs, cost="analytic", scheduler=("ios", "sequential"))
    assert analytic.outcome.contenders == {"ios", "sequential"}
    from onnx import TensorProto, helper

    erf = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Erf", ["r"], ["y"])], "erf",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])]), opset_imports=[helper.make_opsetid("", 17)])
    from_file = opsched.optimize_graph(opsched.from_onnx(erf), cache_dir=str(tmp_path / "store"))
    one_core = {"sequential on 1 core"} if torch.get_num_threads() > 1 else set()  # its session on one thread
    assert from_file.outcome.contenders == {"ios", "sequential", *one_core}


def test_several_schedulers_race_and_the_fastest_plan_is_kept() -> None:
    model, inputs = get_model("googlenet").eval(), example_inputs("googlenet")
    # priced for a wide device, ios's stages and est's lanes differ (on this CPU's preset both are
    # one lane with the same merges: one plan, which would be raced once)
    module = opsched.optimize(model, inputs, cost=AnalyticCostModel("V100"), scheduler=("ios", "est"), budget_s=5,
                              max_lanes=2)
    race = module.outcome.race
    assert race is not None and set(race.times_ms) == {"ios", "est"}  # no sequential guard: analytic
    assert module.outcome.same_plan == {}
    assert race.kept == module.schedule.scheduler == race.standings.fastest
    with torch.no_grad():
        assert_close(module(*inputs), model(*inputs))
    (lost,) = module.outcome.searched  # the schedule that lost the race is summarised
    assert {lost.scheduler, race.kept} == {"ios", "est"} and lost.search
    assert f"searched schedule ({lost.scheduler}, lost the race)" in str(module.report())


def test_options_go_to_the_schedulers_that_take_them() -> None:
    graph = from_torch_zoo("squeezenet1_1")
    sched = opsched.api.optimize_graph(graph, cost=CPU, scheduler=["est", "ios"], max_lanes=1, max_group_size=1,
                                       check=False).schedule
    assert sched.options["max_lanes"] == 1 and sched.options.get("max_group_size", 1) == 1
    with pytest.raises(ScheduleError, match=r"no scheduler of \['ios'\] has option 'merge' \(ios takes"):
        opsched.api.optimize_graph(graph, cost=CPU, scheduler="ios", merge=False)
    with pytest.raises(ScheduleError, match="'max_groups' \\(renamed 'max_lanes'\\)"):
        opsched.api.optimize_graph(graph, cost=CPU, scheduler="ios", max_groups=2)
    with pytest.raises(ScheduleError, match="option max_part_size of scheduler 'ios' must be positive"):
        opsched.api.optimize_graph(graph, cost=CPU, scheduler="ios", max_part_size=0)
    with pytest.raises(ScheduleError, match=r"max_lanes of scheduler 'est' must be int \| None, got '2' \(str\)"):
        opsched.api.optimize_graph(graph, cost=CPU, scheduler="est", max_lanes="2")
    with pytest.raises(ScheduleError, match="no scheduler 'iso' \\(did you mean 'ios'\\?\\)"):
        opsched.api.optimize_graph(graph, cost=CPU, scheduler="iso")
    with pytest.raises(ScheduleError, match="name at least one scheduler"):
        opsched.api.optimize_graph(graph, cost=CPU, scheduler=[])
    with pytest.raises(ScheduleError, match="'kwargs' holds tensors, but a model's inputs go in example_inputs"):
        opsched.optimize(torch.nn.Linear(4, 4), kwargs={"input": torch.randn(1, 4)})  # checked before inputs


@pytest.mark.skipif(not ort_available(), reason="needs onnxruntime")
def test_ort_profile_shows_each_kernel_under_its_step() -> None:
    g = random_dag(10, 7, edge_prob=0.3)
    sched = schedule(g, "greedy", CPU, max_lanes=2)
    module = opsched.ScheduledModule(g, sched, backend="ort")
    events = module.profile(torch.randn(g.inputs[0].type.shape))
    labels = {st.label: st.op for st in module.plan.steps}
    kernels = [e for e in events if e.op != "layout"]
    assert kernels and all(e.label in labels and e.op == labels[e.label] for e in kernels)  # every kernel owned
    assert {e.label for e in kernels} >= {st.label for st in module.plan.steps if st.op == "conv2d"}
    for lane in {e.lane for e in events}:  # one lane runs one kernel at a time
        spans = sorted((e.start_ms, e.end_ms) for e in events if e.lane == lane)
        assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:]))
    assert max(e.lane for e in events) == module.plan.max_lanes - 1


def test_profile_records_every_item_on_its_lane() -> None:
    g = random_dag(10, 7, edge_prob=0.3)
    module = opsched.ScheduledModule(g, schedule(g, "greedy", CPU, max_lanes=3), backend="torch")
    events = module.profile(torch.randn(g.inputs[0].type.shape))
    assert sorted(e.label for e in events) == sorted(st.label for st in module.plan.steps)
    assert max(e.lane for e in events) == module.plan.max_lanes - 1
    assert all(0 <= e.start_ms <= e.end_ms for e in events)
    phases = [e.phase for e in sorted(events, key=lambda e: e.start_ms)]
    assert phases == sorted(phases)  # phases never overlap: each ends with a barrier


def test_optimize_graph_from_onnx(tmp_path) -> None:  # type: ignore[no-untyped-def]
    model, inputs = get_model("googlenet"), example_inputs("googlenet")
    path = tmp_path / "g.onnx"
    torch.onnx.export(model, inputs, str(path), dynamo=False)
    module = opsched.api.optimize_graph(opsched.from_onnx(path), cost=CPU)
    with torch.no_grad():
        assert_close(module(*inputs), model(*inputs))


def test_lane_plans_split_into_phases_at_cuts() -> None:
    # x -> a -> {b, c} -> d: a and d are cuts; b and c run as a two-lane phase between them
    g = fork_join("a")
    plan = lower(g, Schedule(g.structural_hash(), (("a", "b", "d"), ("c",))))
    labels = [[[plan.steps[s].label for s in lane] for lane in p.lanes] for p in plan.phases]
    assert labels == [[["a"]], [["b"], ["c"]], [["d"]]]
    assert not any(step.waits for step in plan.steps)  # the phase boundaries carry every dependency
    xv = torch.randn(1, 4, 8, 8)
    assert_close(get_backend("torch").prepare(g, plan, RunOptions())([xv]), opsched.run_graph(g, [xv]))


@pytest.mark.parametrize("name", ["nimble", "opara"])
@pytest.mark.parametrize("model", ["googlenet", "nasnet_mobile", "randwire_small"])
def test_lane_baselines_execute_equal_to_eager(name: str, model: str) -> None:
    m, inputs = get_model(model), example_inputs(model)
    module = opsched.optimize(m, inputs, cost=CPU, scheduler=name, backend="torch", verify=False)
    assert module.plan.max_lanes >= 2
    with torch.no_grad():
        assert_close(module(*inputs), m(*inputs), f"{model} / {name}")


def test_tolerances_follow_the_reference_dtype_and_scale() -> None:
    from opsched.testing import tolerance

    assert tolerance(torch.tensor([0.5, -3.0])) == pytest.approx(3e-4)  # float32: 1e-4 of the scale
    assert tolerance(torch.tensor([0.5], dtype=torch.float16)) == pytest.approx(1e-2)  # scale at least 1
    assert tolerance(torch.tensor([2.0], dtype=torch.bfloat16)) == pytest.approx(0.1)
    double = torch.tensor([4.0], dtype=torch.float64)
    assert tolerance(double) == pytest.approx(4e-8)
    assert tolerance(double, {"float64", "int64"}) == pytest.approx(4e-8)
    assert tolerance(double, {"float64", "float32"}) == pytest.approx(4e-4)  # computed partly in float32
    assert tolerance(torch.tensor([True]), {"float16"}) == 0.0 and tolerance(torch.tensor([3]), {"float16"}) == 0.0


def test_differences_of_complex_outputs_count_both_parts() -> None:
    from opsched.testing import mismatch

    z = torch.tensor([1 + 2j, -3j])
    assert mismatch([z + 1e-3j], [z])  # the imaginary part alone differs
    assert not mismatch([z + 1e-5j], [z])
    assert mismatch([z.real], [z.real + 1e-2]) and not mismatch([z], [z.conj().conj()])


@pytest.mark.skipif(not ort_available(), reason="needs onnxruntime")
def test_only_a_module_that_is_one_ort_session_lets_its_threads_spin_and_only_within_a_run() -> None:
    """Spinning threads keep a core busy: only a plan of one session (nothing else of it needs
    the cores) spins, as ONNX Runtime's own sessions do, and its threads stop when a run returns
    (the caller's code needs the cores then: docs/results/spinning.md); executors built to
    measure stages never spin."""
    from opsched.backends.ort import OrtExecutor

    graph = from_torch_zoo("googlenet")

    def spins(executor: object, entry: str = "session.intra_op.allow_spinning") -> list[str]:
        def entry_of(options: Any) -> str:
            try:
                return str(options.get_session_config_entry(entry))
            except RuntimeError:  # not set
                return ""
        return [entry_of(s.get_session_options()) for s in executor.program.sessions]  # type: ignore[attr-defined]

    sequential = schedule(graph, "sequential", CPU)
    module = opsched.ScheduledModule(graph, sequential, backend="ort")
    assert spins(module._executor) == ["1"] and spins(module._executor, "session.force_spinning_stop") == ["1"]
    assert spins(OrtExecutor(graph, lower(graph, sequential))) == ["0"]  # as the measured cost model builds it
    lanes = spins(opsched.ScheduledModule(graph, schedule(graph, "greedy", CPU), backend="ort")._executor)
    assert len(lanes) > 1 and set(lanes) == {"0"}
    # the spinning session's workers pinned a physical core each (where there are workers and cores for
    # them); no other session's
    pinned = worker_affinities(torch.get_num_threads()) or ""
    assert spins(module._executor, "session.intra_op_thread_affinities") == [pinned]
    assert spins(OrtExecutor(graph, lower(graph, sequential)), "session.intra_op_thread_affinities") == [""]


def test_workers_are_pinned_one_physical_core_each_past_the_callers(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Hyper-threads of one core count once (the first of them); the first core is left to the
    caller; nothing is pinned without workers, without cores enough for them, or without a
    readable topology."""
    from opsched.backends import affinity

    for cpu, core in enumerate([0, 0, 1, 1, 2, 2]):  # three cores of two hyper-threads each
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "physical_package_id").write_text("0\n")
        (topology / "core_id").write_text(f"{core}\n")
    monkeypatch.setattr(affinity, "_TOPOLOGY", tmp_path)
    monkeypatch.setattr(affinity.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5})
    affinity.physical_cpus.cache_clear()
    try:
        assert affinity.physical_cpus() == (0, 2, 4)
        assert affinity.worker_affinities(3) == "3;5"  # 1-based logical processors, one worker a core
        assert affinity.worker_affinities(2) == "3"
        assert affinity.worker_affinities(1) is None and affinity.worker_affinities(4) is None
        monkeypatch.setattr(affinity.os, "sched_getaffinity", lambda pid: {2, 3, 4, 5})  # a cpuset without core 0
        affinity.physical_cpus.cache_clear()
        assert affinity.worker_affinities(2) == "5"
        monkeypatch.setattr(affinity, "_TOPOLOGY", tmp_path / "absent")
        affinity.physical_cpus.cache_clear()
        assert affinity.physical_cpus() == () and affinity.worker_affinities(2) is None
    finally:
        affinity.physical_cpus.cache_clear()


@pytest.mark.skipif(not ort_available(), reason="needs onnxruntime")
def test_a_plan_that_is_one_ort_session_is_called_directly_with_the_same_outputs() -> None:
    """Its untraced runs skip the slots (a tenth of a 0.1 ms model's time); a traced run, which
    goes through them, gives the same outputs, and so does a plan of several sessions."""
    from opsched.backends.ort import OrtExecutor

    graph = from_torch_zoo("googlenet")
    x = random_inputs(graph)
    one = OrtExecutor(graph, lower(graph, schedule(graph, "sequential", CPU)))
    several = OrtExecutor(graph, lower(graph, schedule(graph, "greedy", CPU)))
    assert one.program.direct is not None and one.sessions == 1
    assert several.program.direct is None and several.sessions > 1
    direct, slotted = one(x), one.run(x, trace=[])  # a traced run goes through the slots
    assert len(direct) == len(graph.outputs) and all(torch.equal(a, b) for a, b in zip(direct, slotted))
    assert_close(several(x), direct)


def test_plans_with_the_same_work_are_one_contender() -> None:
    """Two plans that run the same kernels the same way are one program; on a one-lane phase the
    order of its steps is not part of it, the lanes of a concurrent phase and their waits are."""
    from opsched.runtime.plan import plan_work
    from opsched.schedule import Stage

    graph = fork_join("x")
    h = graph.structural_hash()

    def work(*stages: Stage) -> object:
        return plan_work(lower(graph, Schedule.from_stages(h, stages)))
    serial = work(Stage((("a", "b", "c", "d"),)))
    assert work(Stage((("c", "a", "b", "d"),))) == serial  # one lane, another order
    assert work(Stage((("a",),)), Stage((("b", "c", "d"),))) == serial  # one-lane stages run as one phase
    concurrent = work(Stage((("a", "b"), ("c",))), Stage((("d",),)))
    assert concurrent != serial
    assert work(Stage((("c",), ("a", "b"))), Stage((("d",),))) == concurrent  # the same lanes, listed otherwise
    assert work(Stage((("a",), ("c",))), Stage((("b", "d"),))) != concurrent  # b moved off c's phase
    merged = work(Stage((("a",), ("c",)), "merge"), Stage((("b", "d"),)))
    assert merged != work(Stage((("a",), ("c",))), Stage((("b", "d"),)))  # one merged kernel is other work

    # the race: a chain's greedy plan is its sequential plan, so there is nothing to race
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU()).eval()
    x = torch.randn(1, 3, 16, 16)
    module = opsched.optimize(model, (x,), cost=CPU, scheduler=("sequential", "greedy"), backend="torch")
    assert module.schedule.scheduler == "sequential"
    assert module.outcome.same_plan == {"greedy": "sequential"} and module.outcome.race is None
    assert "greedy's plan was left out of the race: it runs as sequential's does" in str(module.report())
    with torch.no_grad():
        assert_close([module(x)], [model(x)])

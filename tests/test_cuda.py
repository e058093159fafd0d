"""The CUDA path: stream programs (checked on the CPU against stream semantics), the executor's
walk and capture fallback on a recording stand-in device, placement (precision, layout), and,
on a GPU, every zoo model through the CUDA executor against eager PyTorch."""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

from opsched import optimize
from opsched.backends.cuda_executor import CudaExecutor
from opsched.backends.cuda_inductor import CudaInductorExecutor
from opsched.backends.inductor import inductor_available
from opsched.cost.analytic import AnalyticCostModel
from opsched.frontends import from_torch
from opsched.ir import Graph, GraphBuilder, TensorType
from opsched.models import example_inputs, get_model, list_models
from opsched.runtime.plan import lower
from opsched.runtime.reference import run_graph
from opsched.runtime.stream_program import Launch, Record, Release, StreamProgram, Wait, stream_program
from opsched.schedule import Schedule
from opsched.schedulers import schedule
from opsched.testing import assert_close, check_stream_program, fork_join, random_dag, tf32_in_use
from opsched.transforms.place import dtype_name, place

SCHEDULERS = {"ios": {"budget_s": 5}, "est": {}, "opara": {}, "nimble": {}, "greedy": {}}


@pytest.fixture
def zoo(zoo_case: Any) -> Callable[[str], Graph]:
    """A zoo model's graph by name, traced once per test session."""
    return lambda name: zoo_case(name).graph


# --- stream programs -------------------------------------------------------------------------
@pytest.mark.parametrize("name", list_models())
@pytest.mark.parametrize("scheduler", list(SCHEDULERS))
def test_stream_programs_of_the_zoo_are_correct(zoo: Callable[[str], Graph], scheduler: str, name: str) -> None:
    graph = zoo(name)
    program = stream_program(lower(graph, schedule(graph, scheduler, AnalyticCostModel("V100"),
                                                   **SCHEDULERS[scheduler])))
    check_stream_program(program)


@pytest.mark.parametrize("seed", range(12))
def test_stream_programs_of_random_lane_schedules_are_correct(seed: int) -> None:
    graph = random_dag(14, seed, edge_prob=0.3)
    for scheduler, options in [("est", {"max_lanes": 1 + seed % 4}), ("nimble", {}), ("ios", {})]:
        check_stream_program(stream_program(lower(graph, schedule(graph, scheduler, AnalyticCostModel("H100"),
                                                                  **options))))


def _two_lane_program() -> StreamProgram:
    """fork_join: a -> (b, c) -> d with b and c on two lanes of one phase (c reads a)."""
    graph = fork_join()
    names = [n.name for n in graph.nodes]
    lanes = ((names[0], names[1], names[3]), (names[2],))
    sched = Schedule(graph.structural_hash(), lanes, graph_name=graph.name)
    return stream_program(lower(graph, sched))


def test_the_checker_catches_a_missing_wait_an_early_release_and_a_missing_join() -> None:
    """Every check of check_stream_program can fail: break a correct program three ways."""
    graph = random_dag(16, 3, edge_prob=0.4)
    program = stream_program(lower(graph, schedule(graph, "nimble", AnalyticCostModel("V100"))))
    check_stream_program(program)
    ops = list(program.ops)
    waits = [k for k, op in enumerate(ops) if isinstance(op, Wait) and op.stream != 0
             and not any(isinstance(o, Record) and o.stream == 0 and o.event == op.event for o in ops)]
    assert waits, "the program should wait across lanes"
    broken = dataclasses.replace(program, ops=tuple(op for k, op in enumerate(ops) if k != waits[0]))
    with pytest.raises(AssertionError, match="may run before"):
        check_stream_program(broken)
    joins = [k for k, op in enumerate(ops) if isinstance(op, Wait) and op.stream == 0]
    broken = dataclasses.replace(program, ops=tuple(op for k, op in enumerate(ops) if k != joins[-1]))
    with pytest.raises(AssertionError):
        check_stream_program(broken)
    # a release that the lowering deferred past the join, moved back before it
    deferred = next(k for k, op in enumerate(ops) if isinstance(op, Release) and k > joins[0])
    first_join = max(j for j in joins if j < deferred)
    moved = ops[:first_join - 1] + [ops[deferred]] + ops[first_join - 1:deferred] + ops[deferred + 1:]
    with pytest.raises(AssertionError, match="may still read it|released before"):
        check_stream_program(dataclasses.replace(program, ops=tuple(moved)))


def test_one_wait_per_dependency_the_streams_do_not_already_imply() -> None:
    """Lanes (a, s, out) and (p, q, r); q and r both read a: one wait (before q), none for r."""
    b = GraphBuilder("chain_reads")
    x = b.input("x", (1, 2, 4, 4))
    a = b.add("relu", [x], name="a")
    s = b.add("tanh", [a], name="s")
    p = b.add("sigmoid", [x], name="p")
    q = b.add("add", [a, p], name="q")
    r = b.add("add", [a, q], name="r")
    graph = b.build([b.add("add", [r, s], name="out")])
    sched = Schedule(graph.structural_hash(), (("a", "s", "out"), ("p", "q", "r")), graph_name=graph.name)
    program = stream_program(lower(graph, sched))
    check_stream_program(program)
    launches = {program.plan.steps[op.step].label: op.stream for op in program.ops if isinstance(op, Launch)}
    assert launches["a"] == 0 and launches["q"] == 1
    cross = [op for op in program.ops if isinstance(op, Wait) and op.stream == 1]
    assert len(cross) == 2  # the fork, and one wait for a (before q); r's read of a is implied
    assert program.counts()["wait"] == 3  # plus stream 0 waiting for lane 1 before "out" (no separate join)


def test_single_lane_plans_need_no_events() -> None:
    graph = random_dag(10, 1)
    program = stream_program(lower(graph, schedule(graph, "sequential", AnalyticCostModel("V100"))))
    assert program.n_streams == 1 and program.n_events == 0
    assert {type(op) for op in program.ops} <= {Launch, Release}


# --- the executor on a recording stand-in device -------------------------------------------------
class RecordingDevice:
    """A :class:`StreamDevice` whose streams run their work at once (in host order, which the
    stream program makes a valid order) and which records every stream operation."""

    def __init__(self, capture_fails: bool = False) -> None:
        self.log: list[tuple[str, int, int]] = []
        self.current = 0
        self.streams = 1
        self.capture_fails = capture_fails
        self.captures = 0

    def current_stream(self) -> int:
        return self.current

    def new_stream(self) -> int:
        self.streams += 1
        return self.streams - 1

    def set_stream(self, stream: int) -> None:
        self.current = stream

    def new_event(self, timing: bool = False) -> list[float]:
        return [0.0]

    def record(self, event: list[float], stream: int) -> None:
        event[0] = float(len(self.log))
        self.log.append(("record", stream, id(event)))

    def wait(self, stream: int, event: list[float]) -> None:
        self.log.append(("wait", stream, id(event)))

    def synchronize(self) -> None:
        pass

    def elapsed_ms(self, start: list[float], end: list[float]) -> float:
        return end[0] - start[0]

    def capture(self, run: Callable[[], list[torch.Tensor]], warmup: int) -> tuple[Callable[[], None],
                                                                                   list[torch.Tensor]]:
        if self.capture_fails:
            raise RuntimeError("operation not permitted when stream is capturing")
        self.captures += 1
        outputs = run()

        def replay() -> None:  # a replay recomputes into the same output buffers
            for o, n in zip(outputs, run()):
                o.copy_(n)
        return replay, outputs


def _executor(graph: Any, scheduler: str, device: RecordingDevice, **kw: Any) -> CudaExecutor:
    sched = schedule(graph, scheduler, AnalyticCostModel("V100"), **SCHEDULERS.get(scheduler, {}))
    return CudaExecutor(graph, lower(graph, sched), device="cpu", stream_device=device, **kw)


@pytest.mark.parametrize("name", ["inception_v3", "nasnet_mobile", "randwire_small"])
def test_executor_walk_matches_reference_and_program(zoo: Callable[[str], Graph], name: str) -> None:
    graph = zoo(name)
    x = example_inputs(name)
    expected = run_graph(graph, x)
    dev = RecordingDevice()
    ex = _executor(graph, "est", dev, graphs=False)
    assert_close(ex(x), expected)
    stream_ops = [op for op in ex.program.ops if isinstance(op, (Record, Wait))]
    assert [(kind, s) for kind, s, _ in dev.log] == [(type(op).__name__.lower(), op.stream) for op in stream_ops]
    assert dev.current == 0  # the caller's stream is current again


def test_capture_once_then_replay_with_static_buffers(zoo: Callable[[str], Graph]) -> None:
    graph = zoo("googlenet")
    dev = RecordingDevice()
    ex = _executor(graph, "opara", dev)
    x1, x2 = torch.randn(1, 3, 224, 224), torch.randn(1, 3, 224, 224)
    out1 = ex([x1])
    assert ex.captured and dev.captures == 1
    out2 = ex([x2])
    assert dev.captures == 1
    assert_close(out2, run_graph(graph, [x2]))
    assert_close(out1, run_graph(graph, [x1]))  # copy_outputs: the first result survives the replay
    shared = _executor(graph, "opara", RecordingDevice(), copy_outputs=False)
    first = shared([x1])
    second = shared([x2])
    assert first[0] is second[0]  # the graph's own output buffer, overwritten by the next call


def test_calls_from_several_threads_take_turns_on_the_captured_graph() -> None:
    """The captured graph's static buffers are one set: calls made at once each get their own
    input's outputs (a replay here recomputes on the host, so a call whose input another call
    overwrote between its copy and its replay would return the other's)."""
    graph = random_dag(16, 2, edge_prob=0.3)
    ex = _executor(graph, "est", RecordingDevice())
    xs = [torch.randn(graph.inputs[0].type.shape, generator=torch.Generator().manual_seed(i)) for i in range(6)]
    expected = [run_graph(graph, [x]) for x in xs]
    ex([xs[0]])  # captured
    wrong: list[int] = []

    def caller(i: int) -> None:
        for _ in range(10):
            if not all(torch.equal(a, b) for a, b in zip(ex([xs[i]]), expected[i])):
                wrong.append(i)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(xs))]
    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # threads taking turns between any two bytecodes
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switching)
    assert not wrong


def test_a_call_on_another_stream_first_waits_for_the_last_calls_stream() -> None:
    """The buffers a call overwrites may still be read by the last call's replay, on its stream."""
    graph = random_dag(10, 1)
    dev = RecordingDevice()
    ex = _executor(graph, "sequential", dev)  # one stream: the program records and waits for nothing
    x = [torch.randn(graph.inputs[0].type.shape)]
    ex(x)
    ex(x)
    assert dev.log == []
    dev.current = dev.new_stream()
    assert_close(ex(x), run_graph(graph, x))
    assert [(kind, stream) for kind, stream, _ in dev.log] == [("record", 0), ("wait", 1)]
    assert dev.log[0][2] == dev.log[1][2]  # on one event
    ex(x)
    assert len(dev.log) == 2  # the same stream again: no wait


def test_capture_failure_falls_back_to_eager_streams_and_says_why_once(zoo: Callable[[str], Graph],
                                                                       caplog: pytest.LogCaptureFixture) -> None:
    graph = zoo("squeezenet1_1")
    ex = _executor(graph, "nimble", RecordingDevice(capture_fails=True))
    x = example_inputs("squeezenet1_1")
    with caplog.at_level(logging.WARNING, logger="opsched.backends.cuda_executor"):
        for _ in range(3):
            assert_close(ex(x), run_graph(graph, x))
    assert not ex.captured and "not permitted when stream is capturing" in (ex.capture_error or "")
    assert sum("not captured" in r.message for r in caplog.records) == 1


def test_opaque_nodes_are_not_captured() -> None:
    b = GraphBuilder("with_opaque")
    x = b.input("x", (1, 4))
    y = b.add("opaque", [x], name="host_call", fn=lambda t: t.cumsum(-1), target="cumsum",
              out=TensorType((1, 4)))
    graph = b.build([b.add("relu", [y], name="out")])
    ex = _executor(graph, "sequential", RecordingDevice())
    assert "host_call" in (ex.capture_error or "")
    t = torch.randn(1, 4)
    assert_close(ex([t]), [t.cumsum(-1).relu()])


def test_trace_has_one_event_per_step_on_its_lane(zoo: Callable[[str], Graph]) -> None:
    graph = zoo("inception_v3")
    ex = _executor(graph, "est", RecordingDevice())
    trace = ex.trace(example_inputs("inception_v3"))
    assert sorted(e.label for e in trace) == sorted(s.label for s in ex.plan.steps)
    assert all(e.end_ms > e.start_ms for e in trace)
    lanes = {(s.label): (k, li) for k, ph in enumerate(ex.plan.phases) for li, lane in enumerate(ph.lanes)
             for s in (ex.plan.steps[i] for i in lane)}
    assert all(lanes[e.label] == (e.phase, e.lane) for e in trace)


def test_inputs_on_another_device_are_refused(zoo: Callable[[str], Graph]) -> None:
    from opsched.errors import InputMismatchError

    ex = CudaExecutor(zoo("squeezenet1_1"), lower(zoo("squeezenet1_1"), schedule(zoo("squeezenet1_1"), "sequential",
                                                                                AnalyticCostModel("V100"))),
                      device="cuda:0", stream_device=RecordingDevice())
    with pytest.raises(InputMismatchError, match="is on cpu; this module runs on cuda:0"):
        ex(example_inputs("squeezenet1_1"))


# --- Inductor-compiled segments on streams -----------------------------------------------------
@pytest.mark.skipif(inductor_available() is not None, reason=str(inductor_available()))
@pytest.mark.parametrize("name,scheduler", [("squeezenet1_1", "nimble"), ("random", "est")])
def test_inductor_segments_on_recorded_streams_equal_the_reference(name: str, scheduler: str) -> None:
    """The cuda-inductor executor's walk (segments compiled for this CPU, streams recorded): each
    lane cut into segments at the steps other streams wait on or for, each launched once, at its
    first step, on that step's stream; outputs equal the reference, captured and replayed."""
    graph = (random_dag(14, 3, edge_prob=0.3) if name == "random" else
             from_torch(get_model(name).eval(), example_inputs(name)))
    plan = lower(graph, schedule(graph, scheduler, AnalyticCostModel("V100"),
                                 **({"max_lanes": 3} if scheduler == "est" else {})))
    assert plan.max_lanes > 1 and any(step.waits for step in plan.steps)
    dev = RecordingDevice()
    ex = CudaInductorExecutor(graph, plan, device="cpu", stream_device=dev)
    lanes = [lane for phase in plan.phases for lane in phase.lanes]
    covered = sorted(s for seg in ex.segments for s in seg.steps)
    assert covered == list(range(len(plan.steps)))  # every step in exactly one segment
    waited = {w for step in plan.steps for w in step.waits}
    for seg in ex.segments:
        lane = next(lane for lane in lanes if seg.steps[0] in lane)
        at = lane.index(seg.steps[0])
        assert tuple(lane[at:at + len(seg.steps)]) == seg.steps  # consecutive steps of one lane
        assert not any(plan.steps[s].waits for s in seg.steps[1:]) and not waited & set(seg.steps[:-1])
    assert len(ex.segments) < len(plan.steps) and "compiled segment" in ex.describe()
    x = [torch.randn(t.type.shape) for t in graph.inputs]
    assert_close(ex(x), run_graph(graph, x))
    assert ex.captured and dev.captures == 1
    stream_ops = [op for op in ex.program.ops if isinstance(op, (Record, Wait))]
    assert [(kind, st) for kind, st, _ in dev.log][-len(stream_ops):] == [
        (type(op).__name__.lower(), op.stream) for op in stream_ops]
    y = [torch.randn(t.type.shape) for t in graph.inputs]
    assert_close(ex(y), run_graph(graph, y))  # a replay
    trace = ex.trace(y)
    assert sorted(e.label for e in trace) == sorted(seg.label for seg in ex.segments)
    assert {e.category for e in trace} == {"segment"}


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", [(n, d) for n in ("squeezenet1_1", "inception_v3", "randwire_small")
                                        for d in ("float32", "float16")])
def test_zoo_through_cuda_inductor_segments_equals_eager(name: str, dtype: str, strict_float32: Any) -> None:
    model, x = get_model(name).eval(), example_inputs(name)
    module = optimize(model, x, device="cuda", dtype=dtype, scheduler="est", backend="cuda-inductor", cost="analytic",
                      verify=False)
    xs = [t.to("cuda", getattr(torch, dtype)) for t in x]
    with torch.no_grad():
        expected = get_model(name).eval().to("cuda", getattr(torch, dtype))(*xs)
    assert_close(module(*xs), expected)
    assert "compiled segment" in module.executor.describe() and "captured into one CUDA graph" in \
        module.executor.describe()



@pytest.mark.gpu
def test_plans_racing_on_cuda_and_cuda_inductor_keep_the_faster_equal_to_eager(strict_float32: Any) -> None:
    """backend=("cuda", "cuda-inductor"): each plan runs on both, and whichever is kept computes
    what the model does and loads onto its own backend."""
    model, x = get_model("squeezenet1_1").eval(), example_inputs("squeezenet1_1")
    module = optimize(model, x, device="cuda", dtype="float16", scheduler="est", backend=("cuda", "cuda-inductor"),
                      cost="analytic", verify=False)
    race = module.outcome.race
    assert race is not None and module.outcome.contenders == {"est", "est on cuda-inductor"}
    assert module.backend.name == ("cuda-inductor" if race.kept == "est on cuda-inductor" else "cuda")
    xs = [t.to("cuda", torch.float16) for t in x]
    with torch.no_grad():
        expected = get_model("squeezenet1_1").eval().to("cuda", torch.float16)(*xs)
    assert_close(module(*xs), expected)

# --- placement -----------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype,channels_last", [("float64", False), ("bfloat16", True), (None, True)])
def test_place_matches_the_model_in_that_precision(zoo: Callable[[str], Graph], dtype: str | None,
                                                   channels_last: bool) -> None:
    model, x = get_model("inception_v3").eval(), example_inputs("inception_v3")[0]
    graph = place(zoo("inception_v3"), "cpu", dtype, channels_last)
    want = torch.float32 if dtype is None else getattr(torch, dtype)
    assert all(p.dtype == want for p in graph.params.values())
    assert (graph.structural_hash() != zoo("inception_v3").structural_hash()) == (dtype is not None)
    conv_w = next(p for p in graph.params.values() if p.dim() == 4)
    assert conv_w.is_contiguous(memory_format=torch.channels_last) == channels_last
    with torch.no_grad():
        expected = model.to(want)(x.to(want))
    actual = run_graph(graph, [x.to(want)])[0]
    assert actual.dtype == want
    if want == torch.float64:  # batch norm was folded in the model's float32: agreement to float32
        actual, expected = actual.float(), expected.float()
    assert_close([actual], [expected])


def test_place_keeps_integer_values_and_bridges_opaque_calls() -> None:
    b = GraphBuilder("opaque_cast")
    x = b.input("x", (2, 3))
    idx = b.input("idx", (2, 3), dtype="int64")
    y = b.add("opaque", [x, idx], name="host", target="float32-only", out=TensorType((2, 3)),
              fn=lambda t, i: t * 2 + i if t.dtype == torch.float32 and i.dtype == torch.int64 else t / 0)
    graph = b.build([b.add("relu", [y], name="out")])
    placed = place(graph, "cpu", "float64")
    assert placed.types["out"].dtype == "float64" and placed.types["idx"].dtype == "int64"
    t, i = torch.randn(2, 3, dtype=torch.float64), torch.arange(6).reshape(2, 3)
    out = run_graph(placed, [t, i])[0]
    assert out.dtype == torch.float64
    assert_close([out], [(t.float() * 2 + i).double().relu()])  # the callable saw float32, as in the model


def test_precision_names() -> None:
    from opsched.errors import OpschedError

    assert dtype_name("fp16") == dtype_name(torch.float16) == "float16"
    assert dtype_name("bf16") == "bfloat16"
    with pytest.raises(OpschedError, match="precision 'int8' is not supported"):
        dtype_name("int8")


def test_cuda_device_is_refused_cleanly_without_a_gpu() -> None:
    from opsched.errors import OpschedError

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(OpschedError, match="CUDA is not available"):
        optimize(get_model("squeezenet1_1"), example_inputs("squeezenet1_1"), device="cuda", cost="analytic")


# --- on a GPU ------------------------------------------------------------------------------------
ZOO_PRECISIONS = [(name, dtype) for name in list_models() for dtype in ("float32", "float16")] + [
    (name, "bfloat16") for name in ("inception_v3", "nasnet_mobile", "randwire_small")]


@pytest.mark.gpu
@pytest.mark.parametrize("name,dtype", ZOO_PRECISIONS)
def test_zoo_through_the_cuda_executor_equals_eager(name: str, dtype: str, strict_float32: Any) -> None:
    """Every zoo model, IOS and est schedules (merged convolutions included), captured, against
    eager PyTorch in the same precision (float32 strictly: TF32 off for both)."""
    model, x = get_model(name).eval(), example_inputs(name)
    for scheduler in ("ios", "est"):
        module = optimize(model, x, device="cuda", dtype=dtype, scheduler=scheduler, cost="analytic",
                          verify=False, **({"budget_s": 10} if scheduler == "ios" else {}))
        xs = [t.to("cuda", getattr(torch, dtype)) for t in x]
        with torch.no_grad():
            expected = get_model(name).eval().to("cuda", getattr(torch, dtype))(*xs)
        assert_close(module(*xs), expected)
        assert "captured into one CUDA graph" in module._executor.describe()


@pytest.mark.gpu
def test_cuda_measured_cost_and_channels_last() -> None:
    """PyTorch's defaults (TF32 convolutions in float32): optimize() verifies against the model
    within TF32's tolerance, on stages measured as captured replays, in channels-last layout."""
    assert tf32_in_use()
    model, x = get_model("inception_v3").eval(), example_inputs("inception_v3")
    module = optimize(model, x, device="cuda", channels_last=True, scheduler="ios", budget_s=20)
    xs = [t.cuda() for t in x]
    with torch.no_grad():
        expected = get_model("inception_v3").eval().cuda()(*xs)
    assert_close(module(*xs), expected)
    assert "captured into one CUDA graph" in str(module.report())


@pytest.mark.gpu
@pytest.mark.parametrize("scheduler", ["greedy", "ios"])
def test_fnets_complex_fourier_transforms_run_captured_equal_to_eager(scheduler: str) -> None:
    """Complex values on CUDA: FNet's FFTs (cuFFT, its plans made before capture) and the real
    parts taken of them, in one captured graph, against eager."""
    from opsched.testing.corpus import corpus, corpus_available

    if not corpus_available():
        pytest.skip("needs Hugging Face transformers")
    model, (ids,) = corpus()["fnet"].build()
    module = optimize(model, ids, device="cuda", scheduler=scheduler, cost="analytic", verify=False,
                      **({"budget_s": 10} if scheduler == "ios" else {}))
    assert "complex64" in module.graph.dtypes
    with torch.no_grad():
        expected = model.cuda()(ids.cuda())
        got = module(ids.cuda())
    assert_close([got.last_hidden_state, got.pooler_output], [expected.last_hidden_state, expected.pooler_output])
    assert "captured into one CUDA graph" in module._executor.describe()


def _resident(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """Zoo model ``name`` or the corpus's, and its inputs, in float16 on the GPU, as users hand them over."""
    from opsched.testing.corpus import corpus, corpus_available

    if name in list_models():
        model, inputs = get_model(name).eval(), example_inputs(name)
    elif corpus_available():
        model, inputs = corpus()[name].build()
    else:
        pytest.skip("needs Hugging Face transformers")
    return model.to("cuda", torch.float16), tuple(t.to("cuda", torch.float16) if t.is_floating_point()
                                                  else t.cuda() for t in inputs)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["googlenet", "gpt2", "llama"])
def test_a_model_already_on_the_gpu_in_float16_is_optimized_where_it_is(name: str) -> None:
    """Every earlier GPU test handed optimize() a CPU model to move: this one is on CUDA already,
    and optimize() is not told the device, so the plan runs where the model is and the import's
    passes meet CUDA weights (GoogLeNet's batch norms fold into bias-free convolutions, a new
    bias made beside them; GPT-2's and Llama's causal masks are compared)."""
    model, inputs = _resident(name)
    module = optimize(model, inputs, scheduler="est", cost="analytic", verify=False)
    assert module.device.type == "cuda"
    with torch.no_grad():
        expected = [t for t in torch.utils._pytree.tree_leaves(model(*inputs)) if isinstance(t, torch.Tensor)]
        got = [t for t in torch.utils._pytree.tree_leaves(module(*inputs)) if isinstance(t, torch.Tensor)]
    assert_close(got, expected)
    assert "captured into one CUDA graph" in module._executor.describe()


@pytest.mark.gpu
@pytest.mark.parametrize("graphs", [True, False], ids=["captured", "eager"])
def test_calls_from_threads_each_on_its_own_stream_return_their_own_outputs(graphs: bool) -> None:
    """A server's threads calling one module at once, each on a CUDA stream of its own: the
    captured graph's buffers, and the events of the eager walk, are shared, so each call waits
    for the last one's stream (where a call could overwrite inputs that a replay still reads)."""
    x = example_inputs("googlenet")
    module = optimize(get_model("googlenet").eval(), x, device="cuda", scheduler="est", cost="analytic", verify=False,
                      graphs=graphs)
    reference = get_model("googlenet").eval().cuda()  # the zoo's weights are seeded: the same model
    xs = [torch.randn(x[0].shape, device="cuda", generator=torch.Generator("cuda").manual_seed(i)) for i in range(6)]
    with torch.no_grad():
        expected = [reference(t) for t in xs]
    torch.cuda.synchronize()
    got: dict[int, list[torch.Tensor]] = {}

    def caller(i: int) -> None:
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            got[i] = [module(xs[i]) for _ in range(8)]
        stream.synchronize()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, outs in got.items():
        for out in outs:
            assert_close(out, expected[i], f"thread {i}")
    assert ("captured into one CUDA graph" in module._executor.describe()) == graphs

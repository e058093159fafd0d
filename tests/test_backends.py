"""Backends as plug-ins: a backend that lives only in this file runs the whole pipeline, every op has
a kernel or an export on every backend (or says why not), and plans are plain data."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
import torch.nn.functional as F

import opsched
from opsched.backends import Backend, CpuBackend, Executor, backend_names, base, get_backend, register_backend
from opsched.backends.lanes import LaneExecutor
from opsched.backends.ort_export import export_segment, exportable
from opsched.costing import host_cpu_model
from opsched.errors import OpschedError
from opsched.execution import RunOptions
from opsched.ir import Graph, GraphBuilder, registered_ops
from opsched.ir.ops import op_defs
from opsched.ir.ops.activation import ACTIVATIONS
from opsched.ir.ops.einsum import Contraction, contraction
from opsched.ir.ops.onnx_session import OnnxModel
from opsched.models import example_inputs, get_model
from opsched.runtime import Plan, lower, run_graph
from opsched.runtime.kernels import bind_step
from opsched.schedulers import schedule
from opsched.testing import assert_close, random_dag
from opsched.timeline import TraceEvent


# --- a backend in one class and one registration -------------------------------------------------
class SerialExecutor:
    """Every step of the plan in order on the caller's thread, torch kernels: no lanes at all."""

    def __init__(self, graph: Graph, plan: Plan) -> None:
        self.plan = plan
        self.order = [s for phase in plan.phases for lane in phase.lanes for s in lane]
        self.steps = [bind_step(graph, step) for step in plan.steps]

    def _run(self, inputs: Sequence[torch.Tensor], trace: list[TraceEvent] | None) -> list[torch.Tensor]:
        slots: list[object] = [None] * len(self.plan.slot_names)
        for slot, t in zip(self.plan.input_slots, inputs):
            slots[slot] = t
        t0 = time.perf_counter()
        with torch.no_grad():
            for s in self.order:
                start = time.perf_counter()
                self.steps[s](slots)
                if trace is not None:
                    step = self.plan.steps[s]
                    trace.append(TraceEvent(0, 0, step.label, step.op, (start - t0) * 1e3,
                                            (time.perf_counter() - t0) * 1e3))
        return [slots[s] for s in self.plan.output_slots]  # type: ignore[misc]

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return self._run(inputs, None)

    def trace(self, inputs: Sequence[torch.Tensor]) -> list[TraceEvent]:
        events: list[TraceEvent] = []
        self._run(inputs, events)
        return events

    def describe(self) -> str:
        return f"serial: {len(self.order)} steps, one after another"

    def close(self) -> None:
        pass


class SerialBackend(CpuBackend):
    name = "serial"

    def prepare(self, graph: Graph, plan: Plan, run: RunOptions) -> Executor:
        return SerialExecutor(graph, plan)


@pytest.fixture
def serial(monkeypatch: pytest.MonkeyPatch) -> Backend:
    """SerialBackend, registered for one test (the registry is the process's: other tests, the
    options page's among them, must not see it)."""
    monkeypatch.setattr(base, "_BACKENDS", dict(base._BACKENDS))
    return register_backend(SerialBackend())


@pytest.mark.usefixtures("serial")
def test_a_backend_added_in_one_class_runs_the_whole_pipeline(tmp_path: Path) -> None:
    model, inputs = get_model("squeezenet1_1"), example_inputs("squeezenet1_1")
    module = opsched.optimize(model, inputs, backend="serial", cache_dir=str(tmp_path), scheduler=("ios", "est"),
                              budget_s=20)  # stages measured on it, plans raced on it, checked against eager
    assert module.backend.name == "serial" and "serial:" in str(module.report())
    with torch.no_grad():
        assert_close(module(*inputs), model(*inputs))
    events = module.profile(*inputs)
    assert sorted(e.label for e in events) == sorted(st.label for st in module.plan.steps)
    with opsched.cost.ProfileStore(tmp_path) as store:
        tags = {c["backend"] for c in store.status()["contexts"]}  # type: ignore[attr-defined]
    assert tags == {"cpu-serial-v4"}  # its measurements are its own


@pytest.mark.usefixtures("serial")
def test_backend_resolution_names_what_is_wrong() -> None:
    assert get_backend("serial").name == "serial"
    with pytest.raises(OpschedError, match="no backend 'tpu'; available: auto, .*ort.*torch"):
        get_backend("tpu")
    with pytest.raises(OpschedError, match="backend 'cuda' runs on cuda, not on cpu"):
        opsched.optimize(get_model("squeezenet1_1"), example_inputs("squeezenet1_1"), backend="cuda", cost="analytic")
    with pytest.raises(ValueError, match="taken"):
        register_backend(SerialBackend())


@pytest.mark.usefixtures("serial")
@pytest.mark.parametrize("name", [*backend_names(), "serial"])
def test_every_op_runs_on_every_backend_or_says_why_not(name: str) -> None:
    backend = get_backend(name)
    assert isinstance(backend, Backend)
    for op in registered_ops():
        assert backend.supports(op) or backend.opt_out(op), f"backend {name!r} neither runs {op!r} nor says why"
    for opdef in op_defs():  # the reference kernel exists for every op, an ONNX export or its reason
        assert opdef.torch is not None and (opdef.onnx is not None or opdef.no_onnx)


@pytest.mark.usefixtures("serial")
@pytest.mark.parametrize("name", ["torch", "ort", "inductor", "serial"])
def test_executors_follow_the_protocol(name: str) -> None:
    g = random_dag(8, 4)
    plan = lower(g, schedule(g, "greedy", host_cpu_model(), max_lanes=2))
    executor = get_backend(name).prepare(g, plan, RunOptions())
    assert isinstance(executor, Executor)
    x = [torch.randn(g.inputs[0].type.shape)]
    assert_close(executor(x), opsched.run_graph(g, x))
    assert executor.describe().startswith({"torch": "torch", "ort": "onnxruntime", "inductor": "inductor",
                                                "serial": "serial"}[name])
    assert executor.trace(x)
    executor.close()


def test_a_plan_is_plain_data() -> None:
    g = random_dag(10, 2)
    plan = lower(g, schedule(g, "est", host_cpu_model()))
    text = json.dumps(plan.to_dict())  # indices, names and attributes only
    assert Plan.from_dict(json.loads(text)) == plan


@pytest.mark.parametrize(("hw", "size"), [((14, 14), (7, 7)), ((10, 13), (3, 4)), ((9, 8), (4, 8)), ((5, 7), (7, 3))])
def test_adaptive_pooling_to_any_size_runs_in_an_ort_session(hw: tuple[int, int], size: tuple[int, int]) -> None:
    """Equal windows (a pool), torch's overlapping bins (row means, then column means), and
    bins larger than the input (repeated cells) all equal torch, and none leaves the session."""
    b = GraphBuilder("adaptive")
    x = b.input("x", (2, 3, *hw))
    g = b.build([b.add("relu", [b.add("adaptive_avg_pool2d", [x], name="pool", output_size=size)], name="r")])
    plan = lower(g, schedule(g, "sequential", host_cpu_model()))
    executor = get_backend("ort").prepare(g, plan, RunOptions())
    inputs = [torch.randn(2, 3, *hw)]
    assert_close(executor(inputs), opsched.run_graph(g, inputs))
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1  # nothing left the session
    assert "run with torch" not in executor.describe()
    executor.close()


class _PositionIds(torch.nn.Module):
    """RoBERTa's position ids from token ids: a cast as ``torch.export`` decomposes it (``_to_copy``,
    which torch.onnx cannot export) and an int32 ``cumsum`` (which ATen promotes to int64 and
    torch.onnx exports as int32)."""

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mask = torch.ops.aten._to_copy.default(ids.ne(1), dtype=torch.int32)
        counts = torch.cumsum(mask, dim=1)
        return counts.type_as(mask) * mask + 1, counts


def test_casts_and_type_promoting_ops_stay_in_an_ort_session() -> None:
    ids = torch.tensor([[0, 1, 4, 1, 2, 3, 1]])
    g = opsched.from_torch(_PositionIds(), ids)
    assert {"aten::_to_copy.default", "aten::cumsum.default"} <= {n.attrs.get("target") for n in g.nodes}
    plan = lower(g, schedule(g, "sequential", host_cpu_model()))
    executor = get_backend("ort").prepare(g, plan, RunOptions())
    positions, counts = executor([ids])
    assert positions.dtype == torch.int32 and counts.dtype == torch.int64
    assert all(torch.equal(a, b) for a, b in zip((positions, counts), _PositionIds()(ids)))
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1
    assert "run with torch" not in executor.describe()
    executor.close()


class _MaskTypeAs(torch.nn.Module):
    """Funnel's attention mask: a buffer ``type_as`` the hidden states, whose values the exported
    Cast (or Identity) never reads, so torch.onnx drops that input."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.register_buffer("mask", torch.tensor([[1.0, 0.0, 1.0]]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.lin(x)
        return h * self.mask.type_as(h).unsqueeze(-1) + self.mask.type_as(x.half()).float().sum()


def test_a_call_whose_export_drops_an_input_is_wired_by_name() -> None:
    x = torch.randn(1, 3, 8)
    g = opsched.from_torch(_MaskTypeAs().eval(), x)
    assert [n.attrs["target"] for n in g.nodes if n.op.startswith("aten.")].count("aten::type_as.default") == 2
    plan = lower(g, schedule(g, "sequential", host_cpu_model()))
    executor = get_backend("ort").prepare(g, plan, RunOptions())
    assert_close(executor([x]), opsched.run_graph(g, [x]))
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1
    executor.close()


class _Scatters(torch.nn.Module):
    """Writes as models make them: ``slice_scatter``, ``select_scatter`` and ``fill`` (in-place
    slice assignments once functionalised: Funnel's relative positions), and aliases such as
    ``torch.multiply`` (ConvBERT): torch.onnx has no symbolic for any of them."""

    def __init__(self, dim: int, start: int | None, end: int | None, step: int) -> None:
        super().__init__()
        self.where = (dim, start, end, step)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dim, start, end, step = self.where
        base = torch.multiply(x, 2.0)
        width = len(range(*slice(start, end, step).indices(x.shape[dim])))
        src = torch.subtract(x.narrow(dim, 0, width), 1.0)
        written = base.clone()
        written.narrow(dim, 0, 1).fill_(0.0)  # writes through views: slice_scatter of a fill
        written.select(dim, -1).fill_(x.amax())  # select_scatter of a fill by a 0-d tensor
        return torch.slice_scatter(written, torch.true_divide(src, 3.0), dim, start, end, step)


@pytest.mark.parametrize(("dim", "start", "end", "step"), [(1, 2, 6, 1), (-1, None, None, 2), (2, 1, None, 3),
                                                           (0, 0, 1, 1)])
def test_slice_writes_and_aliases_stay_in_an_ort_session(dim: int, start: int | None, end: int | None,
                                                         step: int) -> None:
    model, x = _Scatters(dim, start, end, step), torch.randn(2, 8, 7)
    g = opsched.from_torch(model, x)
    targets = {n.attrs.get("target") for n in g.nodes}
    assert {"aten::slice_scatter.default", "aten::select_scatter.default", "aten::fill.Scalar", "aten::fill.Tensor",
            "aten::multiply.Tensor"} <= targets
    plan = lower(g, schedule(g, "sequential", host_cpu_model()))
    executor = get_backend("ort").prepare(g, plan, RunOptions())
    assert_close(executor([x]), [model(x)])
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()
    executor.close()


class _FilledByADouble(torch.nn.Module):
    """A float32 tensor filled by a 0-d float64 one (VITS's): the fill has the filled tensor's type."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("scale", torch.tensor(0.667, dtype=torch.float64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x * 2
        y[:, 0].fill_(self.scale)
        return torch.ones_like(x).fill_(self.scale) + y


def _resident_bytes() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the process's resident memory from /proc")
def test_plans_share_one_memory_arena() -> None:
    """Five scheduled modules, each one session whose call's temporaries take 128 MiB (a 4096 x
    4096 outer product, softmaxed): after a call of each, the process holds about one call's
    temporaries more than before, not five. With ONNX Runtime's default, an arena each, it held
    340 MiB more, for as long as the modules lived; a torch.compile'd model holds a plan per graph
    and shape."""

    class Outer(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return (x.unsqueeze(-1) * x.unsqueeze(-2)).softmax(-1).sum(-1)

    x = torch.randn(1, 4096)
    modules = [opsched.optimize(Outer().eval(), x, cost="analytic", verify=False) for _ in range(5)]
    with torch.no_grad():
        before = _resident_bytes()
        outs = [m(x) for m in modules]
        held = _resident_bytes() - before
    for out in outs:
        assert_close(out, Outer()(x))
    assert held < 200 * 2**20, f"{held / 2**20:.0f} MiB held after the calls"


def test_a_fill_by_a_tensor_of_another_type_takes_the_filled_ones_type_in_a_session() -> None:
    model, x = _FilledByADouble(), torch.randn(3, 4)
    g = opsched.from_torch(model, x)
    assert "aten::fill.Tensor" in {n.attrs.get("target") for n in g.nodes}
    plan = lower(g, schedule(g, "sequential", host_cpu_model()))
    executor = get_backend("ort").prepare(g, plan, RunOptions())
    assert_close(executor([x]), [model(x)])
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()
    executor.close()


def test_a_node_whose_onnx_form_onnx_runtime_refuses_runs_with_torch_and_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """Where ONNX Runtime refuses a node's ONNX form for another reason than a missing kernel (a
    wrong type, as the fill's was), the node runs with torch, the plan stays right, and a warning
    names the node as a bug of the export's."""
    from onnxruntime.capi.onnxruntime_pybind11_state import Fail

    import opsched.backends.ort_export as ort_export
    import opsched.backends.ort_program as ort_program

    def refusing(model: object, threads: int | None = None, **kwargs: object) -> object:
        raise Fail("[ONNXRuntimeError] : 1 : FAIL : Type Error: Type (tensor(float)) does not match")

    model, x = _FilledByADouble(), torch.randn(3, 4)
    g = opsched.from_torch(model, x)
    fill = next(n for n in g.nodes if n.attrs.get("target") == "aten::fill.Tensor")
    real = ort_program.ort_session
    monkeypatch.setattr(ort_export, "_NO_KERNEL", {})  # asked afresh, and answered by a refusing ONNX Runtime
    monkeypatch.setattr(ort_program, "ort_session", refusing)
    with caplog.at_level("WARNING", logger="opsched.backends.ort_export"):
        why = ort_export.refusal(g, fill)
    assert why is not None and why.startswith("ONNX Runtime refuses its ONNX form (") and "Type Error" in why
    assert any(fill.name in r.getMessage() and "opsched's bug" in r.getMessage() for r in caplog.records)
    monkeypatch.setattr(ort_program, "ort_session", real)  # the answer kept: the other segments run in sessions
    assert not ort_export.exportable(g, fill)
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    assert_close(executor([x]), [model(x)])
    executor.close()


class _WrittenOver(torch.nn.Module):
    """Tensors made uninitialised and then written over: the inverse of an order (a mixture of
    experts' routing) and a buffer filled by a copy."""

    def forward(self, x: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.shape[0])
        buffer = x.new_empty(x.shape)
        buffer.copy_(x * 2)
        return buffer[inverse] + x


def test_uninitialised_tensors_join_the_session_whatever_the_heap_holds() -> None:
    """torch.onnx exports ``empty_like`` as a constant of the memory its trace saw, which the
    export's check accepted where the check's memory held the same and refused otherwise: the
    segments were cut by the heap. They are zeros in a session now, always."""
    model, x, order = _WrittenOver(), torch.randn(6, 3), torch.randperm(6)
    g = opsched.from_torch(model, (x, order))
    assert {"aten::empty_like.default", "aten::new_empty.default"} <= {n.attrs.get("target") for n in g.nodes}
    plan = lower(g, schedule(g, "sequential", host_cpu_model()))
    executor = get_backend("ort").prepare(g, plan, RunOptions())
    assert_close(executor([x, order]), [model(x, order)])
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()
    executor.close()


class _IndexWrites(torch.nn.Module):
    """Index assignments on integer and half tensors: ``copy`` (a scalar or a tensor broadcast
    into a slice, with a cast), ``fill`` and the scatters around them."""

    def forward(self, ids: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        marked = ids.clone()
        marked[:, 0] = 7
        marked[:, 2:4] = 3
        half = x.clone().half()
        half[0, 1] = 2.5
        half[1, 2:5] = x[0, :3]
        return marked * 2, half.float() + 1


def test_index_assignments_of_every_dtype_stay_in_an_ort_session_exactly() -> None:
    model, inputs = _IndexWrites(), (torch.randint(0, 5, (2, 6)), torch.randn(2, 6))
    g = opsched.from_torch(model, inputs)
    assert "aten::copy.default" in {n.attrs.get("target") for n in g.nodes}
    plan = lower(g, schedule(g, "sequential", host_cpu_model()))
    executor = get_backend("ort").prepare(g, plan, RunOptions())
    assert all(torch.equal(a, b) for a, b in zip(executor(list(inputs)), model(*inputs), strict=True))
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()
    executor.close()


@pytest.mark.parametrize(("name", "attrs"), [
    *((name, {}) for name in ACTIVATIONS),
    ("gelu", {"approximate": "tanh"}),
])
def test_every_activation_runs_on_ort_equal_to_torch(name: str, attrs: dict[str, str]) -> None:
    """Each activation's ONNX form (ONNX's own Gelu, both forms, among them) against its torch
    function, on values spanning every piece of the piecewise ones."""
    b = GraphBuilder("act")
    g = b.build([b.add(name, [b.input("x", (4, 64))], **attrs)])
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    xs = torch.linspace(-8, 8, 256).reshape(4, 64)
    assert_close(executor([xs]), run_graph(g, [xs]))
    executor.close()

class _Unfold(torch.nn.Module):
    """``F.unfold`` (``im2col``) and ``F.fold`` (``col2im``), as MobileViTV2 cuts an image into
    patches and folds them back."""

    def __init__(self, kernel: tuple[int, int], dilation: tuple[int, int], padding: tuple[int, int],
                 stride: tuple[int, int]) -> None:
        super().__init__()
        self.window = {"kernel_size": kernel, "dilation": dilation, "padding": padding, "stride": stride}

    def forward(self, image: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cols = F.unfold(image, **self.window)
        return cols, F.fold(cols.relu(), image.shape[-2:], **self.window) * 2


@pytest.mark.parametrize(("size", "kernel", "dilation", "padding", "stride"), [
    ((8, 8), (2, 2), (1, 1), (0, 0), (2, 2)),  # MobileViTV2's: blocks side by side
    ((7, 9), (3, 2), (1, 2), (1, 0), (2, 1)),  # overlapping, dilated, padded on one axis
    ((6, 6), (3, 3), (1, 1), (1, 1), (1, 1)),  # every pixel the sum of 9 columns
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # ONNX's Col2Im; the scatter ORT's lacks
def test_unfold_and_fold_stay_in_an_ort_session(size: tuple[int, int], kernel: tuple[int, int],
                                                dilation: tuple[int, int], padding: tuple[int, int],
                                                stride: tuple[int, int], dtype: torch.dtype) -> None:
    model, image = _Unfold(kernel, dilation, padding, stride), torch.randn(2, 3, *size, dtype=dtype)
    g = opsched.from_torch(model, image)
    assert {"aten::im2col.default", "aten::col2im.default"} <= {n.attrs.get("target") for n in g.nodes}
    plan = lower(g, schedule(g, "sequential", host_cpu_model()))
    executor = get_backend("ort").prepare(g, plan, RunOptions())
    assert_close(executor([image]), list(model(image)))
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()
    executor.close()



class _Nearest(torch.nn.Module):
    def __init__(self, mode: str, size: tuple[int, ...] | None, scale: float | None) -> None:
        super().__init__()
        self.mode, self.size, self.scale = mode, size, scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x.sigmoid(), size=self.size, scale_factor=self.scale, mode=self.mode) * 2


@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize(("shape", "size", "scale", "forms"), [
    # a whole ratio: Resize reads PyTorch's rows, and runs 60x faster than Gathers (benchmarks/onnx_forms.py)
    ((1, 8, 6, 5), None, 2.0, {"nearest": ["Resize"], "nearest-exact": ["Resize"]}),
    ((1, 2, 4, 6), (12, 18), None, {"nearest": ["Resize"], "nearest-exact": ["Resize"]}),
    # fuzz seed 1167: torch.onnx's Resize of 14 to 16 pixels read other rows, 5.2 off
    ((2, 4, 14, 14), (16, 16), None, {"nearest": ["Gather", "Gather"], "nearest-exact": ["Gather", "Gather"]}),
    ((1, 3, 16, 10), (14, 10), None, {"nearest": ["Resize"], "nearest-exact": ["Gather"]}),  # down along one axis
    # fuzz seed 5219: from scales, ONNX's shape inference made 5 pixels 6, ONNX Runtime 7
    ((1, 1, 5, 5), (7, 7), None, {"nearest": ["Resize"], "nearest-exact": ["Gather", "Gather"]}),
    # steps by the scale given, not by the sizes
    ((1, 2, 7, 9), None, 1.7, {"nearest": ["Gather", "Gather"], "nearest-exact": ["Gather", "Gather"]}),
    ((1, 2, 11), (4,), None, {"nearest": ["Resize"], "nearest-exact": ["Gather"]}),  # 1-d
    ((1, 2, 3, 5, 4), (7, 5, 9), None, {"nearest": ["Resize"], "nearest-exact": ["Gather", "Gather"]}),  # 3-d
])
def test_nearest_upsampling_runs_in_an_ort_session_exactly(mode: str, shape: tuple[int, ...],
                                                           size: tuple[int, ...] | None, scale: float | None,
                                                           forms: dict[str, list[str]]) -> None:
    """A Resize where ONNX's rows are PyTorch's, else a Gather per axis that changes."""

    model, x = _Nearest(mode, size, scale), torch.randn(*shape)
    g = opsched.from_torch(model, x)
    (node,) = [n for n in g.nodes if "upsample" in n.attrs.get("target", "")]
    exported = export_segment(g, [(node.name,)], node.inputs, [node.name]).proto
    assert [n.op_type for n in exported.graph.node] == forms[mode]
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    made = executor([x])
    executor.close()
    assert_close(made, [model(x)])  # a row read wrongly is off by the values' spread, ~1
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()


class _UpsampledAndJoined(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.cat([F.interpolate(x.sigmoid(), size=(7, 7), mode="nearest"), y], 1) * 2


def test_a_nearest_resize_joined_with_its_size_loads_in_one_session() -> None:
    """Fuzz seed 5219: 5 pixels resized to 7 by scales, which ONNX's shape inference sizes 6
    (it computes in double precision) and ONNX Runtime makes 7; joined with a tensor of 7, the
    Concat failed to load ("Can't merge shape info"). The Resize is given its sizes."""
    model, x, y = _UpsampledAndJoined(), torch.randn(1, 1, 5, 5), torch.randn(1, 2, 7, 7)
    g = opsched.from_torch(model, (x, y))
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    made = executor([x, y])
    executor.close()
    assert_close(made, [model(x, y)])
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()


def test_a_nearest_resize_is_chosen_only_where_onnx_runtime_reads_pytorchs_rows() -> None:
    """Brute force over sizes 1-24 to 1-40, both nearest modes: wherever the export's model of
    ONNX Runtime's Resize says it reads the rows PyTorch reads, ONNX Runtime's Resize does; and
    ONNX's shape inference, strict, gives the Resize the size ONNX Runtime makes (from scales it
    gave 6 rows of 5 to 7, and a segment declaring 7 failed to load: fuzz seed 5219)."""
    import onnx
    import onnxruntime
    from onnx import helper

    from opsched.ir.ops.aten_onnx import _resize_rows

    chosen = 0
    for size in range(1, 25):
        for out in range(1, 41):
            predicted = _resize_rows(size, out)
            graph = helper.make_graph(
                [helper.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="nearest", nearest_mode="floor",
                                  coordinate_transformation_mode="asymmetric")], "resize",
                [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, size])],
                [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                [onnx.numpy_helper.from_array(np.array([1, 1, out], np.int64), "sizes")])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
            inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True).graph.output[0]
            assert [d.dim_value for d in inferred.type.tensor_type.shape.dim] == [1, 1, out], (size, out)
            session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            (read,) = session.run(None, {"x": np.arange(size, dtype=np.float32).reshape(1, 1, size)})
            assert np.array_equal(read.reshape(-1), predicted), (size, out)
            for mode in ("nearest", "nearest-exact"):
                rows = F.interpolate(torch.arange(size, dtype=torch.float64).reshape(1, 1, size), size=out, mode=mode)
                chosen += np.array_equal(rows.reshape(-1).numpy(), predicted)
    assert chosen > 24 * 2  # the whole ratios at least, in both modes


def test_symbolics_of_later_opsets_are_known_before_any_export() -> None:
    """torch.onnx registers a symbolic as it imports its opset's module, on its first export:
    asked before that, ``tril`` (opset 14) and ``grid_sampler`` (16) had none, and the answer
    was kept. A fresh interpreter, so that no export has run."""
    import subprocess
    import sys

    probe = ("from opsched.ir.ops.aten_export import _has_symbolic; "
             "print([_has_symbolic(n) for n in ('aten::tril', 'aten::grid_sampler', 'aten::hypot')])")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[True, True, False]"  # hypot has none at any opset


class _GridSample(torch.nn.Module):
    def __init__(self, mode: str, padding: str, corners: bool) -> None:
        super().__init__()
        self.mode, self.padding, self.corners = mode, padding, corners

    def forward(self, x: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        return F.grid_sample(x.sigmoid(), grid, mode=self.mode, padding_mode=self.padding,
                             align_corners=self.corners) * 2


@pytest.mark.parametrize("volume", [False, True], ids=["image", "volume"])
def test_grid_sampling_runs_in_an_ort_session_as_eager_in_every_mode(volume: bool) -> None:
    """Deformable attention's and spatial transformers' sampling, every mode, padding and
    corner alignment PyTorch has, at points outside the input, on its edges and on exact
    half-pixels (where nearest rounds): ONNX's GridSample in the session, equal to eager."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, *((4, 5, 6) if volume else (6, 7)), generator=gen)
    grid = torch.rand(2, *((3, 4, 5, 3) if volume else (5, 9, 2)), generator=gen) * 2.6 - 1.3
    grid.view(-1)[:16] = torch.tensor([-1, 1, 0, 0.5, -0.5, 1 / 6, -1 / 6, 1 / 7, 3 / 7, 1.1, -1.1, 0.999, -5 / 6,
                                       1 / 3, -2 / 3, 0.25])
    modes = ["bilinear", "nearest"] + ([] if volume else ["bicubic"])  # PyTorch samples volumes in these two
    for mode, padding, corners in itertools.product(modes, ["zeros", "border", "reflection"], [False, True]):
        model = _GridSample(mode, padding, corners)
        g = opsched.from_torch(model, (x, grid))
        executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())),
                                              RunOptions())
        made = executor([x, grid])
        executor.close()
        assert isinstance(executor, LaneExecutor) and executor.sessions == 1, (mode, padding, executor.describe())
        assert_close(made, [model(x, grid)], what=f"{mode}, {padding}, align_corners={corners}")


#: The long tail of operators models call, each a model of its own (an input of (2, 3, 9, 11),
#: drawn). Some torch.onnx exports and runs in a session, some run with torch; all must equal eager.
_LONG_TAIL: dict[str, Any] = {
    "bicubic": lambda x: F.interpolate(x, scale_factor=2, mode="bicubic"),
    "bicubic_corners": lambda x: F.interpolate(x, size=(13, 5), mode="bicubic", align_corners=True),
    "bilinear_down": lambda x: F.interpolate(x, size=(4, 5), mode="bilinear"),
    "area": lambda x: F.interpolate(x, size=(4, 5), mode="area"),
    "pixel_shuffle": lambda x: F.pixel_shuffle(x.repeat(1, 4, 1, 1), 2),
    "pixel_unshuffle": lambda x: F.pixel_unshuffle(x[:, :, :8, :10], 2),
    "adaptive_max": lambda x: F.adaptive_max_pool2d(x, (4, 3)),
    "adaptive_avg": lambda x: F.adaptive_avg_pool2d(x, (4, 3)),
    "avg_pool_ceil": lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
    "max_pool_dilated": lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True),
    "lp_pool": lambda x: F.lp_pool2d(x.abs(), 2, 3, 2),
    "local_response": lambda x: F.local_response_norm(x, 2),
    "group_norm": lambda x: F.group_norm(x, 3),
    "instance_norm": lambda x: F.instance_norm(x),
    "cumprod": lambda x: torch.cumprod(x, -1),
    "logcumsumexp": lambda x: torch.logcumsumexp(x, -2),
    "median": lambda x: x.median(-1).values,
    "kthvalue": lambda x: x.kthvalue(3, -1).values,
    "std": lambda x: x.std(-1),
    "var": lambda x: x.var(-1, correction=0),
    "vector_norm": lambda x: torch.linalg.vector_norm(x, 3, -1),
    "clamp_tensors": lambda x: x.clamp(min=x.mean(), max=x.amax() / 2),
    "remainder": lambda x: torch.remainder(x * 5, 1.7),
    "fmod": lambda x: torch.fmod(x * 5, 1.7),
    "trunc": lambda x: torch.trunc(x * 3),
    "erfinv": lambda x: torch.erfinv(x.tanh() * 0.99),
    "atan2": lambda x: torch.atan2(x, x.flip(-1)),
    "hypot": lambda x: torch.hypot(x, x.flip(-1)),
    "logaddexp": lambda x: torch.logaddexp(x, x.flip(-1)),
    "einsum": lambda x: torch.einsum("bchw,bcwk->bchk", x, x.transpose(-1, -2)[..., :5]),
    "triu": lambda x: torch.triu(x, -1),
    "diag_embed": lambda x: torch.diag_embed(x[0, 0, 0]),
    "cdist": lambda x: torch.cdist(x[0], x[1]),
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "mish": F.mish,
    "celu": lambda x: F.celu(x, 0.7),
    "softmin": lambda x: F.softmin(x, -1),
    "glu": lambda x: F.glu(x[..., :10], -1),
    "logsigmoid": F.logsigmoid,
    "threshold": lambda x: F.threshold(x, 0.2, -3.0),
    "normalize": lambda x: F.normalize(x, dim=1),
    "cosine_similarity": lambda x: F.cosine_similarity(x, x.flip(-1), dim=1),
    "amin": lambda x: x.amin((1, 3)),
    "prod": lambda x: x.prod(-1),
    "all_any": lambda x: ((x > 0).all(-1) | (x < -1).any(-1)).float(),
    "argmax": lambda x: x.argmax(-1, keepdim=True).float(),
    "bucketize": lambda x: torch.bucketize(x, torch.tensor([-1.0, 0.0, 0.5])).float(),
    "masked_softmax": lambda x: x.masked_fill(x > 0.5, float("-inf")).softmax(-1),
    "repeat_interleave": lambda x: x.repeat_interleave(2, dim=-1),
    "tile": lambda x: x.tile((1, 2, 1, 1)),
    "index_select": lambda x: x.index_select(-1, torch.tensor([3, 0, 3, 10])),
    "gather": lambda x: x.gather(-1, (x.abs() * 3).long().clamp(max=10)),
    "take_along_dim": lambda x: torch.take_along_dim(x, x.argsort(-1), -1),
    "replicate_pad": lambda x: F.pad(x, (1, 2, 3, 0), mode="replicate"),
    "circular_pad": lambda x: F.pad(x[0], (2, 2), mode="circular"),
    "negative_pad": lambda x: F.pad(x, (-1, 2, 0, -2)),
}


class _Call(torch.nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fn(x)
        return out


@pytest.mark.parametrize("name", list(_LONG_TAIL))
def test_the_long_tail_of_operators_runs_on_the_ort_backend_equal_to_eager(name: str) -> None:
    model, x = _Call(_LONG_TAIL[name]), torch.randn(2, 3, 9, 11, generator=torch.Generator().manual_seed(0))
    g = opsched.from_torch(model, x)
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    made = executor([x])
    executor.close()
    assert_close(made, [model(x)], what=f"{name} ({executor.describe()})")


class _QuerySelection(torch.nn.Module):
    """RT-DETR's query selection: the top scores, where masked-out anchors all score alike."""

    def forward(self, scores: torch.Tensor, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        masked = scores.masked_fill(scores < 0.5, -1.0)  # ties: every anchor below 0.5
        top = masked.topk(6, dim=1)
        return top.values * 2, torch.gather(features, 1, top.indices[..., None].expand(-1, -1, features.shape[-1]))


def test_topk_indices_run_with_torch_so_tied_scores_pick_what_eager_picks() -> None:
    model = _QuerySelection()
    scores, features = torch.rand(2, 40) * 0.4, torch.randn(2, 40, 3)  # every score ties at -1
    scores[0, 7] = 0.9
    g = opsched.from_torch(model, (scores, features))
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    made = executor([scores, features])
    executor.close()
    values, picked = model(scores, features)
    assert torch.equal(made[0], values) and torch.equal(made[1], picked)  # ORT's TopK would pick rows 0-5
    assert "topk" in executor.describe() and "run with torch" in executor.describe()


class _TiedIndices(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = (x * 4).round().clamp(-1, 1)  # three values: every row full of ties
        return (y.argmax(1), y.min(1).indices, y.topk(5, 1).indices, y.sort(1, descending=True).indices,
                y.argsort(1), torch.sort(y, dim=1, stable=True).indices, y.kthvalue(3, 1).indices)


def test_indices_among_tied_values_are_eagers_on_the_ort_backend() -> None:
    """ONNX's ArgMax and ArgMin take the first of tied values, as PyTorch does; its TopK orders
    them by index, where topk and an unstable sort on PyTorch's CPU kernels do not: those run
    with torch."""
    model, x = _TiedIndices(), torch.randn(4, 37)
    g = opsched.from_torch(model, x)
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    made = executor([x])
    executor.close()
    assert [torch.equal(a, b) for a, b in zip(made, model(x), strict=True)] == [True] * 7
    on_torch = {label.rstrip("_0123456789"): why for label, _, why in executor.on_torch}  # type: ignore[attr-defined]
    assert {"topk", "sort", "argsort"} <= set(on_torch) and not set(on_torch) & {"argmax", "min"}, on_torch
    assert "ONNX Runtime orders tied values by index" in str(on_torch["topk"])


class _Rounding(torch.nn.Module):
    def forward(self, i: torch.Tensor, j: torch.Tensor, f: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (i // 3, i // j, f // 0.7, f // g, torch.div(i, -3, rounding_mode="floor"),
                torch.div(f, g, rounding_mode="trunc"), i % 3, i % j, torch.fmod(i, j))


def test_floor_division_rounds_down_on_the_ort_backend_as_in_eager() -> None:
    """torch.onnx's own floor_divide truncates (-7 // 3 was -2, -2.1 // 0.7 was -3.0): it is
    exported as a division rounding down, whose export floors."""
    gen = torch.Generator().manual_seed(0)
    sign = torch.where(torch.rand(4, 50, generator=gen) < 0.5, -1, 1)
    i, j = torch.randint(-50, 50, (4, 50), generator=gen), torch.randint(1, 9, (4, 50), generator=gen) * sign
    f, g = torch.randn(4, 50, generator=gen) * 5, (torch.rand(4, 50, generator=gen) + 0.1) * sign
    model = _Rounding()
    graph = opsched.from_torch(model, (i, j, f, g))
    cache = torch.is_autocast_cache_enabled()
    executor = get_backend("ort").prepare(graph, lower(graph, schedule(graph, "sequential", host_cpu_model())),
                                          RunOptions())
    made = executor([i, j, f, g])
    executor.close()
    assert [torch.equal(a, b) for a, b in zip(made, model(i, j, f, g), strict=True)] == [True] * 9
    assert executor.sessions == 1, executor.describe()  # type: ignore[attr-defined]
    # torch.onnx refused one export on the way (a division of integer zeros) and, left to
    # itself, would have left autocast's cache off for the process
    assert torch.is_autocast_cache_enabled() == cache


class _NegativeDimensions(torch.nn.Module):
    """Calls whose dimensions count from the end, several of which torch.onnx exports wrongly
    as they come (a Transpose with a negative axis, an unfold of another axis)."""

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.unfold(-2, 3, 2).sin(), x.permute(0, -1, -2, 1).cos(), x.transpose(-1, -3).exp(),
                torch.stack([x, y], dim=-1).sin(), x.unsqueeze(-1).cos(), x.flip(-1).roll(1, -2).sin(),
                x.movedim(-1, -3).sin(), torch.cumsum(x, -2).cos(), x.log_softmax(-2), x.narrow(-1, 1, 3).sin())


def test_negative_dimensions_export_counted_up_on_the_ort_backend() -> None:
    """Mamba-2's ``permute(x, [0, -2, -1, 1])`` exported a Transpose that ONNX Runtime refused
    (the whole model failed), PatchTST's ``unfold(x, -2, ...)`` one of another shape: each
    dimension is counted up from zero before export, and every call runs in one session."""
    model, x, y = _NegativeDimensions(), torch.randn(2, 7, 6, 5), torch.randn(2, 7, 6, 5)
    g = opsched.from_torch(model, (x, y))
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    made = executor([x, y])
    executor.close()
    assert_close(made, list(model(x, y)))
    assert executor.sessions == 1 and "run with torch" not in executor.describe(), executor.describe()


def _whole(graph: Graph) -> OnnxModel:
    """``graph`` exported as one ONNX Runtime segment, a step per node, as the ort backend makes it."""
    return export_segment(graph, [(n.name,) for n in graph.nodes], [i.name for i in graph.inputs], graph.outputs)


class _Windows(torch.nn.Module):
    """``Tensor.unfold`` along each axis: overlapping windows, windows with gaps between them, one
    window the axis's length, the last axis and one counted from the end, floats and integers."""

    def forward(self, x: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (x.unfold(0, 1, 1), x.unfold(1, 3, 2), x.unfold(-2, 2, 5), x.unfold(3, 5, 1), x.unfold(-1, 2, 2),
                i.unfold(1, 4, 3), x.unfold(2, 3, 1).unfold(1, 2, 2))


def test_unfold_is_one_gather_however_many_windows_it_makes() -> None:
    """UnivNet's audio is cut into one window a frame by ``unfold``; torch.onnx's export made a
    Slice and an Unsqueeze per window (62,000 nodes at 3000 frames, which ONNX Runtime took four
    minutes to load). Ours is a strided Slice per position in a small window, or a Gather and a
    Transpose, equal to PyTorch's exactly: 1024 windows make no more nodes than 7."""

    def onnx_nodes(x: torch.Tensor, i: torch.Tensor, model: torch.nn.Module) -> int:
        g = opsched.from_torch(model, (x, i))
        executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
        made = executor([x, i])
        executor.close()
        assert [torch.equal(a, b) for a, b in zip(made, model(x, i), strict=True)] == [True] * len(made)
        assert executor.sessions == 1 and "run with torch" not in executor.describe(), executor.describe()
        return len(_whole(g).proto.graph.node)

    class Long(torch.nn.Module):  # windows of 8 as Slices, of 20 as a Gather
        def forward(self, x: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, ...]:
            return x.unfold(-1, 8, 1) * 2, i.unfold(1, 2, 1), x.unfold(1, 1, 2), x.unfold(2, 20, 3)

    x, i = torch.randn(2, 7, 6, 5), torch.randint(-9, 9, (3, 11))
    onnx_nodes(x, i, _Windows())
    few, many = (onnx_nodes(torch.randn(1, 4, n + 20), torch.randint(-9, 9, (3, 11)), Long()) for n in (7, 1024))
    assert few == many


def _run_contraction(plan: Contraction, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """What the ONNX nodes of ``plan`` compute, in torch: ReduceSum, Transpose, Reshape, MatMul."""
    folded = []
    for k, t in enumerate((x, y)):
        if plan.summed[k]:
            t = t.sum(plan.summed[k])
        folded.append(t.permute(plan.order[k]).reshape(plan.folded[k]))
    return torch.matmul(*folded).reshape(plan.unfolded).permute(plan.to_output)


def test_a_two_operand_einsum_is_planned_as_the_matrix_product_torch_computes() -> None:
    """400 random equations (each label a batch label, one of either operand's size 1 at times,
    contracted, kept by one operand or summed by it alone, in random orders) and ellipses: the
    plan computes torch.einsum's result; equations that are not such a product have none."""
    import random

    rng = random.Random(0)
    for _ in range(400):
        labels = rng.sample("abcdefghij", rng.randint(1, 8))
        kind = {c: rng.choice(("batch", "contracted", "a", "b", "summed a", "summed b")) for c in labels}
        size = {c: rng.randint(1, 4) for c in labels}
        a = [c for c in labels if kind[c] in ("batch", "contracted", "a", "summed a")]
        b = [c for c in labels if kind[c] in ("batch", "contracted", "b", "summed b")]
        out = [c for c in labels if kind[c] in ("batch", "a", "b")]
        for term in (a, b, out):
            rng.shuffle(term)
        shapes = [[1 if kind[c] == "batch" and rng.random() < 0.2 else size[c] for c in term] for term in (a, b)]
        equation = f"{''.join(a)},{''.join(b)}->{''.join(out)}"
        plan = contraction(equation, shapes)
        assert plan is not None, equation
        x, y = (torch.randn(shape, dtype=torch.float64) for shape in shapes)
        torch.testing.assert_close(_run_contraction(plan, x, y), torch.einsum(equation, x, y), rtol=1e-12, atol=1e-12)
    for equation, shapes in [("...ij,...jk->...ik", [(2, 1, 3, 4), (5, 4, 6)]),
                             ("b...,b...->b", [(2, 3, 4), (2, 3, 4)]), ("...i,i->...", [(2, 3, 4), (4,)]),
                             ("i , j -> ij", [(3,), (4,)]), ("i,i->", [(3,), (3,)])]:
        plan = contraction(equation, shapes)
        assert plan is not None, equation
        x, y = (torch.randn(shape, dtype=torch.float64) for shape in shapes)
        torch.testing.assert_close(_run_contraction(plan, x, y), torch.einsum(equation, x, y), rtol=1e-12, atol=1e-12)
    for equation, shapes in [("ij,jk", [(2, 3), (3, 4)]),               # the output implicit
                             ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),  # three operands
                             ("ii,i->i", [(2, 2), (2,)]),                 # a diagonal
                             ("ik,k->i", [(2, 1), (3,)])]:                # a contracted size 1 broadcast
        assert contraction(equation, shapes) is None, equation


class _Einsums(torch.nn.Module):
    """UnivNet's location-variable convolution, a batched product over broadcast ellipses, a sum
    over them, and two einsums left to ONNX's Einsum: an implicit output, three operands."""

    def forward(self, x: torch.Tensor, k: torch.Tensor, m: torch.Tensor, n: torch.Tensor) -> tuple[torch.Tensor, ...]:
        return (torch.einsum("bildsk,biokl->bolsd", x, k), torch.einsum("...ij,...jk->...ik", m, n),
                torch.einsum("b...,b...->b", m, m), torch.einsum("aij,ajk", m[0], n),
                torch.einsum("ij,jk,kl->il", m[0, 0], n[0], n[0].T))


def test_an_einsum_runs_in_the_onnx_runtime_session_as_a_matmul() -> None:
    """ONNX Runtime's Einsum kernel is slow (UnivNet: 3x PyTorch's einsum), so a two-operand
    einsum that is a contraction is exported as Transpose, Reshape and MatMul; the others stay
    Einsum. All of them run in the one session, equal to eager."""
    model = _Einsums()
    x, k = torch.randn(1, 4, 10, 1, 6, 3), torch.randn(1, 4, 5, 3, 10)
    m, n = torch.randn(2, 1, 3, 4), torch.randn(5, 4, 6)
    g = opsched.from_torch(model, (x, k, m, n))
    assert sum(node.attrs.get("target") == "aten::einsum.default" for node in g.nodes) == 5
    ops = [node.op_type for node in _whole(g).proto.graph.node]
    assert ops.count("MatMul") == 3 and ops.count("Einsum") == 2, ops
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    made = executor([x, k, m, n])
    executor.close()
    assert_close(made, list(model(x, k, m, n)))
    assert executor.sessions == 1 and "run with torch" not in executor.describe(), executor.describe()


class _Tiled(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.tile((1, 2, 1, 1)).sin() + x.tile((2,)).sum()


def test_a_composite_whose_symbolic_makes_an_if_exports_as_what_it_is_made_of() -> None:
    """torch.onnx's own ``tile`` makes an If, which a segment cannot hold, so it ran with torch
    between sessions; ``tile`` is made of ``repeat``, whose export is a Tile."""
    model, x = _Tiled(), torch.randn(2, 3, 5, 4)
    g = opsched.from_torch(model, x)
    assert all(exportable(g, n) for n in g.nodes), [(n.name, n.op) for n in g.nodes if not exportable(g, n)]
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    made = executor([x])
    executor.close()
    assert_close(made, [model(x)])
    assert executor.sessions == 1, executor.describe()  # type: ignore[attr-defined]


def _one_node(op_type: str, out_shape: list[int], **attrs: Any) -> onnx.ModelProto:
    """A model of one ONNX node reading ``in0`` (float32 of shape (3, 4)), as torch.onnx names them."""
    from onnx import TensorProto, helper

    inputs = [helper.make_tensor_value_info("in0", TensorProto.FLOAT, [3, 4])]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, out_shape)]
    node = helper.make_node(op_type, ["in0"], ["out"], **attrs)
    return helper.make_model(helper.make_graph([node], op_type, inputs, outputs),
                             opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.mark.parametrize(("export", "call", "why"), [
    (("Sinh", [3, 4]), torch.sinh, ""),
    (("Sinh", [3, 4]), torch.cosh, "torch.onnx's export computes otherwise than the overload on drawn tensors"),
    (("Sinh", [3, 4]), lambda t: torch.sinh(t).T, "torch.onnx's export gives shape (3, 4) where the overload gives "
                                                  "(4, 3)"),
    (("Transpose", [4, 3], {"perm": [-1, 0]}), lambda t: t.T, "ONNX Runtime cannot run torch.onnx's export of it: "),
], ids=["agrees", "computes-otherwise", "another-shape", "refused"])
def test_a_torch_onnx_export_is_checked_against_the_overload(export: tuple[Any, ...], call: Any, why: str) -> None:
    """torch.onnx's export of one call is run by ONNX Runtime on drawn tensors and compared with
    the overload: a symbolic that computes otherwise, gives another shape or makes a model ONNX
    Runtime refuses is refused, with how."""
    from opsched.ir.ops.aten_export import _apart
    from opsched.ir.types import TensorType

    op_type, shape, *attrs = export
    got = _apart(_one_node(op_type, shape, **(attrs[0] if attrs else {})), call, (TensorType((3, 4), "float32"),),
                 fill=0)
    assert got.startswith(why) and (got == why or why.endswith(": ")), got


def test_a_call_whose_export_is_refused_by_the_check_runs_with_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    from opsched.ir.ops import aten_export

    class Exp(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.exp(x).relu()  # a generic node torch.onnx exports, and one of a family of ours

    monkeypatch.setattr(aten_export, "_apart", lambda *args, **kwargs: "torch.onnx's export computes otherwise than "
                                                                 "the overload on drawn tensors")
    aten_export._checked_export.cache_clear()  # signatures checked before, by the real check
    try:
        model, x = Exp(), torch.randn(3, 5)
        g = opsched.from_torch(model, x)
        assert [(n.name, exportable(g, n)) for n in g.nodes] == [("exp", False), ("relu", True)]
        executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())),
                                              RunOptions())
        assert_close(executor([x]), [model(x)])
        assert "1 step run with torch between them: exp (aten.elementwise) (exp: aten::exp.default: torch.onnx's " \
               "export computes otherwise than the overload on drawn tensors)" in executor.describe()
        executor.close()
    finally:
        aten_export._checked_export.cache_clear()  # nothing refused here is kept for later tests


class _RepeatedWrites(torch.nn.Module):
    """Writes that repeat an index: a MoE layer's index_add of its experts' outputs, and an
    accumulating index assignment."""

    def forward(self, x: torch.Tensor, index: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, ...]:
        accumulated = values.sum(-1).clone()
        accumulated.index_put_((index,), values[:, 0] * 0 + 1, accumulate=True)
        return (x.index_add(0, index, values), x.index_add(1, index[:3], x[:, :3], alpha=0.5),
                accumulated, torch.zeros(6).scatter_add(0, index, values[:, 0]))


def test_writes_that_repeat_an_index_add_up_on_the_ort_backend() -> None:
    """torch.onnx's exports of index_add and of an accumulating index_put wrote a repeated index
    once (4.9 off): index_add exports as an adding ScatterElements, index_put runs with torch."""
    model, x = _RepeatedWrites(), torch.randn(6, 5)
    index, values = torch.tensor([1, 4, 1, 1, 0, 4]), torch.randn(6, 5)
    g = opsched.from_torch(model, (x, index, values))
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    made = executor([x, index, values])
    executor.close()
    assert_close(made, list(model(x, index, values)))
    on_torch = executor.describe().split("run with torch between them: ")[1]
    assert "index_put" in on_torch and "index_add" not in on_torch, on_torch

class _Bessel(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.special.bessel_j0(x.relu()) + 1


class _Antialiased(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x.relu(), size=(9, 11), mode="bilinear", antialias=True) + 1


@pytest.mark.parametrize(("model", "target"), [
    (_Bessel(), "aten::special_bessel_j0.default"),  # torch.onnx has no symbolic for it
    (_Antialiased(), "aten::_upsample_bilinear2d_aa.vec"),  # it has one, which fails
])
def test_an_op_torch_onnx_cannot_export_runs_with_torch_and_prints_nothing(
        model: torch.nn.Module, target: str, capfd: pytest.CaptureFixture[str]) -> None:
    x = torch.randn(1, 2, 6, 8)
    g = opsched.from_torch(model, x)
    node = next(n for n in g.nodes if n.attrs.get("target") == target)
    capfd.readouterr()
    assert not exportable(g, node)
    assert capfd.readouterr().out == ""  # torch.onnx's exporter would print the traced graph
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    assert_close(executor([x]), [model(x)])
    assert f"{target}: torch.onnx has no export for it" in executor.describe(), executor.describe()
    executor.close()



def test_a_node_onnx_runtime_has_no_kernel_for_at_its_types_runs_with_torch() -> None:
    """ONNX Runtime's CPU provider has no float64 ``Conv``: the convolution runs with torch, and
    the exponential beside it, which has a float64 kernel, in a session."""
    class ConvAndExp(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 8, 3)

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            return self.conv(x), x.exp()

    model, x = ConvAndExp().double(), torch.randn(1, 3, 12, 12, dtype=torch.float64)
    g = opsched.from_torch(model, x)
    assert sorted((n.op, exportable(g, n)) for n in g.nodes) == [("aten.elementwise", True), ("conv2d", False)]
    executor = get_backend("ort").prepare(g, lower(g, schedule(g, "sequential", host_cpu_model())), RunOptions())
    assert_close(executor([x]), list(model(x)))
    assert isinstance(executor, LaneExecutor) and executor.sessions == 1, executor.describe()
    assert "1 step run with torch between them: conv (conv2d) (conv: ONNX Runtime's CPU provider has no Conv" \
           in executor.describe(), executor.describe()
    executor.close()

class _PoolThenGelu(torch.nn.Module):
    """NASNet's pool (3x3, stride 1, padding not counted) on channels that miss ORT's blocked layout."""

    def __init__(self, gelu: str | None) -> None:
        super().__init__()
        self.conv, self.gelu = torch.nn.Conv2d(3, 11, 1), gelu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.avg_pool2d(self.conv(x), 3, 1, 1, count_include_pad=False).flatten(1)
        return y if self.gelu is None else F.gelu(y, approximate=self.gelu)


@pytest.mark.parametrize("gelu", [None, "tanh"])
def test_segments_are_declared_at_the_oldest_opset_their_nodes_mean_the_same_at(gelu: str | None) -> None:
    """At opset 20 ONNX Runtime ran AveragePool-19's generic loop, about 10x slower than
    AveragePool-11's MLAS kernel here (benchmarks/onnx_forms.py), and NASNet-A mobile's plans with it."""
    import onnx

    from opsched.ir.ops.onnx_builder import OPSET
    from opsched.ir.ops.onnx_opsets import OLDEST

    model, x = _PoolThenGelu(gelu).eval(), torch.randn(1, 3, 8, 8)
    graph = opsched.from_torch(model, x)
    proto = _whole(graph).proto
    onnx.checker.check_model(proto, full_check=True)
    (declared,) = [o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")]
    ops = {n.op_type for n in proto.graph.node}
    assert "AveragePool" in ops and ("Gelu" in ops) == (gelu == "tanh")
    assert declared == (OPSET if gelu == "tanh" else OLDEST)  # Gelu is new in 20: the segment stays there
    module = opsched.optimize(model, x, cost="analytic", backend="ort", scheduler="sequential")
    with torch.no_grad():
        assert_close(module(x), model(x))


def test_a_node_newer_than_the_oldest_opset_keeps_its_segment_where_it_is() -> None:
    """Restated only where it means the same: Reshape-19 and Pad-19 move to 18; Pad's ``wrap``
    mode (19) and ReduceMax over booleans (20) keep the segment at 20."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from opsched.ir.ops.onnx_opsets import declared_oldest

    def segment(pad_mode: str, reduce_bools: bool) -> onnx.ModelProto:
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 4, 4])
        y = helper.make_tensor_value_info("y", TensorProto.BOOL if reduce_bools else TensorProto.FLOAT,
                                          [] if reduce_bools else [1, 72])
        inits = [numpy_helper.from_array(np.array([1, -1], np.int64), "shape"),
                 numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "pads")]
        nodes = [helper.make_node("Pad", ["x", "pads"], ["p"], mode=pad_mode),
                 helper.make_node("Reshape", ["p", "shape"], ["r"])]
        if reduce_bools:
            nodes += [helper.make_node("Cast", ["r"], ["b"], to=TensorProto.BOOL),
                      helper.make_node("ReduceMax", ["b"], ["y"], keepdims=0)]
        else:
            nodes.append(helper.make_node("Relu", ["r"], ["y"]))
        graph = helper.make_graph(nodes, "segment", [x], [y], inits)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])

    for pad_mode, reduce_bools, opset in [("reflect", False, 18), ("wrap", False, 20), ("reflect", True, 20)]:
        proto = declared_oldest(segment(pad_mode, reduce_bools), 20)
        assert [o.version for o in proto.opset_import] == [opset], (pad_mode, reduce_bools)
        onnx.checker.check_model(proto, full_check=True)


class _Pools(torch.nn.Module):
    """Every small max and average pool, side by side, ceil_mode and count_include_pad both ways."""

    def __init__(self) -> None:
        super().__init__()
        self.pools = torch.nn.ModuleList()
        for k in (2, 3):
            for s in (1, 2, 3):
                for p in range(k // 2 + 1):
                    for ceil in (False, True):
                        self.pools.append(torch.nn.MaxPool2d(k, s, p, ceil_mode=ceil))
                        for include in (False, True):
                            self.pools.append(torch.nn.AvgPool2d(k, s, p, ceil_mode=ceil, count_include_pad=include))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        # each pool read by a node that ONNX Runtime types from it, beside a value of PyTorch's size
        return tuple(torch.cat([y, y.relu()], 1) for y in (pool(x) for pool in self.pools))


@pytest.mark.parametrize("size", [(5, 6), (7, 17), (19, 37)])
def test_pools_with_ceil_mode_run_on_onnx_runtime_at_pytorchs_sizes_and_values(size: tuple[int, int]) -> None:
    """ONNX's shape inference keeps a last window that starts in the padding, which PyTorch and
    ONNX Runtime drop: a session declaring PyTorch's sizes was refused ("Can't merge shape info",
    fuzz seed 1022). Pools are written without ceil_mode, their end padded to PyTorch's size, and
    averages that count padding are scaled to PyTorch's divisors."""
    model, x = _Pools().eval(), torch.randn(1, 2, *size)
    module = opsched.optimize(model, x, backend="ort", scheduler="sequential", cost="analytic", verify=False)
    with torch.no_grad():
        got, want = module(x), model(x)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.shape == w.shape, (i, model.pools[i])
        assert_close(g, w, f"{model.pools[i]}")


# --- weights held apart from ONNX models -------------------------------------------------------------
class _Embedded(torch.nn.Module):
    """An embedding and two heads read by a reshape: weights of every size, and a small shape."""

    def __init__(self, rows: int = 300, width: int = 64) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(rows, width)
        self.a, self.b = torch.nn.Linear(width, 8), torch.nn.Linear(width, 8)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        h = self.emb(ids)
        return (self.a(h) + self.b(h).relu()).reshape(-1, 4)


def test_a_segment_holds_its_weights_apart_and_keeps_its_small_constants() -> None:
    from onnx import numpy_helper

    from opsched.ir.ops.onnx_session import INLINE_BYTES

    model, ids = _Embedded().eval(), torch.randint(0, 300, (1, 16))
    graph = opsched.from_torch(model, ids)
    exported = _whole(graph)
    inits = {t.name: t for t in exported.proto.graph.initializer}
    apart = {n for n, t in inits.items() if t.data_location == onnx.TensorProto.EXTERNAL}
    assert apart == set(exported.weights) and len(apart) == 3  # the table and the heads' matrices
    for name in apart:
        assert not inits[name].raw_data and tuple(inits[name].dims) == exported.weights[name].shape
    inline = [numpy_helper.to_array(t) for n, t in inits.items() if n not in apart]
    assert inline and all(a.nbytes <= INLINE_BYTES for a in inline)
    held = {tuple(a.shape): a for a in exported.weights.values()}
    assert np.array_equal(held[(300, 64)], model.emb.weight.detach().numpy())
    module = opsched.optimize(model, ids, backend="ort", scheduler="sequential", cost="analytic", verify=False)
    with torch.no_grad():
        assert_close(module(ids), model(ids))


def test_a_model_past_protobufs_limit_is_loaded_with_its_weights_held_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """protobuf serializes no message of 2 GiB or more; the limit is lowered here to show the
    path a model of that size takes, and that it computes what the whole model computes."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    from opsched.ir.ops import onnx_session
    from opsched.ir.ops.onnx_session import fits, inference_session, tensor_bytes

    rng = np.random.default_rng(0)
    w, b = rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal(32).astype(np.float32)
    shape = np.array([4, -1], np.int64)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["s"]),
         helper.make_node("Reshape", ["s", "shape"], ["y"])], "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 16])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b"), numpy_helper.from_array(shape, "shape")])
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    assert [tensor_bytes(t) for t in proto.graph.initializer] == [len(t.raw_data) for t in proto.graph.initializer]
    x = rng.standard_normal((2, 64)).astype(np.float32)
    whole = inference_session(proto, ort.SessionOptions()).run(None, {"x": x})[0]
    assert OnnxModel.of(proto).proto is proto  # it fits: loaded as it is

    monkeypatch.setattr(onnx_session, "PROTO_LIMIT", proto.ByteSize() - 1)
    assert not fits(proto)
    apart = OnnxModel.of(proto)
    assert set(apart.weights) == {"w"}  # the bias (128 bytes) and the shape stay in the model
    assert [t.data_location for t in apart.proto.graph.initializer] == [onnx.TensorProto.EXTERNAL, 0, 0]
    assert proto.graph.initializer[0].raw_data  # the model given is left as it was
    got = inference_session(proto, ort.SessionOptions()).run(None, {"x": x})[0]
    assert np.array_equal(got, whole)


@pytest.mark.slow
def test_a_model_of_more_than_2_gib_of_weights_runs_on_onnx_runtime_from_torch_and_from_its_onnx_file(
        tmp_path: Path) -> None:
    """2.2 GiB of float32 in one embedding: protobuf could neither copy its table into a graph nor
    serialize a segment holding it. About 10 GB of memory at its peak."""
    torch.manual_seed(0)
    model, ids = _Embedded(140_000, 4096).eval(), torch.randint(0, 140_000, (1, 16))
    with torch.no_grad():
        want = model(ids)
    module = opsched.optimize(model, ids, backend="ort", cost="analytic")
    with torch.no_grad():
        assert_close(module(ids), want)
    del module
    path = tmp_path / "big.onnx"
    torch.onnx.export(model, (ids,), str(path), input_names=["ids"])
    assert (tmp_path / "big.onnx.data").stat().st_size > 2**31
    from_file = opsched.optimize_graph(opsched.from_onnx(path), backend="ort", cost="analytic")
    with torch.no_grad():
        assert_close(from_file(ids), want)

"""torchvision's and timm's models (:mod:`opsched.testing.vision`), whole, as users bring them:
the torch import leaves nothing opaque; the greedy plan on both CPU backends, the IOS plan and
``torch.compile(backend="opsched")`` (every graph scheduled) are as near the model's float64
outputs as eager's own float32 ones (:func:`assert_as_true_as_eager`); the ``torch.onnx`` export
imports and runs as near them as ONNX Runtime's own session of it; on a GPU, ``optimize()`` in float16 is as
near float64's outputs as eager's float16 ones.

Skipped where torchvision does not import (this repository's CPU machine and CI: see the corpus
module); ``--runslow`` adds the slow models (MViT, NASNet-A large, PNASNet-5 large)."""

from __future__ import annotations

import copy
import functools
from typing import Any

import pytest
import torch

import opsched
import opsched.dynamo
from opsched.costing import host_cpu_model
from opsched.testing import assert_as_true_as_eager
from opsched.testing.export import export_onnx
from opsched.testing.vision import vision_available, vision_corpus

pytestmark = pytest.mark.skipif(not vision_available(), reason="needs torchvision (and timm for its models)")

VISION = vision_corpus() if vision_available() else {}
CASES = [pytest.param(name, marks=pytest.mark.slow) if entry.slow else name for name, entry in VISION.items()]
CPU = host_cpu_model()


@functools.cache
def _built(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], Any, Any]:
    """The model, its inputs, its eager float32 outputs, and the truth: its outputs in float64."""
    model, inputs = VISION[name].build()
    with torch.no_grad():
        truth = copy.deepcopy(model).double()(*(t.double() for t in inputs))
        return model, inputs, model(*inputs), truth


@functools.cache
def _graph(name: str) -> opsched.Graph:
    model, inputs, _, _ = _built(name)
    return opsched.from_torch(model, inputs)


@pytest.mark.parametrize("name", CASES)
def test_torch_import_leaves_nothing_opaque(name: str) -> None:
    assert [n.name for n in _graph(name).nodes if n.op == "opaque"] == []


@pytest.mark.parametrize(("scheduler", "backend"), [("greedy", "torch"), ("greedy", "ort"), ("ios", "ort")])
@pytest.mark.parametrize("name", CASES)
def test_the_plans_equal_eager(name: str, scheduler: str, backend: str) -> None:
    _, inputs, expected, truth = _built(name)
    options = {"budget_s": 5.0} if scheduler == "ios" else {}
    module = opsched.optimize_graph(_graph(name), cost=CPU, scheduler=scheduler, backend=backend, check=False,
                                    progress=False, **options)
    assert_as_true_as_eager(module(*inputs), expected, truth, f"{name} / {scheduler} / {backend}")


@pytest.mark.parametrize("name", CASES)
def test_torch_compile_with_the_opsched_backend_equals_eager(name: str) -> None:
    model, inputs, expected, truth = _built(name)
    torch._dynamo.reset()
    opsched.dynamo.reset()
    compiled = torch.compile(model, backend="opsched", options={
        "scheduler": "greedy", "cost": "analytic", "verify": False, "fallback": False, "progress": False,
        "schedule_cache": False})
    with torch.no_grad():
        got = compiled(*inputs)
    assert_as_true_as_eager(got, expected, truth, name)
    graphs = opsched.dynamo.compiled_graphs()
    assert graphs and all(b.schedule is not None for g in graphs for b in g.buckets), opsched.dynamo.report()


@pytest.mark.parametrize("name", CASES)
def test_the_onnx_export_imports_and_runs_equal_to_onnx_runtime(name: str) -> None:
    """The model as users ship it: ``torch.onnx.export``'s file, imported with nothing opaque, its
    greedy plan on ONNX Runtime as near the model's float64 outputs as ONNX Runtime's own session
    of the file."""
    import onnxruntime

    model, inputs, _, truth = _built(name)
    proto, exporter = export_onnx(model, inputs)
    session = onnxruntime.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    want = session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs, strict=True)})
    graph = opsched.from_onnx(proto)
    assert [n.name for n in graph.nodes if n.op == "opaque"] == []
    module = opsched.optimize_graph(graph, cost=CPU, scheduler="greedy", backend="ort", check=False, progress=False)
    assert_as_true_as_eager(module(*inputs), [torch.from_numpy(w) for w in want], truth, f"{name} ({exporter})")


@pytest.mark.gpu
@pytest.mark.parametrize("name", CASES)
def test_on_a_gpu_in_float16_optimize_equals_eager(name: str) -> None:
    """The IOS plan (analytic costs: no race) on CUDA streams captured into a CUDA graph, against
    the same model's eager float16 run."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    model, inputs, _, truth = _built(name)
    model, inputs = copy.deepcopy(model).cuda().half(), tuple(t.cuda().half() for t in inputs)
    with torch.no_grad():
        expected = model(*inputs)
    module = opsched.optimize(model, inputs, scheduler="ios", cost="analytic", verify=False, progress=False)
    assert_as_true_as_eager(module(*inputs), expected, truth, name)

"""Every zoo model through both frontends equals the eager module (fp32, opsched.testing tolerance)."""

from __future__ import annotations

import io

import onnx
import pytest
import torch

from opsched import from_onnx, from_torch
from opsched.errors import ModelNotFoundError
from opsched.ir.analysis import width
from opsched.models import example_inputs, get_model, list_models
from opsched.runtime import run_graph
from opsched.testing import assert_close

ZOO = list_models()


@pytest.fixture(scope="module", params=ZOO)
def zoo_case(request: pytest.FixtureRequest) -> tuple[str, torch.nn.Module, tuple[torch.Tensor, ...], torch.Tensor]:
    name = request.param
    model, inputs = get_model(name), example_inputs(name)
    with torch.no_grad():
        expected = model(*inputs)
    return name, model, inputs, expected


def test_zoo_from_torch_equals_eager(zoo_case) -> None:  # type: ignore[no-untyped-def]
    name, model, inputs, expected = zoo_case
    graph = from_torch(model, inputs, name=name)
    assert not [n for n in graph.nodes if n.op in ("opaque", "batch_norm", "identity")], \
        "zoo models convert fully, with every batch norm folded"
    assert_close(run_graph(graph, inputs), [expected], f"{name} via torch.fx")


def test_zoo_onnx_round_trip_equals_eager(zoo_case, tmp_path) -> None:  # type: ignore[no-untyped-def]
    name, model, inputs, expected = zoo_case
    path = tmp_path / f"{name}.onnx"
    torch.onnx.export(model, inputs, str(path), dynamo=False, opset_version=17, input_names=["image"])
    graph = from_onnx(path, name=name)
    assert not [n for n in graph.nodes if n.op in ("opaque", "batch_norm")]
    assert_close(run_graph(graph, inputs), [expected], f"{name} via ONNX")


def test_zoo_models_are_seeded_and_in_eval_mode() -> None:
    a, b = get_model("squeezenet1_1"), get_model("squeezenet1_1")
    assert not a.training
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert not torch.equal(next(get_model("squeezenet1_1", seed=1).parameters()), next(a.parameters()))


def test_zoo_structure_matches_the_papers() -> None:
    """Exact operator counts and widths of the canonical graphs (see each model's docstring)."""
    inception = from_torch(get_model("inception_v3"), example_inputs("inception_v3"))
    ops = [n.op for n in inception.nodes]
    assert ops.count("conv2d") == 94 and ops.count("concat") == 15
    assert ops.count("max_pool2d") + ops.count("avg_pool2d") + ops.count("adaptive_avg_pool2d") == 14
    assert width(inception) == 6  # IOS reports a maximum stage width of 6 for Inception V3
    resnet = from_torch(get_model("resnet50"), example_inputs("resnet50"))
    assert [n.op for n in resnet.nodes].count("conv2d") == 53 and width(resnet) == 2


def test_unknown_model_name() -> None:
    with pytest.raises(ModelNotFoundError, match="no zoo model 'inception_v9'; available: inception_v3"):
        get_model("inception_v9")


def test_batch_size_is_part_of_the_graph() -> None:
    g = from_torch(get_model("squeezenet1_1"), example_inputs("squeezenet1_1", batch=3))
    assert g.inputs[0].type.shape == (3, 3, 224, 224) and g.types[g.outputs[0]].shape == (3, 1000)


def test_onnx_export_bytes_import_without_file() -> None:
    model, inputs = get_model("squeezenet1_1"), example_inputs("squeezenet1_1")
    buf = io.BytesIO()
    torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=13)
    graph = from_onnx(onnx.load_from_string(buf.getvalue()))
    with torch.no_grad():
        assert_close(run_graph(graph, inputs), [model(*inputs)])

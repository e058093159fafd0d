from __future__ import annotations

import subprocess
import sys

import pytest

from opsched.cli.main import main


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
    assert float(race[kept][0]) == min(float(cells[0]) for cells in race.values())
    assert f"scheduled by {kept}" in text and "as fast as eager PyTorch" in text
    assert (out / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    trace = json.loads((out / "trace.json").read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert spans and all(e["dur"] >= 0 and "tid" in e for e in spans)
    assert json.loads((out / "schedule.json").read_text())["graph"] == "squeezenet1_1"


def test_optimize_command_on_an_onnx_file(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    import torch

    from opsched.models import example_inputs, get_model

    path = tmp_path / "m.onnx"
    torch.onnx.export(get_model("squeezenet1_1"), example_inputs("squeezenet1_1"), str(path), dynamo=False)
    assert main(["optimize", str(path), "--cost", "analytic", "--rounds", "1", "--out", str(tmp_path / "o")]) == 0
    assert "eager PyTorch" not in capsys.readouterr().out  # no module to compare with, for a file


def test_bad_model_spec_is_a_clean_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["optimize", "no_such_model", "--cost", "analytic"]) == 1
    assert "is not a zoo model" in capsys.readouterr().err


def test_the_options_reference_page_is_current(capsys: pytest.CaptureFixture[str]) -> None:
    """docs/options.md is what the code says: regenerate it with ``opsched options --markdown``."""
    from pathlib import Path

    assert main(["options", "--markdown"]) == 0
    page = Path(__file__).resolve().parent.parent / "docs" / "options.md"
    assert capsys.readouterr().out == page.read_text(), "docs/options.md is stale: opsched options --markdown"

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

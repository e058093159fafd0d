"""What every benchmark writes beside its figures: machine, versions, the command."""

from __future__ import annotations

import json
import os
import platform
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def environment() -> dict[str, str]:
    import numpy
    import torch

    import opsched
    from opsched.cost.measured import cpu_model_name

    return {"machine": f"{cpu_model_name()}, {os.cpu_count()} cores", "python": platform.python_version(),
            "torch": torch.__version__, "numpy": numpy.__version__, "opsched": opsched.__version__,
            "platform": platform.platform()}


def command() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:])


def write(name: str, markdown: str, data: dict[str, Any]) -> tuple[Path, Path]:
    RESULTS.mkdir(parents=True, exist_ok=True)
    md, js = RESULTS / f"{name}.md", RESULTS / f"{name}.json"
    env = environment()
    footer = ["", "## Environment", "", *(f"- {k}: {v}" for k, v in env.items()),
              f"- command: `{command()}`", ""]
    md.write_text(markdown.rstrip() + "\n" + "\n".join(footer))
    js.write_text(json.dumps({"environment": env, "command": command(), **data}, indent=1) + "\n")
    return md, js

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

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return {"machine": f"{cpu}, {os.cpu_count()} cores", "python": platform.python_version(),
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

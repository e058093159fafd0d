"""What every benchmark writes beside its figures: machine, versions, the command."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results"


def geomean(values: Iterable[float]) -> float:
    """The geometric mean (NaN for no values): how every benchmark sums up ratios."""
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


def iqr(values: Iterable[float]) -> float:
    """The interquartile range: how every benchmark gives the spread beside a median."""
    import numpy as np

    return float(np.subtract(*np.percentile(list(values), [75, 25])))


def each_model(models: Iterable[str], run: Callable[[str], tuple[list[object], dict[str, Any]]]
               ) -> tuple[list[list[object]], list[dict[str, Any]]]:
    """``run`` on every model in turn: its table rows and its records, each row echoed as it comes
    (a long run shows its progress, and a run cut short has said what it measured)."""
    rows, records = [], []
    for name in models:
        row, record = run(name)
        rows.append(row)
        records.append(record)
        print(" | ".join(map(str, row)), flush=True)
    return rows, records


#: The corpora of third-party models a benchmark may take (``--corpus``): what each is, in a
#: results page's words.
CORPORA = {
    "corpus": "Hugging Face `transformers` models built from shrunk configs (random weights made to look trained; "
              "`opsched.testing.corpus`)",
    "wide": "Hugging Face `transformers` architectures beyond the corpus (`opsched.testing.corpus.wide_corpus`, "
            "random weights made to look trained, shrunk configs)",
    "vision": "torchvision's and timm's own model definitions, whole (`opsched.testing.vision.vision_corpus`, "
              "random weights made to look trained, each at its library's input size)",
}


def corpus_models(kind: str) -> dict[str, Any]:
    """The :data:`CORPORA` entry ``kind``'s models (``CorpusModel``), by name; the vision corpus's
    where torchvision imports (raises ``SystemExit`` saying so where it does not)."""
    from opsched.testing.corpus import corpus, wide_corpus
    from opsched.testing.vision import vision_corpus

    models = {"corpus": corpus, "wide": wide_corpus, "vision": vision_corpus}[kind]()
    if not models:
        raise SystemExit(f"the {kind} corpus is empty here: it needs torchvision (and timm for its models)")
    return models


def corpus_model(name: str) -> Any:
    """A model of any corpus by its name (the vision corpus's are ``torchvision/...``, ``timm/...``)."""
    return corpus_models("vision" if "/" in name else "corpus" if name in corpus_models("corpus") else "wide")[name]


def placed_model(name: str, device: str = "cpu", dtype: str = "float32") -> tuple[Any, tuple[Any, ...]]:
    """A zoo or corpus (wide or vision corpus too) model in eval mode, and its example inputs, on
    ``device`` in ``dtype`` (its floating-point tensors): how the torch.compile benchmarks hand a
    model over, since the backend runs a model where, and in the precision, it is given."""
    import torch

    from opsched.models import MODELS, example_inputs, get_model

    if name in MODELS:
        model, inputs = get_model(name), tuple(example_inputs(name))
    else:
        model, inputs = corpus_model(name).build()
    kind = getattr(torch, dtype)
    inputs = tuple(t.to(device, kind if t.is_floating_point() else t.dtype) for t in inputs)
    return model.eval().to(device, kind), inputs


def environment() -> dict[str, str]:
    import numpy
    import torch

    import opsched
    from opsched.backends import cpu_model_name

    env = {"machine": f"{cpu_model_name()}, {os.cpu_count()} cores", "python": platform.python_version(),
           "torch": torch.__version__, "numpy": numpy.__version__, "opsched": opsched.__version__,
           "platform": platform.platform()}
    if "torchvision" in sys.modules:  # the vision corpus's models were run: whose definitions, and how whole
        import torchvision.extension

        env["torchvision"] = torchvision.__version__ + ("" if torchvision.extension._has_ops() else
                                                        " (its compiled ops did not load: its models' Python alone)")
    if "timm" in sys.modules:
        env["timm"] = sys.modules["timm"].__version__
    if "transformers" in sys.modules:  # a corpus of its architectures was built: whose definitions
        env["transformers"] = sys.modules["transformers"].__version__
    if torch.cuda.is_available():
        from opsched.backends.cuda import gpu_fingerprint, gpu_versions

        env["gpu"] = gpu_fingerprint(torch.device("cuda", torch.cuda.current_device()))
        env["gpu libraries"] = gpu_versions()
    return env


def command() -> str:
    return "python " + " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:])


def write(name: str, markdown: str, data: dict[str, Any], out: Path = RESULTS) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    md, js = out / f"{name}.md", out / f"{name}.json"
    env = environment()
    footer = ["", "## Environment", "", *(f"- {k}: {v}" for k, v in env.items()),
              f"- command: `{command()}`", ""]
    md.write_text(markdown.rstrip() + "\n" + "\n".join(footer))
    js.write_text(json.dumps({"environment": env, "command": command(), **data}, indent=1) + "\n")
    return md, js


def write_table(name: str, intro: list[str], headers: list[str], rows: list[list[object]],
                geo: dict[str, float], data: dict[str, Any], out: Path = RESULTS) -> None:
    """A results page of one table and its geometric means (``intro`` its title and text lines),
    written by :func:`write` into ``out`` with ``data`` and the means beside it, and echoed to
    the terminal."""
    from opsched.cli.table import format_table

    md = "\n".join([*intro, "", format_table(headers, rows, markdown=True), "",
                    "Geometric means: " + ", ".join(f"{k} {v:.2f}x" for k, v in geo.items()) + "."])
    md_path, js_path = write(name, md, {**data, "geomean": geo}, out)
    print(format_table(headers, rows))
    print("geomean:", geo)
    print(f"wrote {md_path} and {js_path}")


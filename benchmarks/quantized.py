"""Quantized ONNX files, as ONNX Runtime's own tools write them, through opsched on this CPU.

Per model: its ONNX export quantized by ``onnxruntime.quantization``, dynamically
(``quantize_dynamic``: int8 weights, activations quantized at run time; the transformers) or
statically in the QDQ format (``quantize_static``, calibrated on random inputs; the CNNs). The
file is imported with ``opsched.from_onnx`` and scheduled by ``opsched.optimize_graph`` with its
defaults (IOS, measured cost model, the race), into a fresh profile store.

Columns: the import's nodes and schedule units, and how many of those nodes read nothing and
joined their reader's unit (weights' DequantizeLinear, scales, initializer operands: as free
units each would double the IOS states of its part; see ``opsched.schedulers.units``); the IOS
search (states, parts solved of all, seconds) and the whole ``optimize_graph`` call; the largest
difference from ONNX Runtime's own session of the same file (0: the same integer kernels), and
the ONNX Runtime sessions of the plan ``optimize_graph`` kept; and
latency, median ms over interleaved rounds, of ORT's own session against the module opsched
returns, with their median per-round ratio.

    python benchmarks/quantized.py
    python benchmarks/quantized.py --models bert squeezenet1_1 --rounds 9
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from _report import RESULTS, geomean, write_table  # noqa: E402

import opsched  # noqa: E402
from opsched.models import example_inputs, get_model, list_models  # noqa: E402
from opsched.schedulers import UnitGraph  # noqa: E402
from opsched.testing.corpus import corpus  # noqa: E402
from opsched.testing.export import export_onnx  # noqa: E402
from opsched.timing import interleave, paired_ratio  # noqa: E402

#: Corpus transformers, quantized dynamically; zoo CNNs, statically (QDQ).
DYNAMIC = ("bert", "vit", "gpt2")
STATIC = ("squeezenet1_1", "resnet18", "googlenet")
HEADERS = ["model", "quantized", "nodes / units", "joined their reader", "IOS states", "parts solved",
           "search s", "optimize s", "sessions", "max diff vs ORT", "ORT own ms", "opsched ms", "opsched vs ORT"]


def quantized_file(name: str, folder: Path) -> tuple[Path, str, tuple[torch.Tensor, ...]]:
    """``name``'s ONNX export, quantized: the file, how, and inputs to run it on."""
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_dynamic,
        quantize_static,
    )

    plain, out = folder / f"{name}.onnx", folder / f"{name}-int8.onnx"
    if name in corpus():
        model, inputs = corpus()[name].build()
        proto, _ = export_onnx(model, inputs)
        onnx.save(proto, plain)
        quantize_dynamic(plain, out, weight_type=QuantType.QInt8)
        return out, "dynamic", inputs
    inputs = example_inputs(name)
    proto, _ = export_onnx(get_model(name).eval(), inputs, 17, torchscript=True)  # a float input named input.1
    onnx.save(proto, plain)
    feed = proto.graph.input[0].name
    gen = np.random.default_rng(0)

    class Calibration(CalibrationDataReader):
        def __init__(self) -> None:
            self.left = 4

        def get_next(self) -> dict[str, np.ndarray] | None:
            self.left -= 1
            return {feed: gen.standard_normal(tuple(inputs[0].shape)).astype(np.float32)} if self.left >= 0 else None

    quantize_static(plain, out, Calibration(), quant_format=QuantFormat.QDQ, weight_type=QuantType.QInt8)
    return out, "QDQ", inputs


def run(name: str, rounds: int, budget: float, folder: Path) -> tuple[list[object], dict[str, Any]]:
    path, how, inputs = quantized_file(name, folder)
    graph = opsched.from_onnx(str(path))
    ug = UnitGraph.build(graph)
    # what the units absorbed: the nodes that read nothing in a unit of several (read off the
    # units, not the rule that made them again)
    joined = sum(1 for unit in ug.units if len(unit) > 1 for v in unit if not graph.node(v).inputs)
    t = time.perf_counter()
    module = opsched.optimize_graph(graph, cache_dir=str(folder / "store"), budget_s=budget, progress=False)
    optimize_s = time.perf_counter() - t
    report = module.report()  # the IOS search's figures, whether its plan won the race or lost it
    stats = dict(next(s for s in (report.schedule, *report.outcome.searched) if s.scheduler == "ios").stats)
    sessions = getattr(module.executor, "sessions", 0)  # ONNX Runtime sessions of the kept plan
    own = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(own.get_inputs(), inputs)}
    want = own.run(None, feeds)
    with torch.no_grad():
        got = module(*inputs)
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    diff = max(float(np.abs(g.numpy().astype(np.float64) - w).max()) for g, w in zip(got, want, strict=True))
    with torch.no_grad():
        times = interleave({"ORT": lambda: own.run(None, feeds), "opsched": lambda: module(*inputs)}, rounds,
                           warmup=1, settle_s=0.05, block=5)
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = paired_ratio(times["ORT"], times["opsched"])
    solved = f"{stats.get('parts_solved', 0) + stats.get('parts_reused', 0)} / {stats.get('parts', 0)}"
    record = {"model": name, "quantized": how, "nodes": len(graph.nodes), "units": len(ug), "joined": joined,
              "scheduler": module.schedule.scheduler, "ios_stats": stats, "optimize_s": optimize_s,
              "sessions": sessions, "max_diff": diff, "median_ms": med, "opsched_vs_ort": ratio}
    row = [name, how, f"{len(graph.nodes)} / {len(ug)}", joined, stats.get("states", ""), solved,
           f"{stats.get('seconds', float('nan')):.2f}", f"{optimize_s:.1f}", sessions, f"{diff:.1e}",
           f"{med['ORT']:.2f}", f"{med['opsched']:.2f}", f"{ratio:.2f}"]
    return row, record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=[*DYNAMIC, *STATIC],
                   help="corpus models (quantized dynamically) and zoo models (statically, QDQ)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--budget", type=float, default=60.0, help="IOS search seconds (optimize_graph's default)")
    p.add_argument("--name", default="quantized")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the results page goes")
    args = p.parse_args()
    known = {*corpus(), *list_models()}
    if unknown := [m for m in args.models if m not in known]:
        p.error(f"not a corpus or zoo model: {', '.join(unknown)}")
    rows, records = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models:
            row, record = run(name, args.rounds, args.budget, Path(tmp))
            print("  " + " | ".join(map(str, row)), flush=True)
            rows.append(row)
            records.append(record)
    paragraphs = (__doc__ or "").split("\n\n")
    intro = ["# Quantized ONNX files through opsched on this CPU", "", paragraphs[1].replace("\n", " "), "",
             paragraphs[2].replace("\n", " ")]
    geo = {"opsched vs ORT": geomean(r["opsched_vs_ort"] for r in records)}
    write_table(args.name, intro, HEADERS, rows, geo, {"rows": records}, args.out)


if __name__ == "__main__":
    main()

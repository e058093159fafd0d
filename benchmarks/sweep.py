"""The sweep: the wide corpus (:func:`opsched.testing.corpus.wide_corpus`, 75 Hugging Face
architectures beyond the corpus), or with ``--corpus vision`` torchvision's and timm's models
(:func:`opsched.testing.vision.vision_corpus`, where they import), through every way a user
brings a model, on this CPU.

Per model: ``opsched.optimize`` with its defaults (its own check against the model included) and
the largest difference of its outputs from eager PyTorch's; ``torch.compile(model,
backend="opsched")``, the graphs Dynamo captured and how many of them run eagerly; the model's ``torch.onnx`` export
(the dynamo exporter) imported with ``opsched.from_onnx``, its sequential plan on ONNX Runtime
and the largest difference from ONNX Runtime's own session of the file; and the same for the
TorchScript exporter at an older opset (``--torchscript-opset``), the files older tools wrote.
A failure is the first line of its error, marked *exporter* where torch.onnx itself could not
write the file, *file* where it wrote one that ONNX Runtime's own session refuses, and *opsched*
where opsched failed. No timings: what runs, and how exactly.

    python benchmarks/sweep.py
    python benchmarks/sweep.py --models bit mamba --torchscript-opset 13
    python benchmarks/sweep.py --corpus vision --name vision-sweep     # needs torchvision and timm
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from _report import CORPORA, corpus_models, write  # noqa: E402

import opsched  # noqa: E402
import opsched.dynamo  # noqa: E402
from opsched._text import first_line  # noqa: E402
from opsched.cli.table import format_table  # noqa: E402
from opsched.compare import largest_difference  # noqa: E402
from opsched.costing import host_cpu_model  # noqa: E402
from opsched.testing import tensors  # noqa: E402
from opsched.testing.export import export_onnx  # noqa: E402


def torch_path(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], budget_s: float) -> dict[str, Any]:
    start = time.perf_counter()
    module = opsched.optimize(model, inputs, budget_s=budget_s, progress=False)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        diff = max(largest_difference(a, e) for a, e in zip(tensors(module(*inputs)), tensors(model(*inputs)),
                                                            strict=True))
    graph = module.graph
    return {"operators": len(graph.nodes), "opaque": sum(n.op == "opaque" for n in graph.nodes),
            "max_diff": diff, "optimize_s": seconds, "scheduler": module.schedule.scheduler}


def compile_path(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], budget_s: float) -> dict[str, Any]:
    torch._dynamo.reset()
    opsched.dynamo.reset()
    options = {"budget_s": budget_s, "progress": False, "schedule_cache": False}  # searched each run, as optimize()
    compiled = torch.compile(model, backend="opsched", options=options)
    start = time.perf_counter()
    with torch.no_grad():
        got = compiled(*inputs)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        diff = max(largest_difference(a, e) for a, e in zip(tensors(got), tensors(model(*inputs)), strict=True))
    graphs = opsched.dynamo.compiled_graphs()
    eager = [b.fallback for g in graphs for b in g.buckets if b.schedule is None]
    return {"graphs": len(graphs), "eager": len(eager), "why": first_line(eager[0]) if eager else None,
            "max_diff": diff, "compile_s": seconds}


def onnx_path(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], opset: int | None,
              torchscript: bool) -> dict[str, Any]:
    try:
        proto, exporter = export_onnx(model, inputs, opset, torchscript=torchscript)
    except Exception as e:  # noqa: BLE001 (torch.onnx raises many types)
        return {"failed": "exporter", "error": first_line(e)}
    try:
        session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as e:  # noqa: BLE001 (ONNX Runtime raises its own types)
        return {"failed": "file", "error": f"ONNX Runtime refuses the file: {first_line(e)}"}
    want = session.run(None, {i.name: t.numpy() for i, t in zip(session.get_inputs(), inputs)})
    graph = opsched.from_onnx(proto)
    module = opsched.optimize_graph(graph, cost=host_cpu_model(), scheduler="sequential", backend="ort", check=False)
    got = module(*inputs)
    got = list(got) if isinstance(got, (list, tuple)) else [got]
    diff = max(float(np.abs(a.numpy().astype(np.float64) - w).max()) for a, w in zip(got, want, strict=True))
    return {"exporter": exporter, "opset": max(o.version for o in proto.opset_import if not o.domain),
            "inputs": [i.name for i in proto.graph.input][:len(inputs)], "operators": len(graph.nodes),
            "sessions": module.executor.sessions, "max_diff": diff}


def attempt(call: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    try:
        return call()
    except Exception as e:  # noqa: BLE001 (the sweep records every failure and goes on)
        return {"failed": "opsched", "error": f"{type(e).__name__}: {first_line(e)}"}


def cell(r: dict[str, Any], text: Callable[[dict[str, Any]], str], failure: bool = True) -> str:
    """``text(r)``, or where that path failed, whose failure it was and why (or nothing)."""
    if "failed" in r:
        return f"{r['failed']}: {r['error'][:120]}" if failure else ""
    return text(r)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", choices=["wide", "vision"], default="wide")
    p.add_argument("--models", nargs="*", help="default: the corpus's models, its slow ones too")
    p.add_argument("--torchscript-opset", type=int, default=17)
    p.add_argument("--budget", type=float, default=2.0, help="seconds of IOS search per model in optimize()")
    p.add_argument("--name", default="sweep")
    args = p.parse_args()
    entries = corpus_models(args.corpus)
    args.models = args.models or list(entries)
    title = "the wide corpus" if args.corpus == "wide" else "torchvision's and timm's models"
    rows, records = [], []
    for name in args.models:
        model, inputs = entries[name].build()
        record = {"model": name, "architecture": entries[name].architecture,
                  "torch": attempt(functools.partial(torch_path, model, inputs, args.budget)),
                  "compile": attempt(functools.partial(compile_path, model, inputs, args.budget)),
                  "dynamo": attempt(functools.partial(onnx_path, model, inputs, None, torchscript=False)),
                  "torchscript": attempt(functools.partial(onnx_path, model, inputs, args.torchscript_opset,
                                                           torchscript=True))}
        records.append(record)
        t, c, d, s = record["torch"], record["compile"], record["dynamo"], record["torchscript"]
        rows.append([name, record["architecture"],
                     cell(t, lambda r: f"{r['operators']} / {r['opaque']}"),
                     cell(t, lambda r: f"{r['max_diff']:.1e}", False),
                     cell(t, lambda r: f"{r['optimize_s']:.1f}", False),
                     cell(c, lambda r: f"{r['graphs']} / {r['eager']}" + (f" ({r['why'][:120]})" if r["why"] else "")),
                     cell(c, lambda r: f"{r['max_diff']:.1e}", False),
                     cell(d, lambda r: f"{r['exporter']} {r['opset']}: {r['operators']} / {r['sessions']}"),
                     cell(d, lambda r: f"{r['max_diff']:.1e}", False),
                     cell(s, lambda r: f"{r['operators']} / {r['sessions']}, inputs {', '.join(r['inputs'])}"),
                     cell(s, lambda r: f"{r['max_diff']:.1e}", False)])
        print(" | ".join(map(str, rows[-1])), flush=True)
    ok = {path: sum("failed" not in r[path] for r in records) for path in ("torch", "compile", "dynamo", "torchscript")}
    whole = sum(r["compile"].get("eager") == 0 for r in records)
    exporter = sum(r["torchscript"].get("failed") in ("exporter", "file") for r in records)
    headers = ["model", "architecture", "torch: ops / opaque", "optimize() vs eager, max diff", "optimize s",
               "torch.compile: graphs / run eagerly", "vs eager, max diff",
               "dynamo ONNX: ops / sessions", "vs ORT, max diff", f"TorchScript opset {args.torchscript_opset}: "
               "ops / sessions", "vs ORT, max diff"]
    summary = (f"Of {len(records)} models: `optimize()` ran {ok['torch']}; `torch.compile(backend='opsched')` ran "
               f"{ok['compile']}, scheduling every graph Dynamo captured of {whole}; the dynamo export imported "
               f"and ran {ok['dynamo']}; the TorchScript export at opset {args.torchscript_opset} {ok['torchscript']} "
               f"({exporter} that torch.onnx could not write or wrote so that ONNX Runtime refuses the file, "
               f"{len(records) - ok['torchscript'] - exporter} that opsched failed).")
    md = "\n".join([
        f"# The sweep: {title} through every frontend", "",
        f"{CORPORA[args.corpus]}, batch 1. *torch*: `opsched.optimize` with its defaults (an IOS budget "
        f"of {args.budget:g} s; its own check against the model passed) and the largest output difference from "
        "eager; *torch.compile*: `torch.compile(model, backend=\"opsched\")` with the same budget, the graphs "
        "Dynamo captured and how many of them run eagerly (with the first one's reason), and the largest "
        "difference from eager; *dynamo ONNX*: `torch.onnx.export`'s default exporter, its opset, then "
        "`opsched.from_onnx` and the sequential plan on ONNX Runtime against ONNX Runtime's own session of the "
        "file; *TorchScript*: the same for the TorchScript exporter at an older opset. A failure shows whose it "
        "is and the first line of its error.", "", format_table(headers, rows, markdown=True), "", summary])
    md_path, js_path = write(args.name, md, {"corpus": args.corpus, "rows": records,
                                             "torchscript_opset": args.torchscript_opset})
    print(summary)
    print(f"wrote {md_path} and {js_path}")


if __name__ == "__main__":
    main()

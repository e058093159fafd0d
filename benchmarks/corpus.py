"""The corpus benchmark: third-party models (:mod:`opsched.testing.corpus`, or with ``--corpus
vision`` torchvision's and timm's, :mod:`opsched.testing.vision`) on this CPU, batch 1.

Per model: what the torch import made of it (operators, generic ATen nodes, opaque nodes) and
what the ONNX import made of its ``torch.onnx`` export (operators, generic ONNX nodes, which
exporter); the ONNX Runtime sessions of opsched's sequential plan and of ``optimize()``'s plan;
then, interleaved in one process in a fresh order each round (:func:`opsched.timing.interleave`,
50 ms of sleep and one untimed call before five timed ones, their median the round's sample):
eager PyTorch, ONNX Runtime's own session of the export with its default options, opsched's
sequential plan on the ONNX Runtime backend (the torch import's graph), that plan's session
alone where it is one (what the plan costs without the drop-in module's call), the sequential
plan of the ONNX import (the file as a user would bring it; its outputs checked against ONNX
Runtime's first), and what ``opsched.optimize`` returns with its defaults but the search budget. Ratios are medians of
per-round ratios, > 1 where the second contender is faster.

    python benchmarks/corpus.py                       # every corpus model
    python benchmarks/corpus.py --models bert swin --rounds 21 --budget 30
    python benchmarks/corpus.py --corpus vision --name vision-cpu     # needs torchvision and timm
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from _report import CORPORA, corpus_model, corpus_models, each_model, geomean, write_table  # noqa: E402

import opsched  # noqa: E402
from opsched.backends.lanes import LaneExecutor  # noqa: E402
from opsched.cost import ProfileStore  # noqa: E402
from opsched.costing import measured_cost  # noqa: E402
from opsched.module import ScheduledModule  # noqa: E402
from opsched.schedulers import schedule  # noqa: E402
from opsched.testing.export import export_onnx  # noqa: E402
from opsched.timing import interleave, paired_ratio  # noqa: E402


def sessions(module: ScheduledModule) -> int:
    """ONNX Runtime sessions the module's plan runs."""
    executor = module.executor
    return executor.sessions if isinstance(executor, LaneExecutor) else 0


#: The latency columns, in the table's order.
COLUMNS = ("eager", "ORT own session", "opsched session", "opsched sequential", "ONNX-file sequential",
           "optimize()")


def sole_session(module: ScheduledModule) -> Any:
    """The ONNX Runtime session that runs the module's whole plan, or None where the plan is more
    (several sessions, torch steps between them)."""
    executor = module.executor
    if not isinstance(executor, LaneExecutor):
        return None
    found = [s for s in executor.program.sessions if s is not None]
    return found[0] if len(found) == 1 and executor.program.n_items == 1 else None


def check_against(own: Any, feeds: dict[str, Any], module: ScheduledModule, inputs: tuple[torch.Tensor, ...],
                  name: str) -> None:
    """Raise where the module's outputs differ from ONNX Runtime's own session's on the same file."""
    want = own.run(None, feeds)
    with torch.no_grad():
        got = module(*inputs)
    got = [got] if isinstance(got, torch.Tensor) else list(got)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, torch.from_numpy(w), rtol=1e-4, atol=1e-4,
                                   msg=lambda m, k=k: f"{name}: ONNX import's output {k} differs from ORT's: {m}")


def generic(graph: opsched.Graph, prefix: str) -> int:
    return sum(1 for n in graph.nodes if n.op.startswith(prefix))


def run(name: str, budget: float, rounds: int, cache_dir: str) -> tuple[list[object], dict[str, object]]:
    entry = corpus_model(name)
    model, inputs = entry.build()
    t = time.perf_counter()
    graph = opsched.from_torch(model, inputs)
    import_s = time.perf_counter() - t
    proto, exporter = export_onnx(model, inputs)
    t = time.perf_counter()
    onnx_graph = opsched.from_onnx(proto)
    onnx_import_s = time.perf_counter() - t
    own = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {i.name: x.numpy() for i, x in zip(own.get_inputs(), inputs)}
    with ProfileStore(cache_dir) as store:
        sequential = ScheduledModule(graph, schedule(graph, "sequential", measured_cost(store=store)), backend="ort")
        from_file = ScheduledModule(onnx_graph, schedule(onnx_graph, "sequential", measured_cost(store=store)),
                                    backend="ort")
    check_against(own, feeds, from_file, inputs, name)
    t = time.perf_counter()
    opt = opsched.optimize(model, inputs, cache_dir=cache_dir, budget_s=budget)
    optimize_s = time.perf_counter() - t
    contenders = {
        "eager": lambda: model(*inputs),
        "ORT own session": lambda: own.run(None, feeds),
        "opsched sequential": lambda: sequential(*inputs),
        "ONNX-file sequential": lambda: from_file(*inputs),
        "optimize()": lambda: opt(*inputs),
    }
    alone = sole_session(sequential)
    if alone is not None:  # the sequential plan's one session, called as ORT's own is: NumPy in and out
        ours = {spec.name: x.numpy() for spec, x in zip(graph.inputs, inputs)}
        ours = {i.name: ours[i.name] for i in alone.get_inputs()}
        contenders["opsched session"] = lambda: alone.run(None, ours)
    with torch.no_grad():
        times = interleave(contenders, rounds, warmup=1, settle_s=0.05, block=5)
    med = {k: statistics.median(v) for k, v in times.items()}

    def ratio(slow: str, fast: str) -> float:
        return paired_ratio(times[slow], times[fast])
    ratios = {"seq vs ORT": ratio("ORT own session", "opsched sequential"),
              "ONNX-file seq vs ORT": ratio("ORT own session", "ONNX-file sequential"),
              "session vs ORT": ratio("ORT own session", "opsched session") if alone else float("nan"),
              "optimize() vs ORT": ratio("ORT own session", "optimize()"),
              "optimize() vs eager": ratio("eager", "optimize()")}
    kinds = Counter(n.op for n in graph.nodes)
    record = {"model": name, "architecture": entry.architecture, "operators": len(graph.nodes),
              "generic_aten": generic(graph, "aten."), "opaque": kinds["opaque"], "import_s": import_s,
              "onnx_mb": proto.ByteSize() / 1e6, "onnx_import_s": onnx_import_s,
              "onnx_exporter": exporter, "onnx_operators": len(onnx_graph.nodes),
              "generic_onnx": generic(onnx_graph, "onnx."), "sessions_sequential": sessions(sequential),
              "sessions_optimize": sessions(opt), "sessions_onnx_file": sessions(from_file),
              "optimize_kept": opt.outcome.race.kept if opt.outcome.race is not None else opt.schedule.scheduler,
              "median_ms": med, "ratios": ratios, "optimize_s": optimize_s}
    row = [name, len(graph.nodes), record["generic_aten"], kinds["opaque"], f"{exporter}: {len(onnx_graph.nodes)}",
           record["generic_onnx"], f"{proto.ByteSize() / 1e6:.1f} / {onnx_import_s:.2f}",
           f"{sessions(sequential)} / {sessions(opt)} / {sessions(from_file)}",
           *(f"{med[k]:.2f}" if k in med else "n/a" for k in COLUMNS), *(f"{v:.2f}" for v in ratios.values()),
           f"{optimize_s:.0f}"]
    return row, record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", choices=["corpus", "vision"], default="corpus",
                   help="vision: torchvision's and timm's models (opsched.testing.vision), where they import")
    p.add_argument("--models", nargs="*", help="default: the corpus's models")
    p.add_argument("--budget", type=float, default=10.0, help="seconds of IOS search per model in optimize()")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--cache-dir", help="profile store (default: a fresh temporary one)")
    p.add_argument("--name", default="corpus")
    args = p.parse_args()
    args.models = args.models or list(corpus_models(args.corpus))
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="opsched-corpus-")
    rows, records = each_model(args.models, lambda name: run(name, args.budget, args.rounds, cache_dir))
    headers = ["model", "ops", "generic ATen", "opaque", "ONNX import: ops", "generic ONNX",
               "ONNX MB / import s", "ORT sessions seq / opt / ONNX-file", "eager ms", "ORT own ms",
               "opsched session ms", "opsched seq ms", "ONNX-file seq ms", "optimize() ms", "seq vs ORT",
               "ONNX-file seq vs ORT", "session vs ORT", "optimize() vs ORT", "optimize() vs eager", "optimize s"]
    geo = {key: geomean(v for r in records if not math.isnan(v := r["ratios"][key]))  # type: ignore[index]
           for key in headers if key in records[0]["ratios"]}  # type: ignore[operator]
    write_table(args.name, [
        "# The corpus: third-party models on this CPU" if args.corpus == "corpus" else
        "# torchvision's and timm's models on this CPU", "",
        f"{CORPORA[args.corpus]}, batch 1. *ops*: operators of the torch import (torch.export), of which "
        "*generic ATen* run as their ATen overload and *opaque* as Python calls; *ONNX import*: the "
        "exporter that produced the file (torch.onnx's default dynamo exporter, else the TorchScript one) "
        "and the operators opsched imported from it, of which *generic ONNX* run through ONNX Runtime as "
        "they are, the file's size and how long `opsched.from_onnx` took to import it. *ORT sessions*: "
        "ONNX Runtime sessions of opsched's sequential plan, of optimize()'s plan and of the ONNX import's "
        "sequential plan (1: nothing cuts the model). Latency: medians over interleaved rounds in one process; ratios "
        "are medians of per-round ratios, > 1 where opsched is faster. *ORT own*: ONNX Runtime's session of "
        "the export with its default options; *opsched seq*: the sequential plan on the ONNX Runtime "
        "backend, a drop-in module (torch tensors in and out, the graph's outputs as they are: optimize() "
        "also builds the model's own output structure); *opsched "
        "session*: that plan's one ONNX Runtime session called as ORT's own is, NumPy in and out (n/a where "
        "the plan is more than one session), so *session vs ORT* compares the graphs and *seq vs ORT* adds "
        "the module's call; *ONNX-file seq*: the ONNX import's sequential plan on the ONNX Runtime backend, "
        "its outputs checked against ORT's own; *optimize()*: `opsched.optimize` with its defaults and an IOS "
        f"budget of {args.budget:g} s.",
    ], headers, rows, geo, {"rows": records, "budget_s": args.budget})


if __name__ == "__main__":
    main()

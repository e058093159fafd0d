"""CPU benchmark: opsched against eager PyTorch and ONNX Runtime, every zoo model.

For each model and batch size, in one process, interleaved in a fresh order each round; in
its turn a contender sleeps 50 ms (eager PyTorch's OpenMP threads and ONNX Runtime's intra-op
threads spin after a run and would take the cores of whatever runs next), runs once untimed
and then five times, its sample the median of the five (:func:`opsched.timing.interleave`): eager
PyTorch, ONNX Runtime sequential and parallel mode with ONNX Runtime's default options (what a
user gets: idle threads spin between kernels), and opsched's sequential, greedy and IOS
schedules on the ORT backend. The IOS schedule is searched with the measured cost model under a time budget; the
row "opsched optimize()" is what ``opsched.optimize`` returns (the IOS schedule, or the
sequential one when the end-to-end check finds that faster). Reported: median latency with
its interquartile range, ratios from the same run, the lower bound max(critical path of units
at all cores, total single-core work / cores), peak activation memory of each plan against
sequential, search time and measurements.

    python benchmarks/cpu.py                               # every zoo model, batch 1
    python benchmarks/cpu.py --models inception_v3 --batch 1 8 --budget 120

With ``--compile`` it races torch.compile instead (-> docs/results/cpu-compile.md): eager PyTorch;
``torch.compile`` in its default mode (``compile``), ``max-autotune`` (``compile-max``) and
``reduce-overhead`` (``compile-ro``; on a CPU it has no CUDA graphs to add); what
``opsched.optimize`` returns (ONNX Runtime kernels), the same through
``torch.compile(backend="opsched")``, and ``opsched-compile``: optimize()'s schedule with its lane
segments compiled by Inductor (the ``inductor`` backend), beside the sequential schedule on Inductor.
Each contender's compile time (its first call, or the segments' compile) is reported beside its latency.

    python benchmarks/cpu.py --compile --models squeezenet1_1 googlenet resnet18
"""

from __future__ import annotations

import argparse
import functools
import io
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from _report import geomean, iqr, write_table  # noqa: E402

import opsched  # noqa: E402
from opsched.cost import ProfileStore  # noqa: E402
from opsched.costing import host_cpu_model, measured_cost  # noqa: E402
from opsched.ir.analysis import critical_path  # noqa: E402
from opsched.models import example_inputs, get_model, list_models  # noqa: E402
from opsched.module import ScheduledModule  # noqa: E402
from opsched.schedule import Stage  # noqa: E402
from opsched.schedulers import UnitGraph, schedule  # noqa: E402
from opsched.timing import interleave, paired_ratio  # noqa: E402


def ort_session(model_bytes: bytes, parallel: bool) -> ort.InferenceSession:
    """ONNX Runtime's own session of the exported model, with its default options."""
    so = ort.SessionOptions()
    if parallel:
        so.execution_mode = ort.ExecutionMode.ORT_PARALLEL
        so.inter_op_num_threads = os.cpu_count() or 2
    return ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])


def lower_bound(graph, store: ProfileStore, batch: int) -> float:  # type: ignore[no-untyped-def]
    """Units priced as the measured model prices them in a segment (their kernels), at all cores
    for the critical path and at one core for the work."""
    ug = UnitGraph.build(graph)
    at_full, at_one = measured_cost(store=store), measured_cost(store=store, cores=1)
    per_node = [0.0] * len(graph.nodes)
    work = 0.0
    for names in ug.units:
        stage = Stage((names,))
        per_node[graph.index[names[0]]] = at_full.stage_latency(graph, stage)
        work += at_one.stage_latency(graph, stage)
    return max(critical_path(graph, per_node)[0], work / (os.cpu_count() or 1))


def slot_bytes(module: ScheduledModule) -> list[int]:
    return [module.graph.types[name].nbytes for name in module.plan.slot_names]


def run(name: str, batch: int, budget: float, rounds: int, cache_dir: str) -> tuple[list[object], dict[str, object]]:
    model, inputs = get_model(name), example_inputs(name, batch)
    buf = io.BytesIO()
    torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=17, input_names=["x"])
    ort_seq, ort_par = ort_session(buf.getvalue(), False), ort_session(buf.getvalue(), True)
    x_np = inputs[0].numpy()
    t = time.perf_counter()
    opt = opsched.optimize(model, inputs, cache_dir=cache_dir, budget_s=budget)
    optimize_s = time.perf_counter() - t
    graph = opt.graph
    with ProfileStore(cache_dir) as store:
        cost = measured_cost(store=store)
        # the same search optimize() ran (max_lanes = cores): found in the store, nothing new is measured
        ios = schedule(graph, "ios", cost, budget_s=budget, max_lanes=os.cpu_count() or 1)
        modules = {s: ScheduledModule(graph, schedule(graph, s, cost)) for s in ("sequential", "greedy")}
        bound = lower_bound(graph, store, batch)
    modules["ios"] = ScheduledModule(graph, ios)
    contenders = {
        "eager PyTorch": lambda: model(*inputs),
        "ORT sequential": lambda: ort_seq.run(None, {"x": x_np}),
        "ORT parallel": lambda: ort_par.run(None, {"x": x_np}),
        "opsched sequential": lambda: modules["sequential"](*inputs),
        "opsched greedy": lambda: modules["greedy"](*inputs),
        "opsched IOS": lambda: modules["ios"](*inputs),
        "opsched optimize()": lambda: opt(*inputs),
    }
    with torch.no_grad():
        times = interleave(contenders, rounds, warmup=1, settle_s=0.05, block=5)
    med = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: iqr(v) for k, v in times.items()}

    def ratio(slow: str, fast: str) -> float:
        """Median over rounds of the round's ratio: drift that slows a whole round cancels."""
        return paired_ratio(times[slow], times[fast])
    ratios = {"IOS vs ORT seq": ratio("ORT sequential", "opsched IOS"),
              "IOS vs eager": ratio("eager PyTorch", "opsched IOS"),
              "IOS vs own seq": ratio("opsched sequential", "opsched IOS"),
              "optimize() vs ORT seq": ratio("ORT sequential", "opsched optimize()")}
    seq_peak = modules["sequential"].plan.peak_bytes(slot_bytes(modules["sequential"]))
    peaks = {k: m.plan.peak_bytes(slot_bytes(m)) / seq_peak for k, m in modules.items()}
    record = {"model": name, "batch": batch, "median_ms": med, "iqr_ms": spread, "ratios": ratios,
              "lower_bound_ms": bound,
              "peak_vs_sequential": peaks, "optimize_s": optimize_s,
              "optimize_report": str(opt.report()),
              "ios_stats": dict(ios.stats)}
    return [name, batch] + [f"{med[k]:.2f} ±{spread[k]:.2f}" for k in contenders] + [
        *(f"{v:.2f}" for v in ratios.values()), f"{bound:.2f}", f"{med['opsched IOS'] / bound:.2f}",
        f"{peaks['ios']:.2f}", f"{optimize_s:.1f}",
        str(opt.outcome.measurements or "")], record


#: torch.compile's modes raced by ``--compile``, by contender name.
COMPILE_MODES = {"compile": "default", "compile-max": "max-autotune", "compile-ro": "reduce-overhead"}


def run_compile(name: str, batch: int, budget: float, rounds: int,
                cache_dir: str) -> tuple[list[object], dict[str, object]]:
    """The ``--compile`` race of one model (module docstring)."""
    model, inputs = get_model(name), example_inputs(name, batch)
    contenders: dict[str, object] = {"eager": model}
    compile_s: dict[str, float] = {}
    with torch.no_grad():
        for label, mode in COMPILE_MODES.items():
            torch._dynamo.reset()
            t = time.perf_counter()
            compiled = torch.compile(model, mode=mode)
            compiled(*inputs)
            compile_s[label] = time.perf_counter() - t
            contenders[label] = compiled
        t = time.perf_counter()
        opt = opsched.optimize(model, inputs, cache_dir=cache_dir, budget_s=budget)
        compile_s["opsched"] = time.perf_counter() - t
        contenders["opsched"] = opt
        t = time.perf_counter()
        via_dynamo = torch.compile(model, backend="opsched", options={"cache_dir": cache_dir, "budget_s": budget})
        via_dynamo(*inputs)
        compile_s["backend=opsched"] = time.perf_counter() - t
        contenders["backend=opsched"] = via_dynamo
        sequential = schedule(opt.graph, "sequential", host_cpu_model())
        for label, sched in (("opsched-compile", opt.schedule), ("opsched-compile seq", sequential)):
            t = time.perf_counter()
            contenders[label] = ScheduledModule(opt.graph, sched, backend="inductor")
            compile_s[label] = time.perf_counter() - t
        calls = {k: functools.partial(m, *inputs) for k, m in contenders.items()}
        times = interleave(calls, rounds, warmup=1, settle_s=0.05, block=5)
    med = {k: statistics.median(v) for k, v in times.items()}

    def ratio(slow: str, fast: str) -> float:
        return paired_ratio(times[slow], times[fast])
    best_compile = min(COMPILE_MODES, key=lambda k: med[k])
    ratios = {"opsched-compile vs best compile": ratio(best_compile, "opsched-compile"),
              "opsched-compile vs eager": ratio("eager", "opsched-compile"),
              "opsched vs best compile": ratio(best_compile, "opsched")}
    record = {"model": name, "batch": batch, "median_ms": med, "compile_s": compile_s, "ratios": ratios,
              "best_compile": best_compile, "opsched_report": str(opt.report()),
              "opsched_compile": contenders["opsched-compile"].report().executor}  # type: ignore[attr-defined]
    row = [name, batch, *(f"{med[k]:.2f} ({compile_s.get(k, 0.0):.0f} s)" if k in compile_s else f"{med[k]:.2f}"
                          for k in calls), best_compile, *(f"{v:.2f}" for v in ratios.values())]
    return row, record


def every_model(race: Callable[[str, int, float, int, str], tuple[list[object], dict[str, object]]],
                args: argparse.Namespace, cache_dir: str) -> tuple[list[list[object]], list[dict[str, object]]]:
    """``race`` run for every model at every batch size, each row echoed as it comes."""
    rows, records = [], []
    for batch in args.batch:
        for name in args.models:
            row, record = race(name, batch, args.budget, args.rounds, cache_dir)
            rows.append(row)
            records.append(record)
            print(" | ".join(map(str, row)), flush=True)
    return rows, records


def main_compile(args: argparse.Namespace, cache_dir: str) -> None:
    rows, records = every_model(run_compile, args, cache_dir)
    headers = ["model", "batch", "eager", "compile", "compile-max", "compile-ro", "opsched (ORT)",
               "backend=opsched", "opsched-compile", "opsched-compile seq", "best compile mode",
               "opsched-compile vs best compile", "opsched-compile vs eager", "opsched (ORT) vs best compile"]
    geo = {h: geomean(float(r[k]) for r in rows) for k, h in enumerate(headers) if k >= len(headers) - 3}
    write_table(args.name if args.name != "cpu" else "cpu-compile", [
        "# CPU: opsched against torch.compile", "",
        "Median latency in ms over interleaved rounds in one process (a contender's sample: the median of "
        "five calls after 50 ms of sleep and one untimed call), compile time in parentheses (the first "
        "call for torch.compile's modes and the opsched backend; import, search and check for "
        "optimize(); the Inductor compile of the segments for opsched-compile). *opsched (ORT)*: what "
        "`opsched.optimize` returns; *backend=opsched*: the same through `torch.compile(model, "
        "backend=\"opsched\")`; *opsched-compile*: optimize()'s schedule with each lane segment compiled "
        "by Inductor (the `inductor` backend); *opsched-compile seq*: the sequential schedule on it (one "
        "segment: Inductor on opsched's imported graph). Ratios are medians of per-round ratios, > 1 where "
        "the opsched contender is faster.",
    ], headers, rows, geo, {"rows": records, "budget_s": args.budget})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=list_models())
    p.add_argument("--batch", nargs="*", type=int, default=[1])
    p.add_argument("--budget", type=float, default=90.0, help="seconds of search per model (then fallback)")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--cache-dir", help="profile store (default: a fresh temporary one, so search times are honest)")
    p.add_argument("--name", default="cpu")
    p.add_argument("--compile", action="store_true", help="race torch.compile's modes and the Inductor backend")
    args = p.parse_args()
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="opsched-bench-")
    if args.compile:
        main_compile(args, cache_dir)
        return
    rows, records = every_model(run, args, cache_dir)
    headers = ["model", "batch", "eager", "ORT seq", "ORT par", "opsched seq", "opsched greedy", "opsched IOS",
               "optimize()", "IOS vs ORT seq", "IOS vs eager", "IOS vs own seq", "optimize() vs ORT seq",
               "unit bound", "IOS / unit bound", "IOS peak mem vs seq", "optimize s", "measurements"]
    geo = {}
    for col, key in ((9, "IOS vs ORT seq"), (10, "IOS vs eager"), (12, "optimize() vs ORT seq")):
        vals = [float(r[col]) for r in rows]
        geo[key] = geomean(vals)
    write_table(args.name, [
        "# CPU: opsched against eager PyTorch and ONNX Runtime", "",
        "Median latency in ms (± interquartile range) over interleaved rounds in one process, in a "
        "fresh order each round; a contender's sample in a round is the median of five calls after 50 ms "
        "of sleep and one untimed call (spinning threads of the previous contender go idle, its own warm "
        "up); ONNX Runtime's sessions with its default options (idle threads spin); ratios are "
        "medians of the per-round ratios (drift that slows a whole "
        "round cancels), > 1 where opsched is faster. opsched runs its plans on the ONNX Runtime backend. *IOS*: the "
        "schedule searched with the measured cost model under the time budget; *optimize()*: what "
        "`opsched.optimize` returns after its end-to-end check against the sequential schedule. "
        "Unit bound: max(critical path of units at all cores, single-core work / cores), each unit "
        "priced as the measured cost model prices it inside a segment (the time in its kernels, by "
        "ONNX Runtime's profiler). It is an estimate, not a strict bound: inside a long segment ONNX "
        "Runtime fuses across units, which units measured alone cannot show, so a ratio below 1 is "
        "possible. Peak memory: "
        "live activations of the plan, against the sequential plan.",
    ], headers, rows, geo, {"rows": records, "budget_s": args.budget})


if __name__ == "__main__":
    main()

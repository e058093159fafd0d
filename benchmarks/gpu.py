"""GPU benchmark: opsched against eager PyTorch, a single-stream CUDA graph and torch.compile.

For every zoo model, batch size and precision, in one process, interleaved (a fresh order each
round) after warm-up, each contender's turn one untimed call and ``--block`` calls each timed
with CUDA events, its sample their median (a batch-1 call takes 0.1-1 ms, and single calls, one
a turn, spread by up to 30% between rounds on an H200): eager PyTorch; the same model captured
into a single-stream CUDA graph (the baseline that counts: it removes launch overhead but runs one operator at a time);
``torch.compile`` (default, max-autotune and reduce-overhead); opsched's sequential, greedy,
IOS, ``est`` and ``graphturbo`` schedules, each run by the CUDA executor with the whole plan
captured into one CUDA graph; ``opsched optimize()``, what :func:`opsched.optimize` returns when
asked for ``scheduler=("ios", "est")`` (the faster of the two plans, or the sequential one where
its end-to-end check finds that faster); and the IOS schedule with each lane segment compiled by
Inductor (the ``cuda-inductor`` backend: ``opsched-compile``). Stages are measured on the GPU
(captured replays timed with CUDA events) into a profile store.

Reported per row: median latency and interquartile range, ratios to the single-stream graph,
the critical-path bound (the longest path of isolated unit latencies: no schedule that keeps
the kernels can beat it), the GPU memory a call of each contender needs (its own weights, its
graph's memory pool, activations: the peak reserved during a call) against the single-stream
graph, and search or compile time. With ``--profile``, where each contender's time goes:
torch.profiler's kernels per call, their summed and busy (union) time and the idle rest, beside
the schedule's own estimate (the single-stream graph at 1.00 overlap; a concurrent plan above
it; a split plan with more, smaller kernels). Results are written after every row, so an
interrupted run keeps what it measured (``--resume`` skips rows already in the JSON).

    python benchmarks/gpu.py                                           # everything (hours)
    python benchmarks/gpu.py --models inception_v3 --batches 1 --dtypes float32 float16
    python benchmarks/gpu.py --device cpu --models squeezenet1_1 --contenders eager sequential ios
    python benchmarks/gpu.py --batches 1 --contenders graph compile compile-max compile-ro ios opsched-compile
    python benchmarks/gpu.py --batches 16 64 128 --contenders graph ios graphturbo --name memory-gpu --profile
    python benchmarks/gpu.py --corpus --batches 1 --contenders eager graph compile sequential optimize \
        --name corpus-gpu                                              # the corpus against the graph
    python benchmarks/gpu.py --models timm/inception_v4 torchvision/googlenet --batches 1 --name vision-gpu
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import RESULTS, corpus_model, corpus_models, geomean, iqr, write  # noqa: E402
from torch.utils._pytree import tree_map_only  # noqa: E402

import opsched  # noqa: E402
from opsched.cli.table import format_table  # noqa: E402
from opsched.cost import ProfileStore  # noqa: E402
from opsched.costing import measured_cost  # noqa: E402
from opsched.ir.analysis import critical_path  # noqa: E402
from opsched.models import example_inputs, get_model, list_models  # noqa: E402
from opsched.schedule import Stage  # noqa: E402
from opsched.schedulers import UnitGraph  # noqa: E402
from opsched.timing import cuda_events_ms, interleave, wall_ms  # noqa: E402

BASELINE = "CUDA graph (1 stream)"
OPSCHED = ("sequential", "greedy", "ios", "est", "graphturbo")
CONTENDERS = ("eager", "graph", "compile", "compile-max", "compile-ro", *OPSCHED, "optimize", "opsched-compile")
LABELS = {"eager": "eager PyTorch", "graph": BASELINE, "compile": "torch.compile",
          "compile-max": "torch.compile max-autotune", "sequential": "opsched sequential",
          "greedy": "opsched greedy", "ios": "opsched IOS", "est": "opsched est", "graphturbo": "opsched GraphTurbo",
          "optimize": "opsched optimize()", "compile-ro": "torch.compile reduce-overhead",
          "opsched-compile": "opsched IOS, Inductor segments"}
CUDA_ONLY = {"graph", "compile", "compile-max", "compile-ro"}


def single_stream_graph(model: torch.nn.Module, x: tuple[torch.Tensor, ...]) -> Callable[[], Any]:
    """``model`` captured into one CUDA graph on one stream; a call copies the inputs in, replays
    and clones the outputs out (what opsched's captured modules do too)."""
    static = [t.clone() for t in x]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):
            model(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.no_grad():
        out = model(*static)

    def call() -> Any:
        for s, t in zip(static, x):
            s.copy_(t)
        graph.replay()
        # every tensor the model returns, a Hugging Face ModelOutput's too (a registered pytree)
        return tree_map_only(torch.Tensor, torch.Tensor.clone, out)
    call.model = model  # type: ignore[attr-defined]  # the graph reads the weights in place: keep them
    return call


def held_memory(build: Callable[[], Callable[[], Any]], device: torch.device) -> tuple[Callable[[], Any], float, float]:
    """Build a contender and call it three times; its build seconds and the MiB of GPU memory a
    call needs: the peak reserved during one call, after the build's leftovers (a search's
    scratch, warm-up activations) are returned, over what was reserved before the build. That
    is its weights, its graph's memory pool and, for an uncaptured contender, its activations."""
    if device.type == "cuda":
        torch.cuda.synchronize()
        gc.collect()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_reserved()
    t = time.perf_counter()
    fn = build()
    with torch.no_grad():
        for _ in range(3):
            fn()
    if device.type != "cuda":
        return fn, time.perf_counter() - t, float("nan")
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    with torch.no_grad():
        fn()
    torch.cuda.synchronize()
    return fn, seconds, (torch.cuda.max_memory_reserved() - before) / 2**20


def critical_path_bound(graph: opsched.Graph, device: torch.device, cache_dir: str) -> float:
    """The longest path of isolated unit latencies (measured like stages, through the store)."""
    ug = UnitGraph.build(graph)
    per_node = [0.0] * len(graph.nodes)
    with ProfileStore(cache_dir) as store:
        cost = measured_cost(device, store=store)
        for names in ug.units:
            per_node[graph.index[names[-1]]] = cost.stage_latency(graph, Stage((names,)))
    return critical_path(graph, per_node)[0]


#: What a CUDA trace calls the device's work (chrome trace categories of torch.profiler's Kineto).
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")
#: The calls --profile traces per contender.
PROFILE_CALLS = 10


def device_time(spans: list[tuple[float, float]], calls: int) -> dict[str, float]:
    """Where a call's device time goes, from its kernels' ``(start, duration)`` spans in µs over
    ``calls`` calls: kernels per call, their summed time, the time at least one ran (their union:
    below the sum where kernels of different streams overlap) and the span from the first start
    to the last end, each per call in ms."""
    spans = sorted(spans)
    union, reach = 0.0, -math.inf
    for start, dur in spans:
        end = start + dur
        if end > reach:
            union += end - max(start, reach)
            reach = end
    first = spans[0][0] if spans else 0.0
    last = max((start + dur for start, dur in spans), default=0.0)
    return {"kernels": len(spans) / calls, "kernel_ms": sum(d for _, d in spans) / calls / 1e3,
            "busy_ms": union / calls / 1e3, "span_ms": (last - first) / calls / 1e3}


def kernel_profile(fn: Callable[[], Any], calls: int = PROFILE_CALLS) -> dict[str, float]:
    """:func:`device_time` of ``calls`` calls of ``fn`` on the GPU, from torch.profiler's trace
    (a captured graph's kernels included: the trace has them as the replay ran them)."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    return device_time([(e["ts"], e.get("dur", 0.0)) for e in events
                        if e.get("ph") == "X" and e.get("cat") in DEVICE_WORK], calls)


def load(name: str, batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    """A zoo model, a corpus one (``corpus:bert``) or a vision one (``timm/dpn68``,
    ``torchvision/googlenet``), a corpus or vision model's batch-1 inputs repeated to ``batch``."""
    if name.startswith("corpus:") or "/" in name:
        model, inputs = corpus_model(name.removeprefix("corpus:")).build()
        return model.eval(), tuple(t.repeat(batch, *[1] * (t.dim() - 1)) for t in inputs)
    return get_model(name).eval(), example_inputs(name, batch)


def run(name: str, batch: int, dtype: str, args: argparse.Namespace, cache_dir: str) -> dict[str, Any]:
    device = torch.device(args.device)
    dt = getattr(torch, dtype)
    model, x_cpu = load(name, batch)
    x = tuple(t.to(device, dt if t.is_floating_point() else t.dtype) for t in x_cpu)  # token ids stay integers

    def placed() -> torch.nn.Module:  # each contender holds its own weights, as opsched's modules do
        return copy.deepcopy(model).to(device, dt)

    builders: dict[str, Callable[[], Callable[[], Any]]] = {
        "eager": lambda: (lambda m: lambda: m(*x))(placed()),
        "graph": lambda: single_stream_graph(placed(), x),
        "compile": lambda: (lambda m: lambda: m(*x))(torch.compile(placed())),
        "compile-max": lambda: (lambda m: lambda: m(*x))(torch.compile(placed(), mode="max-autotune")),
        "compile-ro": lambda: (lambda m: lambda: m(*x))(torch.compile(placed(), mode="reduce-overhead")),
    }
    modules: dict[str, opsched.ScheduledModule] = {}

    def opsched_builder(key: str) -> Callable[[], Callable[[], Any]]:
        def build() -> Callable[[], Any]:
            options: dict[str, Any] = {"budget_s": args.budget} if key in ("ios", "optimize") else {}
            if key == "optimize":
                module = opsched.optimize(model, x_cpu, device=device, dtype=dtype, scheduler=("ios", "est"),
                                          cache_dir=cache_dir, **options)
            else:
                graph = opsched.place(opsched.from_torch(model, x_cpu), device, dtype)
                module = opsched.optimize_graph(graph, device=device, scheduler=key, cache_dir=cache_dir,
                                                check=False, **options)
            modules[key] = module
            return lambda: module(*x)
        return build

    def segments_builder() -> Callable[[], Any]:
        """The IOS contender's schedule (made here if that contender is not run), each lane
        segment compiled by Inductor: on streams in one CUDA graph on a GPU, on threads on a CPU."""
        graph = opsched.place(opsched.from_torch(model, x_cpu), device, dtype)
        sched = modules["ios"].schedule if "ios" in modules else opsched.optimize_graph(
            graph, device=device, scheduler="ios", cache_dir=cache_dir, check=False, budget_s=args.budget).schedule
        module = opsched.ScheduledModule(graph, sched, device=device,
                                         backend="cuda-inductor" if device.type == "cuda" else "inductor")
        modules["opsched-compile"] = module
        return lambda: module(*x)

    builders.update({k: opsched_builder(k) for k in (*OPSCHED, "optimize")})
    builders["opsched-compile"] = segments_builder
    chosen = [k for k in args.contenders if device.type == "cuda" or k not in CUDA_ONLY]
    fns, build_s, mib = {}, {}, {}
    for k in chosen:
        try:
            fns[k], build_s[k], mib[k] = held_memory(builders[k], device)
        except Exception as e:  # a contender that cannot run here is reported, not fatal
            print(f"  {name} b{batch} {dtype}: {LABELS[k]} failed: {type(e).__name__}: {e}", flush=True)
    timer = cuda_events_ms if device.type == "cuda" else wall_ms
    with torch.no_grad():
        times = interleave(fns, args.rounds, warmup=3, clock=timer, block=args.block)
    med = {k: statistics.median(v) for k, v in times.items()}
    spread = {k: iqr(v) for k, v in times.items()}
    some = next(iter(modules.values()), None)
    bound = critical_path_bound(some.graph, device, cache_dir) if some is not None else float("nan")
    profiles = {k: kernel_profile(fn) for k, fn in fns.items()} if args.profile else {}
    record: dict[str, Any] = {
        "model": name, "batch": batch, "dtype": dtype, "median_ms": med, "iqr_ms": spread, "build_s": build_s,
        "held_mib": mib, "critical_path_bound_ms": bound, "profile": profiles,
        "estimated_ms": {k: m.schedule.estimated_ms for k, m in modules.items()},
        "report": {k: str(m.report()) for k, m in modules.items()},
        "captured": {k: getattr(m._executor, "captured", None) for k, m in modules.items()},
        "stages": {k: len(m.schedule.stages or m.schedule.lanes) for k, m in modules.items()},
    }
    print(f"  {name} b{batch} {dtype}: " + ", ".join(f"{LABELS[k]} {v:.3f}" for k, v in med.items()), flush=True)
    return record



def report(records: list[dict[str, Any]], contenders: list[str], device: str) -> tuple[str, dict[str, Any]]:
    base = "graph" if device.startswith("cuda") else "sequential"
    versus = [k for k in ("ios", "graphturbo", "optimize", "opsched-compile") if k in contenders] or ["ios", "optimize"]
    compiles = [k for k in ("compile", "compile-max", "compile-ro") if k in contenders]
    headers = ["model", "batch", "dtype", *(LABELS[k] for k in contenders),
               *(f"{LABELS[k].removeprefix('opsched ')} vs {LABELS[base]}" for k in versus),
               "bound", *(("IOS / bound", "IOS memory vs base", "IOS search s") if "ios" in contenders else ())]
    rows = []

    def ratio(med: dict[str, float], k: str) -> str:
        return f"{med[base] / med[k]:.2f}" if k in med and base in med else ""

    def ios_columns(r: dict[str, Any]) -> tuple[str, str, str]:
        """The IOS contender's time over the bound, memory over the base's and build seconds
        (empty where it failed)."""
        med, mem, built = r["median_ms"], r["held_mib"], r["build_s"]
        return (f"{med['ios'] / r['critical_path_bound_ms']:.2f}" if "ios" in med else "",
                f"{mem['ios'] / mem[base]:.2f}" if "ios" in mem and base in mem and mem[base] > 0 else "",
                f"{built['ios']:.1f}" if "ios" in built else "")

    for r in records:
        med, spread = r["median_ms"], r["iqr_ms"]
        rows.append([r["model"], r["batch"], r["dtype"],
                     *(f"{med[k]:.3f} ±{spread[k]:.3f}" if k in med else "failed" for k in contenders),
                     *(ratio(med, k) for k in versus), f"{r['critical_path_bound_ms']:.3f}",
                     *(ios_columns(r) if "ios" in contenders else ())])
    summary: dict[str, Any] = {}
    for dtype in sorted({r["dtype"] for r in records}):
        for k in versus:
            b1 = [r["median_ms"][base] / r["median_ms"][k] for r in records
                  if r["dtype"] == dtype and r["batch"] == 1 and k in r["median_ms"] and base in r["median_ms"]]
            every = [r["median_ms"][base] / r["median_ms"][k] for r in records
                     if r["dtype"] == dtype and k in r["median_ms"] and base in r["median_ms"]]
            summary[f"{k} {dtype}"] = {"batch1_geomean": geomean(b1), "geomean": geomean(every),
                                       "worst_any_batch": min(every, default=math.nan)}
        # issue 22's target: Inductor segments on streams against the best of torch.compile's modes
        best = [(r, min(r["median_ms"][c] for c in compiles if c in r["median_ms"])) for r in records
                if r["dtype"] == dtype and "opsched-compile" in r["median_ms"]
                and any(c in r["median_ms"] for c in compiles)]
        if best:
            every = [m / r["median_ms"]["opsched-compile"] for r, m in best]
            b1 = [x for (r, _), x in zip(best, every) if r["batch"] == 1]
            summary[f"opsched-compile {dtype} vs best torch.compile"] = {
                "batch1_geomean": geomean(b1), "geomean": geomean(every), "worst_any_batch": min(every)}
    lines = ["# GPU: opsched against eager PyTorch, a single-stream CUDA graph and torch.compile", "",
             "Median latency in ms (± interquartile range) over interleaved rounds (a fresh order each round) "
             "in one process, each round's sample the median of a turn's calls (see the command's --block), "
             "each call timed with CUDA events. Ratios > 1 mean opsched is faster than the base "
             f"({LABELS[base]}). Bound: the longest path of isolated unit latencies. Memory: the GPU memory "
             "a call of the contender needs (its weights, graph pool and activations: peak reserved) "
             "against the base's; for a contender whose build measures (IOS, est, optimize()) it can "
             "include allocator segments the search left reserved, so read it as an upper bound.", "",
             format_table(headers, rows, markdown=True), "",
             "## Targets (geomean at batch 1 where measured, and over every batch; worst over every batch)", ""]
    for key, v in summary.items():
        against = "" if key.endswith("torch.compile") else f" vs {LABELS[base]}"
        at_1 = "" if math.isnan(v["batch1_geomean"]) else f"batch-1 geomean {v['batch1_geomean']:.3f}x, "
        lines.append(f"- {key}{against}: {at_1}geomean {v['geomean']:.3f}x, worst {v['worst_any_batch']:.3f}x")
    lines += where_time_goes(records)
    return "\n".join(lines), {"summary": summary}


def where_time_goes(records: list[dict[str, Any]]) -> list[str]:
    """The --profile table: per row and contender, the kernels of a call, their summed and busy
    (union) time, the call's time the GPU ran none, and the schedule's own estimate."""
    rows = [[r["model"], r["batch"], r["dtype"], LABELS[k], f"{p['kernels']:.0f}", f"{p['kernel_ms']:.3f}",
             f"{p['busy_ms']:.3f}", f"{p['kernel_ms'] / p['busy_ms']:.2f}" if p["busy_ms"] else "",
             f"{max(r['median_ms'][k] - p['busy_ms'], 0.0):.3f}",
             f"{est:.3f}" if (est := r.get("estimated_ms", {}).get(k)) is not None else ""]
            for r in records for k, p in r.get("profile", {}).items()]
    if not rows:
        return []
    headers = ["model", "batch", "dtype", "contender", "kernels", "kernel ms", "busy ms", "overlap",
               "idle ms", "estimate ms"]
    return ["", "## Where the time goes (--profile)", "",
            f"Per call, from torch.profiler's trace of {PROFILE_CALLS} calls: kernels (and copies) run, their "
            "summed time, the time at least one ran (busy), overlap = summed / busy (1.00: one at a time), idle = the "
            "median latency above less busy (launch gaps, waits), and the schedule's own estimate.", "",
            format_table(headers, rows, markdown=True)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", help="zoo names, corpus:NAME, or torchvision/NAME and timm/NAME (the "
                                               "vision models, opsched.testing.vision) (default: the zoo)")
    p.add_argument("--corpus", action="store_true", help="the real-model corpus (opsched.testing.corpus) but its "
                                                         "slow models, as corpus:NAME models")
    p.add_argument("--vision", action="store_true", help="torchvision's and timm's models (opsched.testing.vision) "
                                                         "but the slow ones")
    p.add_argument("--batches", nargs="*", type=int, default=[1, 16, 128])
    p.add_argument("--dtypes", nargs="*", default=["float32", "float16"])
    p.add_argument("--contenders", nargs="*", default=list(CONTENDERS), choices=CONTENDERS)
    p.add_argument("--device", default="cuda")
    p.add_argument("--budget", type=float, default=60.0, help="seconds of DP search per model")
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--block", type=int, default=5, help="timed calls per turn, the turn's sample their median")
    p.add_argument("--profile", action="store_true",
                   help=f"also profile each contender's kernels (torch.profiler, {PROFILE_CALLS} calls): count, "
                        "summed and busy time, beside the schedule's estimate")
    p.add_argument("--cache-dir", help="profile store (default: a fresh temporary one, so search times are honest)")
    p.add_argument("--resume", action="store_true", help="keep the rows already in the results JSON")
    p.add_argument("--name", help="results name (default gpu-<device name>)")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default docs/results)")
    args = p.parse_args()
    args.models = args.models or ([f"corpus:{n}" for n, e in corpus_models("corpus").items() if not e.slow]
                                  if args.corpus
                                  else [n for n, e in corpus_models("vision").items() if not e.slow] if args.vision
                                  else list_models())
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no GPU here (torch.cuda.is_available() is False); --device cpu runs the CPU subset")
    if args.profile and device.type != "cuda":
        raise SystemExit("--profile profiles a GPU's kernels; on a CPU, benchmarks/memory.py has ORT's profiler")
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    name = args.name or f"gpu-{gpu.replace(' ', '_')}"
    cache_dir = args.cache_dir or tempfile.mkdtemp(prefix="opsched-gpu-")
    done: list[dict[str, Any]] = []
    if args.resume and (args.out / f"{name}.json").exists():
        done = json.loads((args.out / f"{name}.json").read_text())["rows"]
    have = {(r["model"], r["batch"], r["dtype"]) for r in done}
    contenders = [k for k in args.contenders if device.type == "cuda" or k not in CUDA_ONLY]
    for dtype in args.dtypes:
        for batch in args.batches:
            for model in args.models:
                if (model, batch, dtype) in have:
                    continue
                try:
                    done.append(run(model, batch, dtype, args, cache_dir))
                except Exception as e:  # a model that cannot be built or imported here: said, and the rest go on
                    print(f"  {model} b{batch} {dtype}: failed: {type(e).__name__}: {e}", flush=True)
                    continue
                md, extra = report(done, contenders, args.device)
                write(name, md, {"rows": done, "device": gpu, **extra}, args.out)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
    md, _ = report(done, contenders, args.device)
    print(md)
    print(f"wrote {args.out / name}.md")


if __name__ == "__main__":
    main()

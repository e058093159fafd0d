"""Pictures of the committed benchmark results: what the tables in docs/results/ say, at a glance.

Each figure is drawn from the JSON its benchmark wrote (nothing is measured here), so it can be
redrawn after any rerun; a figure whose results are not there is skipped with a line saying so.

* ``gpu.png``: speedup over the model captured into one single-stream CUDA graph, per zoo model
  at batch 1 (float32 and float16), with the critical-path bound and the 1.5x target;
* ``corpus-gpu.png``: the Hugging Face corpus on a GPU, batch 1: eager PyTorch, opsched's
  sequential plan and ``optimize()`` against the model captured into one CUDA graph;
* ``vision-gpu.png``: the same for torchvision's and timm's models (``gpu.py --vision``), with
  the IOS plan;
* ``compile-gpu.png``: torch.compile's modes, IOS and IOS with Inductor segments on streams
  against the single-stream CUDA graph, per zoo model at batch 1 (``compile_targets.py``'s page);
* ``cpu.png``: speedup over ONNX Runtime's sequential session on this repository's CPU, batch 1;
* ``schedules.png``: the simulated IOS table (each schedule against sequential) beside IOS's
  measured V100 figures;
* ``memory.png``: GraphTurbo's ablation (layer by layer, + grouping, + split, + instance order)
  under the traffic simulator: bytes from the shared cache and latency per zoo model;
* ``memory-budget.png``: the IOS search within a budget of live activations, per zoo model
  whose concurrency costs memory: estimated speedup over sequential against peak memory;
* ``stage-counts.png``: the stages a search prices, log scale: the original optimizer's count,
  what its rule would price on our graph, the DP's, and the floors under any monotone-bound proof.

    python benchmarks/figures.py                 # every figure whose results exist
    python benchmarks/figures.py --only gpu cpu --out /tmp/figures
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import RESULTS, geomean  # noqa: E402

Results = dict[str, Any]
FIGURES: dict[str, tuple[tuple[str, ...], Callable[..., None]]] = {}


def figure(name: str, *results: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Register a figure drawn from the named results files (docs/results/<name>.json)."""
    def register(draw: Callable[..., None]) -> Callable[..., None]:
        FIGURES[name] = (results, draw)
        return draw
    return register


def _grouped_bars(ax, labels: Sequence[str], series: dict[str, Sequence[float]], colors: dict[str, str]) -> None:  # type: ignore[no-untyped-def]
    width = 0.8 / len(series)
    for k, (name, values) in enumerate(series.items()):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(labels))]
        ax.bar(xs, values, width, label=name, color=colors.get(name))
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels([label.replace(", ", "\n") for label in labels], fontsize=8)
    ax.grid(axis="y", alpha=0.3)



GPU_CONTENDERS = {"sequential": "#7f7f7f", "ios": "#1f77b4", "est": "#ff7f0e", "optimize": "#2ca02c"}


def _over_graph(rows: Sequence[Results], contenders: Sequence[str]) -> dict[str, list[float]]:
    """Per contender (of those some row has), each row's speedup over the single-stream CUDA
    graph (0 where the row lacks the contender)."""
    return {c: [r["median_ms"]["graph"] / r["median_ms"][c] if c in r["median_ms"] else 0.0 for r in rows]
            for c in contenders if any(c in r["median_ms"] for r in rows)}


def _legend(ax, labels: dict[str, str], **options: Any) -> None:  # type: ignore[no-untyped-def]
    """The legend of the bars (labelled by contender key in :func:`_grouped_bars`), in words."""
    handles, keys = ax.get_legend_handles_labels()
    ax.legend(handles, [labels.get(k, k) for k in keys], **options)


AGAINST_GRAPH = {"eager": "#d62728", "sequential": "#7f7f7f", "ios": "#1f77b4", "optimize": "#2ca02c"}
AGAINST_GRAPH_LABELS = {"eager": "eager PyTorch", "sequential": "opsched sequential (captured)",
                        "ios": "opsched IOS (captured)", "optimize": "opsched optimize()"}


def _against_graph(plt, results: Results, what: str) -> None:  # type: ignore[no-untyped-def]
    """A ``gpu.py`` page of third-party models at one batch and precision: each contender's
    speedup over the model captured into one CUDA graph, log scale, whiskers its spread."""
    rows = [r for r in results["rows"] if "graph" in r["median_ms"]]
    models = [r["model"].removeprefix("corpus:") for r in rows]
    series = _over_graph(rows, AGAINST_GRAPH)
    fig, ax = plt.subplots(figsize=(12, 4.2))
    _grouped_bars(ax, models, series, AGAINST_GRAPH)
    ax.set_yscale("log")
    ax.axhline(1.0, color="black", linewidth=0.8)
    # each contender's spread: the graph's median over the contender's quartiles
    width = 0.8 / len(series)
    for k, c in enumerate(series):
        for i, r in enumerate(rows):
            med, iqr = r["median_ms"].get(c), r["iqr_ms"].get(c, 0.0)
            if med:
                x = i + (k - (len(series) - 1) / 2) * width
                ax.plot([x, x], [r["median_ms"]["graph"] / (med + iqr / 2), r["median_ms"]["graph"] / (med - iqr / 2)],
                        color="black", linewidth=0.8)
    ax.set_ylabel("speedup over the model captured\ninto one single-stream CUDA graph")
    _legend(ax, AGAINST_GRAPH_LABELS, fontsize=7, ncol=len(series), loc="lower right")
    ax.tick_params(axis="x", labelrotation=30)
    opt = [v for v in series.get("optimize", []) if v > 0]
    dtype = rows[0]["dtype"] if rows else ""
    ax.set_title(f"{results['environment'].get('gpu', 'GPU').split(' sm_')[0]}, {what}, batch 1, {dtype}: "
                 f"optimize() {geomean(opt):.2f}x the captured model (geomean); whiskers: interquartile range",
                 fontsize=10)


@figure("corpus-gpu", "corpus-gpu")
def draw_corpus_gpu(plt, corpus: Results) -> None:  # type: ignore[no-untyped-def]
    _against_graph(plt, corpus, "Hugging Face models")


@figure("vision-gpu", "vision-gpu")
def draw_vision_gpu(plt, vision: Results) -> None:  # type: ignore[no-untyped-def]
    _against_graph(plt, vision, "torchvision and timm models")


COMPILE_GPU = {"compile": "#d62728", "compile-ro": "#ff9896", "compile-max": "#8c564b", "ios": "#1f77b4",
               "opsched-compile": "#2ca02c"}
COMPILE_LABELS = {"compile": "torch.compile", "compile-ro": "torch.compile reduce-overhead",
                  "compile-max": "torch.compile max-autotune", "ios": "opsched IOS",
                  "opsched-compile": "opsched IOS, Inductor segments"}


@figure("compile-gpu", "compile-targets")
def draw_compile_gpu(plt, targets: Results) -> None:  # type: ignore[no-untyped-def]
    """From ``benchmarks/compile_targets.py``'s page: each contender's speedup over the graph
    timed beside it, max-autotune's from its own pages."""
    dtypes = [d for d in ("float16", "float32") if any(r["dtype"] == d for r in targets["rows"])]
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(9, 3.4 * len(dtypes)), squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes):
        rows = [r for r in targets["rows"] if r["dtype"] == dtype]
        series = {c: [r["speedups"].get(c, 0.0) for r in rows] for c in COMPILE_GPU
                  if any(c in r["speedups"] for r in rows)}
        _grouped_bars(ax, [r["model"] for r in rows], series, COMPILE_GPU)
        ax.axhline(1.0, color="black", linewidth=0.8)
        if dtype == "float16":
            ax.axhline(1.8, color="red", linestyle="--", linewidth=0.8, label="target 1.8x (geomean)")
        ax.set_ylabel("speedup over the\nsingle-stream CUDA graph")
        _legend(ax, COMPILE_LABELS, fontsize=7, ncol=3, loc="upper left")
        ax.set_ylim(0, 1.35 * max((v for vs in series.values() for v in vs), default=1.0))  # room for the legend
        ax.set_title(f"{dtype}, batch 1: Inductor segments {geomean(r['vs_graph'] for r in rows):.2f}x the graph, "
                     f"{geomean(r['vs_best_mode'] for r in rows):.2f}x the best torch.compile mode (geomeans)",
                     fontsize=10)
    gpus = sorted({s["gpu"].split(" sm_")[0] for s in targets["sources"].values() if s.get("gpu")})
    fig.suptitle(f"{' and '.join(gpus) or 'GPU'}: opsched against torch.compile", fontsize=11)


@figure("gpu", "gpu-NVIDIA_H100_80GB_HBM3")
def draw_gpu(plt, gpu: Results) -> None:  # type: ignore[no-untyped-def]
    rows = [r for r in gpu["rows"] if r["batch"] == 1 and "graph" in r["median_ms"]]
    dtypes = [d for d in ("float32", "float16", "bfloat16") if any(r["dtype"] == d for r in rows)]
    fig, axes = plt.subplots(len(dtypes), 1, figsize=(11, 3.4 * len(dtypes)), squeeze=False)
    for ax, dtype in zip(axes[:, 0], dtypes):
        mine = [r for r in rows if r["dtype"] == dtype]
        models = [r["model"] for r in mine]
        series = _over_graph(mine, GPU_CONTENDERS)
        _grouped_bars(ax, models, series, GPU_CONTENDERS)
        bound = [r["median_ms"]["graph"] / r["critical_path_bound_ms"] for r in mine]
        ax.plot(range(len(models)), bound, "k_", markersize=14, label="critical-path bound")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.axhline(1.5, color="red", linestyle="--", linewidth=0.8, label="target 1.5x (geomean)")
        ios = [v for v in series.get("ios", []) if v > 0]
        ax.set_title(f"{dtype}, batch 1: IOS {geomean(ios):.2f}x the single-stream CUDA graph (geomean)"
                     if ios else f"{dtype}, batch 1", fontsize=10)
        ax.set_ylabel("speedup over the\nsingle-stream CUDA graph")
        ax.legend(fontsize=7, ncol=3, loc="upper left")
    fig.suptitle(f"{gpu['environment'].get('gpu', 'GPU').split(' sm_')[0]}: opsched's captured plans", fontsize=11)


CPU_CONTENDERS = {"eager PyTorch": "#d62728", "ORT parallel": "#bcbd22", "opsched sequential": "#7f7f7f",
                  "opsched greedy": "#9467bd", "opsched IOS": "#1f77b4", "opsched optimize()": "#2ca02c"}


@figure("cpu", "cpu")
def draw_cpu(plt, cpu: Results) -> None:  # type: ignore[no-untyped-def]
    rows = [r for r in cpu["rows"] if r["batch"] == 1]
    models = [r["model"] for r in rows]
    series = {c: [r["median_ms"]["ORT sequential"] / r["median_ms"][c] for r in rows]
              for c in CPU_CONTENDERS if all(c in r["median_ms"] for r in rows)}
    fig, ax = plt.subplots(figsize=(11, 3.8))
    _grouped_bars(ax, models, series, CPU_CONTENDERS)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(1.1, color="red", linestyle="--", linewidth=0.8, label="target 1.1x (geomean)")
    ax.set_ylabel("speedup over ONNX Runtime\nsequential (its defaults)")
    ax.legend(fontsize=7, ncol=4, loc="upper left")
    ax.set_ylim(0, 1.45)
    opt = series.get("opsched optimize()")
    ax.set_title(f"{cpu['environment']['machine']}, batch 1: optimize() {geomean(opt):.2f}x ONNX Runtime "
                 f"sequential, {cpu['geomean']['IOS vs eager']:.1f}x eager PyTorch (geomean)" if opt else "",
                 fontsize=10)


ABLATION = {"layer by layer": "#7f7f7f", "+ grouping": "#9467bd", "+ split": "#ff7f0e",
            "+ instance order": "#1f77b4"}


@figure("memory", "memory")
def draw_memory(plt, memory: Results) -> None:  # type: ignore[no-untyped-def]
    batch = max(r["batch"] for r in memory["results"])
    rows = [r for r in memory["results"] if r["batch"] == batch]
    models = [r["model"] for r in rows]
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(11, 6))
    for ax, key, label in ((top, "l3_mib", "simulated L3 MiB"), (bottom, "ms", "simulated ms")):
        _grouped_bars(ax, models, {k: [r["ablation"][k][key] for r in rows] for k in ABLATION}, ABLATION)
        ax.set_ylabel(label)
        ax.tick_params(axis="x", labelrotation=20)
    fig.tight_layout()
    top.legend(fontsize=7, ncol=4, loc="upper left")
    top.set_title(f"GraphTurbo's ablation under the traffic simulator, batch {batch}, "
                  f"{memory['environment']['machine']}", fontsize=10)


@figure("memory-budget", "memory-budget")
def draw_memory_budget(plt, budget: Results) -> None:  # type: ignore[no-untyped-def]
    rows = [r for r in budget["models"] if r["ios"]["peak"] > r["sequential"]["peak"]]
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for r in rows:
        seq = r["sequential"]
        points = [seq, *sorted(r["within"], key=lambda p: p["peak"]), r["ios"]]
        ax.plot([p["peak"] / seq["peak"] for p in points], [seq["ms"] / p["ms"] for p in points], "o-", markersize=3,
                label=r["model"])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("peak of live activations / the sequential plan's")
    ax.set_ylabel("estimated speedup over sequential")
    ax.legend(fontsize=7, loc="lower right")
    ax.set_title(f"IOS within a memory budget (analytic {budget['device']}): from one operator at a time to "
                 f"unconstrained", fontsize=9)


SCHEDULES = {"Sequential": "#7f7f7f", "Greedy": "#9467bd", "IOS-Merge": "#17becf", "IOS-Parallel": "#ff7f0e",
             "IOS-Both": "#1f77b4"}


@figure("schedules", "schedules")
def draw_schedules(plt, sched: Results) -> None:  # type: ignore[no-untyped-def]
    rows = sched["models"]
    models = [r["model"] for r in rows]
    series = {v: [r["estimated_ms"]["Sequential"] / r["estimated_ms"][v] for r in rows] for v in SCHEDULES}
    fig, ax = plt.subplots(figsize=(9, 3.6))
    _grouped_bars(ax, models, series, SCHEDULES)
    width = 0.8 / len(SCHEDULES)
    for i, r in enumerate(rows):  # IOS's own measured V100 figures, same order
        measured = (r.get("ios_reference") or {}).get("measured_v100_ms")
        if measured:
            xs = [i + (k - (len(SCHEDULES) - 1) / 2) * width for k in range(len(SCHEDULES))]
            ax.plot(xs, [measured[0] / m for m in measured], "k.", markersize=6,
                    label="IOS, measured on a V100" if i == 0 else None)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylim(0, 1.9)
    ax.set_ylabel("speedup over sequential")
    ax.legend(fontsize=7, ncol=3, loc="upper right")
    ax.set_title(f"Simulated IOS table (analytic {sched['device']} model, P(r={sched['options']['max_group_size']}, "
                 f"s={sched['options'].get('max_lanes', sched['options'].get('max_groups'))}))", fontsize=10)


STAGE_COUNTS = {"IOS stages (its graphs)": ("ios_stages", "#d62728"),
                "IOS's rule on this graph": ("by node set", "#ff9896"),
                "opsched DP": ("dp distinct", "#1f77b4"),
                "floor (group bounds)": ("floor", "#7f7f7f"),
                "floor (with sub-chains)": ("floor with sub-chains", "#c7c7c7"),
                "floor skipping states (suffix bound 90% exact)": ("floor skipping states, bound 0.9", "#e7e7e7")}


@figure("stage-counts", "stage-floor", "stage-floor-ios-randwire?")
def draw_stage_counts(plt, floor: Results, ios_wiring: Results | None) -> None:  # type: ignore[no-untyped-def]
    rows = list(floor["models"]) + (list(ios_wiring["models"]) if ios_wiring else [])
    labels = [r.get("title", r["model"]).replace(" (stored graphs)", ", on IOS's graphs") for r in rows]
    series = {name: [float(r.get(key) or 0) for r in rows] for name, (key, _) in STAGE_COUNTS.items()}
    fig, ax = plt.subplots(figsize=(11.5, 3.8))
    _grouped_bars(ax, labels, series, {name: color for name, (_, color) in STAGE_COUNTS.items()})
    for i, r in enumerate(rows):
        if r.get("ios_stages"):
            ax.plot([i - 0.45, i + 0.45], [r["ios_stages"] / 10] * 2, "r--", linewidth=1,
                    label="a tenth of IOS's count" if i == 0 else None)
    ax.set_yscale("log")
    ax.set_ylabel("distinct stages priced")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(f"Stages to price at P(3, 8) (analytic {floor['device']}); floors: what any search proving its "
                 f"optimum from monotone bounds must price", fontsize=9)


def load(name: str) -> Results | None:
    """docs/results/<name>.json; ``name?`` marks results a figure can do without."""
    path = RESULTS / f"{name.rstrip('?')}.json"
    return json.loads(path.read_text()) if path.exists() else None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="*", choices=list(FIGURES), help="draw only these")
    p.add_argument("--out", type=Path, default=RESULTS / "figures", help="directory for the PNG files")
    args = p.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.only or FIGURES:
        sources, draw = FIGURES[name]
        results = [load(s) for s in sources]
        missing = [s for s, r in zip(sources, results) if r is None and not s.endswith("?")]
        if missing:
            print(f"{name}.png: skipped, no {', '.join(f'docs/results/{m}.json' for m in missing)}")
            continue
        draw(plt, *results)
        path = args.out / f"{name}.png"
        plt.tight_layout()
        plt.savefig(path, dpi=110)
        plt.close("all")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()

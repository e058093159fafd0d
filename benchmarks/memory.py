"""Memory-hierarchy-aware scheduling on this CPU: GraphTurbo's split plans against ONNX Runtime's
own session and opsched's unsplit plan, at batch 1, 8 and 32, on the zoo and the convolutional
models of the real-model corpus at 224 pixels (-> docs/results/memory.md).

For each model and batch, in one process, interleaved in a fresh order each round (each
contender sleeps 50 ms in its turn, runs once untimed, then ``block`` timed calls): ONNX
Runtime's own session of the model's torch.onnx export (default options), opsched's unsplit
plan (the sequential schedule on the ORT backend: on 2 cores at these batches, what optimize()
keeps), and the ``graphturbo`` plan on the ORT backend on every core's lane and on one lane.
Beside the latencies:

* whether the model's activations (the sequential plan's sum of intermediate values) exceed the
  last-level cache this machine reports;
* the simulator's figures for the unsplit and the split plan (DRAM and cache bytes, latency),
  under this machine's hierarchy with its bandwidths measured (``--hierarchy cpu`` for the
  typical figures), which is also what the split plans are made for;
* the profiler's: where the split plan's time goes, by category of kernel (ORT's own profiler),
  so that time in the slices and joins between sub-graphs shows beside the compute;
* the ablation under the simulator, the shape of the paper's Fig. 15: layer by layer, + grouping
  (sub-graphs unsplit), + split (instances, breadth-first), + instance order (depth-first).

    python benchmarks/memory.py                                  # the default models, batch 1 8 32
    python benchmarks/memory.py --models resnet18 --corpus --batch 8 --rounds 3
    python benchmarks/memory.py --hierarchy cpu                  # preset bandwidths, not measured
    python benchmarks/memory.py --batch 8 32 --corpus --name memory-epyc  # another machine, zoo only
"""

from __future__ import annotations

import argparse
import io
import statistics
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
from _report import geomean, write_table  # noqa: E402

from opsched import from_torch  # noqa: E402
from opsched.cost import AnalyticCostModel, host_cpu_spec  # noqa: E402
from opsched.cost.hierarchy import hierarchy  # noqa: E402
from opsched.models import example_inputs, get_model, list_models  # noqa: E402
from opsched.module import ScheduledModule  # noqa: E402
from opsched.schedulers import schedule  # noqa: E402
from opsched.schedulers.graphturbo import GraphTurboOptions, graphturbo_groups  # noqa: E402
from opsched.schedulers.memory import Group, bind, breadth_first, depth_first, instance_dag, simulate  # noqa: E402
from opsched.testing.corpus import corpus  # noqa: E402
from opsched.testing.export import export_onnx  # noqa: E402
from opsched.timing import interleave, paired_ratio  # noqa: E402

MIB = 2**20
DEFAULT_MODELS = ["squeezenet1_1", "resnet18", "googlenet", "inception_v3", "resnet50", "randwire_small",
                  "nasnet_mobile"]
#: Convolutional corpus entries (Hugging Face definitions) at full image size.
DEFAULT_CORPUS = ["resnet", "regnet", "mobilenet_v2", "convnext"]


def ablation(graph, preset: str) -> dict[str, dict[str, float]]:  # type: ignore[no-untyped-def]
    """Simulated DRAM bytes and latency of the paper's ablation steps under the hierarchy ``preset``."""
    grouped, h = graphturbo_groups(graph, GraphTurboOptions(hierarchy=preset, split_when="fits"), "cpu")
    cores = h.cores
    steps = {
        "layer by layer": ([Group((n.name,)) for n in graph.nodes], breadth_first),
        "+ grouping": ([Group(g.nodes) for g in grouped], breadth_first),
        "+ split": (grouped, breadth_first),
        "+ instance order": (grouped, depth_first),
    }
    out = {}
    for label, (groups, order_of) in steps.items():
        dag = instance_dag(graph, groups)
        order = order_of(dag.preds)
        t = simulate(dag, order, bind(dag, order, cores), h)
        out[label] = {"dram_mib": t.bytes["DRAM"] / MIB, "l3_mib": t.bytes.get("L3", 0) / MIB,
                      "ms": t.latency_ms}
    return out


def where_time_goes(module: ScheduledModule, inputs: tuple[torch.Tensor, ...]) -> dict[str, float]:
    """ms per kernel category in one profiled run (ORT's profiler)."""
    spent: dict[str, float] = defaultdict(float)
    for e in module.profile(*inputs):
        spent[e.category] += e.end_ms - e.start_ms
    return {k: round(v, 2) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}


def zoo_model(name: str, batch: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], bytes]:
    """A zoo model at ``batch``, and its torch.onnx export (TorchScript exporter, opset 17)."""
    model, inputs = get_model(name).eval(), example_inputs(name, batch)
    buf = io.BytesIO()
    torch.onnx.export(model, inputs, buf, dynamo=False, opset_version=17, input_names=["x"])
    return model, inputs, buf.getvalue()


def corpus_model(name: str, batch: int, size: int) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...], bytes]:
    """A corpus model on ``batch`` images of ``size`` pixels, exported as users export it."""
    model, (x,) = corpus()[name].build()
    inputs = (torch.randn(batch, x.shape[1], size, size),)
    proto, _ = export_onnx(model, inputs)
    return model, inputs, proto.SerializeToString()


def run(name: str, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], onnx_bytes: bytes, preset: str,
        rounds: int, block: int) -> tuple[list[object], dict[str, object]]:
    batch = inputs[0].shape[0]
    session = ort.InferenceSession(onnx_bytes, providers=["CPUExecutionProvider"])
    graph = from_torch(model, inputs)
    cost = AnalyticCostModel(host_cpu_spec())
    h = hierarchy(preset)  # the measured one is measured once per process
    plans = {"unsplit": schedule(graph, "sequential", cost),
             "split": schedule(graph, "graphturbo", cost, max_lanes=h.cores, hierarchy=preset, split_when="fits"),
             "split 1 lane": schedule(graph, "graphturbo", cost, max_lanes=1, hierarchy=preset, split_when="fits")}
    modules = {k: ScheduledModule(graph, s, backend="ort") for k, s in plans.items()}
    feeds = {session.get_inputs()[0].name: inputs[0].numpy()}
    calls = {"ORT session": lambda: session.run(None, feeds),
             **{f"opsched {k}": (lambda m=m: m(*inputs)) for k, m in modules.items()}}
    with torch.no_grad():
        times = interleave(calls, rounds, warmup=1, settle_s=0.05, block=block)
        profile = where_time_goes(modules["split"], inputs)
    med = {k: statistics.median(v) for k, v in times.items()}

    def ratio(slow: str, fast: str) -> float:
        return paired_ratio(times[slow], times[fast])
    best_split = min(("opsched split", "opsched split 1 lane"), key=med.__getitem__)
    ratios = {"split vs ORT": ratio("ORT session", best_split),
              "split vs unsplit": ratio("opsched unsplit", best_split)}
    activations = sum(n.out.nbytes for n in graph.nodes)
    llc = h.levels[-2].capacity or 0
    steps = ablation(graph, preset)
    split = plans["split"]
    record = {"model": name, "batch": batch, "median_ms": med, "ratios": ratios, "activations_mib": activations / MIB,
              "llc_mib": llc / MIB, "exceeds_llc": activations > llc, "split_stats": dict(split.stats),
              "simulated_unsplit_ms": steps["layer by layer"]["ms"], "simulated_split_ms": split.estimated_ms,
              "profile_split_ms": profile, "ablation": steps}
    row = [name, batch, *(f"{med[k]:.1f}" for k in calls), *(f"{v:.2f}" for v in ratios.values()),
           f"{activations / MIB:.0f}{' > LLC' if activations > llc else ''}",
           f"{split.stats['split groups']}/{split.stats['groups']} "
           f"({', '.join(map(str, split.stats['factors'])) or '-'}"
           f"{f'; {rows} by rows' if (rows := split.stats['row splits']) else ''})",
           f"{steps['layer by layer']['dram_mib']:.0f} / {steps['+ instance order']['dram_mib']:.0f}",
           f"{steps['layer by layer']['ms']:.0f} / {steps['+ instance order']['ms']:.0f}",
           ", ".join(f"{k} {v:.0f}" for k, v in list(profile.items())[:3])]
    return row, record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=DEFAULT_MODELS, choices=list_models())
    p.add_argument("--corpus", nargs="*", default=DEFAULT_CORPUS,
                   help="real-model corpus entries (opsched.testing.corpus) to run too, on --image-size images")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--batch", nargs="*", type=int, default=[1, 8, 32])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--block", type=int, default=2)
    p.add_argument("--hierarchy", default="cpu-measured", help="the hierarchy preset plans are made and simulated for")
    p.add_argument("--name", default="memory", help="results page name (docs/results/NAME.md): another machine's "
                                                  "run kept beside this one's")
    args = p.parse_args()
    torch.set_grad_enabled(False)
    h = hierarchy(args.hierarchy)
    print(h, flush=True)
    rows, records = [], []
    for batch in args.batch:
        models = [(name, lambda n=name, b=batch: zoo_model(n, b)) for name in args.models]
        models += [(f"{name} (corpus)", lambda n=name, b=batch: corpus_model(n, b, args.image_size))
                   for name in args.corpus]
        for name, make in models:
            row, record = run(name, *make(), args.hierarchy, args.rounds, args.block)
            rows.append(row)
            records.append(record)
            print(" | ".join(map(str, row)), flush=True)
    headers = ["model", "batch", "ORT session ms", "unsplit ms", "split ms", "split 1 lane ms", "split vs ORT",
               "split vs unsplit", "activations MiB", "split groups (factors)", "sim. DRAM MiB unsplit / split",
               "sim. ms unsplit / split", "split plan's profile, ms by category"]
    big = [r for r in records if r["batch"] > 1]
    geo = {f"split vs ORT, batch {b}": geomean(r["ratios"]["split vs ORT"] for r in records if r["batch"] == b)  # type: ignore[index]
           for b in args.batch}
    geo["split vs ORT, activations > LLC"] = geomean(r["ratios"]["split vs ORT"] for r in big if r["exceeds_llc"])  # type: ignore[index]
    intro = ["# Memory-hierarchy-aware scheduling on this CPU (GraphTurbo's split plans)", "",
             "Latency medians (interleaved) of ONNX Runtime's own session, opsched's unsplit plan and the "
             "graphturbo split plan (every core's lane, and one lane), all on ONNX Runtime kernels; ratios are "
             "medians of per-round ratios against the faster split plan. Simulated figures come from "
             "`opsched.schedulers.memory.traffic` (layer by layer / split and depth-first) under this machine's "
             f"hierarchy, which the split plans are made for: {h}. The profile is ORT's own, of the split plan. "
             "The ablation per model is in the JSON. "
             "Models marked (corpus) are Hugging Face definitions from `opsched.testing.corpus` on "
             f"{args.image_size}-pixel images, their ORT session from their `torch.onnx.export` (dynamo)."]
    write_table(args.name, intro, headers, rows, geo, {"results": records})


if __name__ == "__main__":
    main()

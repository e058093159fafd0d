"""Why GraphTurbo's split plans do not pay on a GPU: the traffic simulator's figures beside the
profiler's, row by row (-> docs/results/memory-gpu-explained.md). Runs on any machine.

It reads the rows a GPU run of ``benchmarks/gpu.py --contenders graph ios graphturbo --profile``
wrote (``docs/results/memory-gpu*.json``: median latencies, each contender's kernels as
torch.profiler saw them, the GPU memory each held), rebuilds each row's model at its batch and
precision, makes the same ``graphturbo`` plan for the GPU's memory hierarchy preset (the row's
own report says which sub-graphs it split; the two are checked to agree) and simulates it beside
the layer-by-layer order of the same graph. Beside them, the bound that settles the question:
the time the layer-by-layer order's DRAM traffic takes at the HBM's full bandwidth, which is the
most any reordering of the same kernels could save, against the kernel time the profiler
measured.

    python benchmarks/memory_gpu_explained.py      # docs/results/memory-gpu.json and -c, where there
    python benchmarks/memory_gpu_explained.py --results memory-gpu-b  # another run's rows
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import RESULTS, write  # noqa: E402

import opsched  # noqa: E402
from opsched.cli.table import format_table  # noqa: E402
from opsched.cost.devices import gpu_spec_named_in  # noqa: E402
from opsched.ir import Graph, node_flops  # noqa: E402
from opsched.models import example_inputs, get_model  # noqa: E402
from opsched.schedulers.graphturbo import GraphTurboOptions, graphturbo_groups  # noqa: E402
from opsched.schedulers.memory import bind, breadth_first, depth_first, instance_dag, simulate, singletons  # noqa: E402

MIB = 2**20


def simulated(graph: Graph, preset: str) -> dict[str, Any]:
    """The layer-by-layer order and the default ``graphturbo`` plan of ``graph`` (one lane, as the
    CUDA backend runs it) under the hierarchy ``preset``: DRAM MiB and latency of each, and the
    plan's sub-graph counts as its report words them."""
    groups, h = graphturbo_groups(graph, GraphTurboOptions(hierarchy=preset, max_lanes=1), "cuda")
    dram = h.levels[-1]
    out: dict[str, Any] = {"hierarchy": str(h), "dram_gbps": dram.bandwidth_gbps,
                           "groups": len(groups), "split": sum(1 for g in groups if g.factor > 1)}
    plans = {"layer": (singletons(graph), breadth_first), "graphturbo": (groups, depth_first)}
    for key, (parts, order_of) in plans.items():
        dag = instance_dag(graph, parts)
        order = order_of(dag.preds)
        traffic = simulate(dag, order, bind(dag, order, 1), h)
        out[key] = {"dram_mib": traffic.bytes[dram.name] / MIB, "ms": traffic.latency_ms}
    return out


def measured_split(report: str) -> tuple[int, int] | None:
    """(sub-graphs, split ones) from a graphturbo module's report line."""
    found = re.search(r"(\d+) sub-graphs, (\d+) split", report)
    return (int(found[1]), int(found[2])) if found else None


def explain(row: dict[str, Any], device: str) -> dict[str, Any]:
    spec = gpu_spec_named_in(device)
    if spec is None:
        raise SystemExit(f"the results' device {device!r} names no GPU preset")
    model = get_model(row["model"]).eval()
    graph = opsched.place(opsched.from_torch(model, example_inputs(row["model"], row["batch"])), "cpu", row["dtype"])
    sim = simulated(graph, spec.name)
    profile = row["profile"]
    made = (sim["groups"], sim["split"])
    ran = measured_split(row["report"]["graphturbo"])
    if ran is not None and ran != made:
        raise SystemExit(f"{row['model']} batch {row['batch']}: the plan made here has {made[0]} sub-graphs, "
                         f"{made[1]} split; the one measured had {ran[0]}, {ran[1]} (a changed scheduler?)")
    dram_ms = sim["layer"]["dram_mib"] * MIB / (sim["dram_gbps"] * 1e9) * 1e3
    flops = sum(node_flops(n, graph.input_types(n), graph.node_param_types(n)) for n in graph.nodes)
    tflops = flops / (profile["graph"]["kernel_ms"] * 1e-3) / 1e12
    return {"model": row["model"], "batch": row["batch"], "dtype": row["dtype"], "simulated": sim,
            "dram_floor_ms": dram_ms, "median_ms": row["median_ms"], "profile": profile,
            "held_mib": row["held_mib"], "graph_tflops": tflops, "of_preset_peak": tflops * 1e3 / spec.peak_gflops}


def table(records: list[dict[str, Any]]) -> str:
    headers = ["model", "batch", "split sub-graphs", "kernels: graph, GraphTurbo", "kernel ms: graph, GraphTurbo",
               "measured speedup", "simulated DRAM MiB: layer, GraphTurbo", "simulated ms: layer, GraphTurbo",
               "simulated speedup", "layer DRAM at full HBM ms", "its share of kernel time",
               "graph TFLOPS (of the preset's peak)", "GPU memory MiB: graph, GraphTurbo"]
    rows = []
    for r in records:
        sim, prof, med = r["simulated"], r["profile"], r["median_ms"]
        rows.append([r["model"], r["batch"], f"{sim['split']} of {sim['groups']}",
                     f"{prof['graph']['kernels']:.0f}, {prof['graphturbo']['kernels']:.0f}",
                     f"{prof['graph']['kernel_ms']:.2f}, {prof['graphturbo']['kernel_ms']:.2f}",
                     f"{med['graph'] / med['graphturbo']:.2f}x",
                     f"{sim['layer']['dram_mib']:,.0f}, {sim['graphturbo']['dram_mib']:,.0f}",
                     f"{sim['layer']['ms']:.2f}, {sim['graphturbo']['ms']:.2f}",
                     f"{sim['layer']['ms'] / sim['graphturbo']['ms']:.2f}x",
                     f"{r['dram_floor_ms']:.2f}", f"{r['dram_floor_ms'] / prof['graph']['kernel_ms']:.1%}",
                     f"{r['graph_tflops']:.0f} ({r['of_preset_peak']:.2f}x)",
                     f"{r['held_mib']['graph']:.0f}, {r['held_mib']['graphturbo']:.0f}"])
    return format_table(headers, rows, markdown=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", nargs="*", default=["memory-gpu", "memory-gpu-c"],
                   help="results names (docs/results/NAME.json) of gpu.py runs with graph, graphturbo and --profile")
    p.add_argument("--models", nargs="*", help="only these models' rows (default: every row)")
    p.add_argument("--name", default="memory-gpu-explained")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default docs/results)")
    args = p.parse_args()
    records, seen, sources, read = [], set(), [], []
    for name in args.results:
        if not (RESULTS / f"{name}.json").exists():
            print(f"no docs/results/{name}.json: its rows are left out", flush=True)
            continue
        data = json.loads((RESULTS / f"{name}.json").read_text())
        read.append(name)
        sources.append(f"`{name}` ({data['environment'].get('gpu', data['device'])}: `{data['command']}`)")
        for row in data["rows"]:
            key = (row["model"], row["batch"], row["dtype"])
            if (key in seen or "profile" not in row or "graphturbo" not in row["median_ms"]
                    or (args.models and row["model"] not in args.models)):
                continue  # an earlier run's row of the same case, a run without the profiler, a model not asked
            seen.add(key)
            records.append(explain(row, data["device"]))
            print(records[-1]["model"], records[-1]["batch"], f"{records[-1]['dram_floor_ms']:.2f} ms", flush=True)
    if not records:
        raise SystemExit(f"no profiled graph-and-graphturbo rows in {args.results}")
    intro = [
        "# Where GraphTurbo's time goes on a GPU: the simulator beside the profiler", "",
        "Each row: a GPU run's medians and torch.profiler's kernel figures (summed kernel time of one call) for the "
        "model captured into a single-stream CUDA graph and for opsched's default `graphturbo` plan; beside them, "
        "under the GPU's memory-hierarchy preset, the traffic simulator's DRAM bytes and latency for the "
        "layer-by-layer order and for that plan (remade here; its sub-graph counts agree with the measured "
        "plan's report). *Layer DRAM at full HBM*: the simulated DRAM bytes of the layer-by-layer order moved at "
        "the HBM's full bandwidth, the most that any order or split of the same kernels could save; *its share*: "
        "that against the measured kernel time of the single-stream graph. *Graph TFLOPS*: the model's FLOPs (as "
        "opsched counts them) over the single-stream graph's kernel time, and that against the preset's peak, "
        "the fp32 one every precision is priced at (the tensor cores' dense float16 peak is about 15x it). "
        "*GPU memory*: what each contender held (peak reserved).", "",
        f"Hierarchy: {records[0]['simulated']['hierarchy']}.", "",
        "Sources: " + "; ".join(sources) + ".", "",
    ]
    write(args.name, "\n".join([*intro, table(records)]), {"rows": records, "sources": read}, args.out)
    print(table(records))
    print(f"wrote {args.out / args.name}.md")


if __name__ == "__main__":
    main()

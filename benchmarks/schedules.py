"""Simulated reproduction of the IOS schedule table (IOS paper, section 5.1) and search cost.

For each model: the estimated latency of the sequential, greedy, IOS-Merge, IOS-Parallel and
IOS-Both schedules under the analytic cost model (default: the V100 preset), the lower bound
max(critical path of isolated units, total work at full device throughput), and the search
statistics of IOS-Both at P(r, s) next to the counts of the original IOS optimizer.

    python benchmarks/schedules.py                      # the four IOS networks, V100
    python benchmarks/schedules.py --models inception_v3 --device H100

Our RandWire's stage graphs are drawn with our own seeds, so its counts are not IOS's. With
IOS's four stored graphs (``python/models/randwire_graphs/generated/ws-16-4-0.75-2.txt`` and
``ws-32-4-0.75-{3,4,5}.txt`` in its repository) the RandWire row is like for like:

    python benchmarks/schedules.py --models randwire_large --randwire-graphs ws-16-4-0.75-2.txt \
        ws-32-4-0.75-3.txt ws-32-4-0.75-4.txt ws-32-4-0.75-5.txt --name schedules-ios-randwire
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write  # noqa: E402

from opsched import from_torch  # noqa: E402
from opsched.cli.table import format_table  # noqa: E402
from opsched.cost import (
    AnalyticCostModel,  # noqa: E402
    StageCoster,  # noqa: E402
)
from opsched.ir import Graph  # noqa: E402
from opsched.ir.analysis import critical_path  # noqa: E402
from opsched.models import example_inputs, get_model  # noqa: E402
from opsched.models.randwire import RandWire  # noqa: E402
from opsched.schedule import Stage  # noqa: E402
from opsched.schedulers import UnitGraph, schedule  # noqa: E402

# The original optimizer's statistics at r=3, s=8, max_part_size=50 (research/ios.md, 2.7),
# and its measured V100 latencies (ms; IOS README, section 5.1).
IOS_SEARCH = {"inception_v3": (1_206, 28_874, 5_479), "squeezenet1_0": (78, 386, 230),
              "randwire_large": (14_734, 1_843_444, 212_895), "nasnet_large": (42_966, 4_695_449, 240_704)}
IOS_MEASURED = {"inception_v3": (6.51, 4.62, 5.39, 4.11, 4.03), "randwire_large": (8.49, 6.27, 8.54, 6.02, 6.02),
                "nasnet_large": (22.95, 16.78, 22.94, 16.04, 16.04), "squeezenet1_0": (0.86, 0.98, 0.74, 0.82, 0.73)}
VARIANTS = [("Sequential", "sequential", {}), ("Greedy", "greedy", {}),
            ("IOS-Merge", "ios", {"strategies": ("merge",)}), ("IOS-Parallel", "ios", {"strategies": ("parallel",)}),
            ("IOS-Both", "ios", {"strategies": ("parallel", "merge")})]


def zoo_model(name: str, randwire_graphs: list[str] | None = None) -> tuple[str, torch.nn.Module]:
    """(label, model): the zoo's, or RandWire-large on the stage graphs in ``randwire_graphs``."""
    if name == "randwire_large" and randwire_graphs:
        return f"{name} (stored graphs)", RandWire.from_edge_lists(randwire_graphs).eval()
    return name, get_model(name)


def stored_graphs(files: list[str]) -> str:
    return (f"RandWire-large's stage graphs were read from {', '.join(f'`{Path(f).name}`' for f in files)}; IOS's "
            f"own, in `python/models/randwire_graphs/generated/` of its repository, give the like-for-like "
            f"comparison with its counts.")


def zoo_graph(name: str, randwire_graphs: list[str] | None = None) -> tuple[str, Graph]:
    label, model = zoo_model(name, randwire_graphs)
    return label, from_torch(model, example_inputs(name), name=name)


def lower_bound(graph, cost: AnalyticCostModel) -> float:  # type: ignore[no-untyped-def]
    ug = UnitGraph.build(graph)
    coster = StageCoster(graph, cost)
    unit_ms = {name: coster.latency(Stage((names,))) for names in ug.units for name in names[:1]}
    per_node = [unit_ms.get(n.name, 0.0) for n in graph.nodes]
    work = sum(cost.op_cost(graph, n).area_ms for n in graph.nodes)
    return max(critical_path(graph, per_node)[0], work)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["inception_v3", "randwire_large", "nasnet_large", "squeezenet1_0"])
    p.add_argument("--device", default="V100")
    p.add_argument("--max-group-size", type=int, default=3)
    p.add_argument("--max-lanes", type=int, default=8, help="s: groups per stage")
    p.add_argument("--max-part-size", type=int, default=50)
    p.add_argument("--randwire-graphs", nargs=4, metavar="FILE",
                   help="RandWire-large on these stage graphs (edge lists, e.g. IOS's), not ours")
    p.add_argument("--name", default="schedules", help="results file name under docs/results/")
    args = p.parse_args()
    cost = AnalyticCostModel(args.device)
    options = dict(max_group_size=args.max_group_size, max_lanes=args.max_lanes, max_part_size=args.max_part_size)
    latency_rows, search_rows, records = [], [], []
    for name in args.models:
        start = time.perf_counter()
        title, graph = zoo_graph(name, args.randwire_graphs)
        import_s = time.perf_counter() - start
        results = {}
        for label, scheduler, extra in VARIANTS:
            kw = {**options, **extra} if scheduler == "ios" else {}
            t = time.perf_counter()
            sched = schedule(graph, scheduler, cost, **kw)
            results[label] = (sched, time.perf_counter() - t)
            print(f"{name:15s} {label:13s} {sched.estimated_ms:8.3f} ms  ({time.perf_counter() - t:.1f} s)", flush=True)
        bound = lower_bound(graph, cost)
        seq = results["Sequential"][0].estimated_ms
        both, both_s = results["IOS-Both"]
        latency_rows.append([title] + [f"{results[label][0].estimated_ms:.3f}" for label, _, _ in VARIANTS]
                            + [f"{seq / both.estimated_ms:.2f}x", f"{bound:.3f}", f"{both.estimated_ms / bound:.2f}"])
        ios_states, ios_trans, ios_stages = IOS_SEARCH.get(name, (None, None, None))
        st = both.stats
        search_rows.append([title, st["parts"], st["states"], st["transitions"], st["stage_requests"],
                            st["distinct_stages"], st["structural_hits"], st["parts_reused"], f"{both_s:.1f}",
                            ios_states or "-", ios_trans or "-", ios_stages or "-",
                            f"{ios_stages / st['distinct_stages']:.1f}x" if ios_stages else "-"])
        records.append({"model": name, "title": title, "import_s": import_s, "lower_bound_ms": bound,
                        "estimated_ms": {label: results[label][0].estimated_ms for label, _, _ in VARIANTS},
                        "search_s": {label: results[label][1] for label, _, _ in VARIANTS},
                        "ios_both_stats": dict(st), "ios_reference": {"search": IOS_SEARCH.get(name),
                                                                       "measured_v100_ms": IOS_MEASURED.get(name)}})
    lat_headers = ["model"] + [label for label, _, _ in VARIANTS] + ["Both vs Seq", "bound", "Both / bound"]
    search_headers = ["model", "parts", "states", "transitions", "stage requests", "distinct stages",
                      "structural hits", "parts reused", "search s", "IOS states", "IOS transitions",
                      "IOS stages", "IOS stages / ours"]
    md = "\n".join([
        f"# Schedules under the analytic {cost.device} model (simulated IOS table)", "",
        f"Estimated latency in ms at batch 1; P(r={args.max_group_size}, s={args.max_lanes}), "
        f"max_part_size={args.max_part_size}. The bound is max(critical path of isolated units, "
        f"total work at full device throughput).", "",
        format_table(lat_headers, latency_rows, markdown=True), "",
        *([stored_graphs(args.randwire_graphs), ""] if args.randwire_graphs else []),
        "IOS measured on a V100 (ms; Sequential, Greedy, IOS-Merge, IOS-Parallel, IOS-Both): " +
        "; ".join(f"{m} {v}" for m, v in IOS_MEASURED.items() if m in args.models) + ".", "",
        "## Search statistics of IOS-Both", "",
        "States and transitions of the dynamic program; *stage requests*: prices asked for "
        "(after the bound discarded what provably cannot win); *distinct stages*: structurally "
        "distinct stages priced by the cost model (what a measured search would measure). IOS "
        "counts are the original optimizer's at the same r, s and part size, on its own graphs: "
        "RandWire's compare like for like only on IOS's stored stage graphs (`--randwire-graphs`; "
        "our default wiring is drawn with our own seeds and has 2.7x the states).", "",
        format_table(search_headers, search_rows, markdown=True), ""])
    md_path, js_path = write(args.name, md, {"device": cost.device, "options": options, "models": records})
    print()
    print(format_table(lat_headers, latency_rows))
    print()
    print(format_table(search_headers, search_rows))
    print(f"\nwrote {md_path} and {js_path}")


if __name__ == "__main__":
    main()

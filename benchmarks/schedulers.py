"""Schedulers side by side: the IOS dynamic program against list scheduling and the peers' lanes.

Part 1, *simulated*: for every zoo model and device preset, each scheduler's schedule replayed
by the simulator under the preset's resource model (the same model for all, so stage barriers,
merges and lanes are compared like with like), and the wall time of the ``schedule()`` call
that made it (pricing included).

Part 2, *measured on this CPU* (``--cpu``): each scheduler with the cost information it needs,
from a fresh profile store: the DP prices stages by measuring them (under the time budget, as
``opsched.optimize`` does), ``est`` prices single operators from the analytic model of this
CPU (no measurement at all) or, as ``est (measured)``, by measuring them; the peers' lane
assignments need no costs. The plans run on the ONNX Runtime backend, interleaved in one process.

    python benchmarks/schedulers.py                                  # simulated, V100 and H100
    python benchmarks/schedulers.py --devices V100 --cpu --budget 60 # and measured on this CPU
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write  # noqa: E402

import opsched  # noqa: E402
from opsched.api import host_cpu_model, race  # noqa: E402
from opsched.cli.table import format_table  # noqa: E402
from opsched.cost import AnalyticCostModel  # noqa: E402
from opsched.cost.cached import StoredCostModel  # noqa: E402
from opsched.cost.measured import MeasuredCostModel  # noqa: E402
from opsched.cost.store import ProfileStore  # noqa: E402
from opsched.models import example_inputs, get_model, list_models  # noqa: E402
from opsched.runtime.module import ScheduledModule  # noqa: E402
from opsched.schedule import schedule  # noqa: E402
from opsched.schedule.simulate import simulate  # noqa: E402

SIMULATED = ["sequential", "greedy", "ios", "nimble", "opara", "est"]


def geomean(values: list[float]) -> float:
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def timed_once(graph, name: str, cost, **options: Any):  # type: ignore[no-untyped-def]
    """A schedule and the wall time of the call that made it (for a search that measures: its
    measurements land in a store, so a second call would not be the same work)."""
    start = time.perf_counter()
    sched = schedule(graph, name, cost, **options)
    return sched, time.perf_counter() - start


def timed_fresh(graph, name: str, make_cost: Callable[[], Any], **options: Any):  # type: ignore[no-untyped-def]
    """A schedule and the median wall time of up to five calls, each on a fresh cost model from
    ``make_cost`` (nothing priced by an earlier call), repeated while the total stays under a
    second. A call of a few milliseconds is one noisy sample (a garbage collection, the other
    core's work) on its own; a search of seconds is timed once."""
    times = []
    while not times or (len(times) < 5 and sum(times) < 1.0):
        sched, secs = timed_once(graph, name, make_cost(), **options)
        times.append(secs)
    return sched, statistics.median(times)


def simulated(graphs: dict[str, Any], device: str) -> tuple[list[list[object]], list[dict[str, Any]]]:
    cost = AnalyticCostModel(device)
    rows, records = [], []
    for name, graph in graphs.items():
        ms, secs = {}, {}
        for s in SIMULATED:
            sched, secs[s] = timed_fresh(graph, s, lambda: AnalyticCostModel(device))
            ms[s] = simulate(graph, sched, cost.resources(graph, sched.merged)).makespan_ms
            print(f"  {device} {name} {s}: {ms[s]:.3f} ms simulated, scheduled in {secs[s] * 1e3:.1f} ms", flush=True)
        records.append({"model": name, "device": device, "simulated_ms": ms, "schedule_s": secs})
        rows.append([name, *(f"{ms[s]:.3f}" for s in SIMULATED), f"{ms['est'] / ms['ios']:.3f}",
                     f"{secs['ios'] * 1e3:.1f}", f"{secs['est'] * 1e3:.2f}", f"{secs['ios'] / secs['est']:.0f}x"])
    return rows, records


def measured(name: str, budget: float, rounds: int, cache_dir: str) -> tuple[list[object], dict[str, Any]]:
    model, inputs = get_model(name), example_inputs(name)
    graph = opsched.from_torch(model, inputs)
    cores = os.cpu_count() or 1
    made: dict[str, tuple[Any, float]] = {}
    with ProfileStore(cache_dir) as store:
        m = MeasuredCostModel()
        cost = StoredCostModel(m, store, m.context(inputs[0].shape[0]))
        made["sequential"] = timed_fresh(graph, "sequential", host_cpu_model)
        made["ios"] = timed_once(graph, "ios", cost, budget_s=budget, max_groups=cores)
        before = cost.measurements
        made["est (measured)"] = timed_once(graph, "est", cost, max_lanes=cores)
        est_measurements = cost.measurements - before
        made["est"] = timed_fresh(graph, "est", host_cpu_model, max_lanes=cores)
        made["nimble"] = timed_fresh(graph, "nimble", host_cpu_model)
        made["opara"] = timed_fresh(graph, "opara", host_cpu_model)
    modules = {k: ScheduledModule(graph, s) for k, (s, _) in made.items()}
    lat = dict(zip(modules, race(*modules.values(), inputs=inputs, rounds=rounds)))
    secs = {k: t for k, (_, t) in made.items()}
    record = {"model": name, "median_ms": lat, "schedule_s": secs, "ios_stats": dict(made["ios"][0].stats),
              "est_measurements": est_measurements, "lanes": {k: len(s.lanes or ()) for k, (s, _) in made.items()}}
    cut_short = bool(made["ios"][0].stats.get("budget_exhausted"))  # its time is the budget: a lower bound
    at_least = ">= " if cut_short else ""
    row = [name, *(f"{lat[k]:.2f}" for k in modules), f"{lat['est'] / lat['ios']:.3f}",
           f"{lat['est (measured)'] / lat['ios']:.3f}", f"{at_least}{secs['ios']:.1f}", f"{secs['est'] * 1e3:.1f}",
           f"{secs['est (measured)']:.1f}", f"{at_least}{secs['ios'] / secs['est']:.0f}x"]
    print("  cpu " + " | ".join(map(str, row)), flush=True)
    return row, record


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=list_models())
    p.add_argument("--devices", nargs="*", default=["V100", "H100"])
    p.add_argument("--cpu", action="store_true", help="also measure every schedule on this CPU")
    p.add_argument("--budget", type=float, default=60.0, help="seconds of DP search per model on the CPU")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--name", default="schedulers")
    args = p.parse_args()
    graphs = {n: opsched.from_torch(get_model(n), example_inputs(n)) for n in args.models}
    out = ["# Schedulers: the IOS dynamic program, list scheduling (est) and the peers' lanes", "",
           "Batch 1. *ios*: the dynamic program (P(r=3, s=8), parallel and merge stages); *est*: "
           "early-start-time-first list scheduling on at most 8 lanes, with merges, no barriers; "
           "*nimble*: a minimum chain cover onto lanes; *opara*: a lane inherited from a producer. "
           "Schedule times are the wall time of a `schedule()` call on a fresh cost model, pricing included: "
           "the median of up to five calls within a second (a measured search: one call).", ""]
    data: dict[str, Any] = {"simulated": [], "cpu": []}
    summary = []
    for device in args.devices:
        rows, records = simulated(graphs, device)
        data["simulated"] += records
        lat = geomean([r["simulated_ms"]["est"] / r["simulated_ms"]["ios"] for r in records])
        speed = geomean([r["schedule_s"]["ios"] / r["schedule_s"]["est"] for r in records])
        summary.append(f"{device} simulated: est / ios latency {lat:.3f} (geomean), est schedules {speed:.0f}x faster")
        out += [f"## Simulated on the {device} preset (ms)", "",
                format_table(["model", *SIMULATED, "est / ios", "ios schedule ms", "est schedule ms",
                              "ios / est time"], rows, markdown=True), "",
                f"Geometric mean of est / ios latency: {lat:.3f}; of the schedule-time ratio: {speed:.0f}x.", ""]
    if args.cpu:
        cache_dir = tempfile.mkdtemp(prefix="opsched-bench-")
        rows, records = [], []
        for name in args.models:
            row, record = measured(name, args.budget, args.rounds, cache_dir)
            rows.append(row)
            records.append(record)
        data["cpu"] = records
        lat = geomean([r["median_ms"]["est"] / r["median_ms"]["ios"] for r in records])
        lat_m = geomean([r["median_ms"]["est (measured)"] / r["median_ms"]["ios"] for r in records])
        speed = geomean([r["schedule_s"]["ios"] / r["schedule_s"]["est"] for r in records])
        cut_short = [r["model"] for r in records if r["ios_stats"].get("budget_exhausted")]
        at_least = "at least " if cut_short else ""
        summary.append(f"CPU measured: est / ios latency {lat:.3f}, est (measured) / ios {lat_m:.3f} (geomean); "
                       f"est schedules {at_least}{speed:.0f}x faster than the measured DP")
        names = list(records[0]["median_ms"])
        out += [f"## Measured on this CPU ({os.cpu_count()} cores; ms, median of {args.rounds} interleaved rounds)", "",
                "Schedule time: the DP's includes measuring its stages (fresh profile store, budget "
                f"{args.budget:.0f} s); est's is the analytic model only; est (measured) runs after the "
                "DP on the same store, so its time counts only the operators and merges the DP had not measured. "
                "Where the DP ran out of its budget (marked >=), its time is the budget, less than the search "
                "needs, and its schedule finishes the unsolved parts with greedy or sequential stages.", "",
                format_table(["model", *names, "est / ios", "est (measured) / ios", "ios schedule s",
                              "est schedule ms", "est (measured) schedule s", "ios / est time"], rows,
                             markdown=True), "",
                f"Geometric means: est / ios latency {lat:.3f}; est (measured) / ios {lat_m:.3f}; "
                f"schedule-time ratio {at_least}{speed:.0f}x"
                + (f" (the DP ran out of its budget on {', '.join(cut_short)})." if cut_short else "."), ""]
    out += ["## Summary", "", *(f"- {s}" for s in summary)]
    data["summary"] = summary
    md, js = write(args.name, "\n".join(out), data)
    print("\n".join(summary))
    print(f"wrote {md} and {js}")


if __name__ == "__main__":
    main()

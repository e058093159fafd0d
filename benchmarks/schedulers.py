"""Schedulers side by side: the IOS dynamic program against list scheduling and the peers' lanes.

Part 1, *simulated*: for every zoo model and device preset, each scheduler's schedule replayed
by the simulator under the preset's resource model (the same model for all, so stage barriers,
merges and lanes are compared like with like), and the wall time of the ``schedule()`` call
that made it (pricing included).

Part 2, *measured on this CPU* (``--cpu``) and *on this GPU* (``--gpu``): each scheduler
with the cost information it needs, from a fresh profile store: the DP prices stages by
measuring them (under the time budget, as ``opsched.optimize`` does), ``est`` prices single
operators from the analytic model of this device (this CPU, or the GPU preset the card's name
names: no measurement at all) or, as ``est (measured)``, by measuring them; the peers' lane
assignments need no costs. On the CPU the plans run on the ONNX Runtime backend; on the GPU,
on CUDA streams, each plan captured into one CUDA graph. Interleaved in one process.

    python benchmarks/schedulers.py                                  # simulated, V100 and H100
    python benchmarks/schedulers.py --devices V100 --cpu --budget 60 # and measured on this CPU
    python benchmarks/schedulers.py --devices H100 --gpu --budget 60 # and measured on this GPU
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import RESULTS, geomean, write  # noqa: E402

import opsched  # noqa: E402
from opsched.cli.table import format_table  # noqa: E402
from opsched.cost import AnalyticCostModel, ProfileStore  # noqa: E402
from opsched.costing import host_cpu_model, measured_cost  # noqa: E402
from opsched.models import example_inputs, get_model, list_models  # noqa: E402
from opsched.module import ScheduledModule  # noqa: E402
from opsched.race import race, turn_for  # noqa: E402
from opsched.schedulers import schedule  # noqa: E402
from opsched.schedulers.simulate import simulate  # noqa: E402

SIMULATED = ["sequential", "greedy", "ios", "nimble", "opara", "est"]



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
            ms[s] = simulate(graph, sched, cost.resources(graph, sched.merges)).makespan_ms
            print(f"  {device} {name} {s}: {ms[s]:.3f} ms simulated, scheduled in {secs[s] * 1e3:.1f} ms", flush=True)
        records.append({"model": name, "device": device, "simulated_ms": ms, "schedule_s": secs})
        rows.append([name, *(f"{ms[s]:.3f}" for s in SIMULATED), f"{ms['est'] / ms['ios']:.3f}",
                     f"{secs['ios'] * 1e3:.1f}", f"{secs['est'] * 1e3:.2f}", f"{secs['ios'] / secs['est']:.0f}x"])
    return rows, records


def measured(name: str, device: str, budget: float, rounds: int, cache_dir: str) -> tuple[list[object],
                                                                                          dict[str, Any]]:
    """One model's schedules made and raced on ``device`` ("cpu" or "cuda"); a table row and a record."""
    model, inputs = get_model(name), example_inputs(name)
    graph = opsched.from_torch(model, inputs)
    if device == "cuda":
        graph, inputs = opsched.place(graph, device), tuple(t.to(device) for t in inputs)
        lanes: dict[str, int] = {}
    else:  # no more concurrent groups or lanes than cores, as opsched.optimize does on a CPU
        lanes = {"max_lanes": os.cpu_count() or 1}
    made: dict[str, tuple[Any, float]] = {}
    with ProfileStore(cache_dir) as store:
        cost = measured_cost(device, store=store)
        preset = cost.backend.analytic_spec(cost.run)  # type: ignore[attr-defined]
        analytic: Callable[[], Any] = (lambda: AnalyticCostModel(preset)) if device == "cuda" else host_cpu_model
        made["sequential"] = timed_fresh(graph, "sequential", analytic)
        made["ios"] = timed_once(graph, "ios", cost, budget_s=budget, **lanes)
        before = cost.counts.timed
        made["est (measured)"] = timed_once(graph, "est", cost, **lanes)
        est_measurements = cost.counts.timed - before
        made["est"] = timed_fresh(graph, "est", analytic, **lanes)
        made["nimble"] = timed_fresh(graph, "nimble", analytic)
        made["opara"] = timed_fresh(graph, "opara", analytic)
    modules = {k: ScheduledModule(graph, s, device=device) for k, (s, _) in made.items()}
    some = next(iter(modules.values()))
    lat = race({k: (lambda m=m: m(*inputs)) for k, m in modules.items()}, clock=some.backend.clock(some.run),
               rounds=rounds, turn=turn_for(some.device.type)).medians
    secs = {k: t for k, (_, t) in made.items()}
    record = {"model": name, "median_ms": lat, "schedule_s": secs, "ios_stats": dict(made["ios"][0].stats),
              "est_measurements": est_measurements, "lanes": {k: len(s.lanes) for k, (s, _) in made.items()}}
    cut_short = bool(made["ios"][0].stats.get("budget_exhausted"))  # its time is the budget: a lower bound
    at_least = ">= " if cut_short else ""
    digits = 3 if device == "cuda" else 2
    row = [name, *(f"{lat[k]:.{digits}f}" for k in modules), f"{lat['est'] / lat['ios']:.3f}",
           f"{lat['est (measured)'] / lat['ios']:.3f}", f"{at_least}{secs['ios']:.1f}", f"{secs['est'] * 1e3:.1f}",
           f"{secs['est (measured)']:.1f}", f"{at_least}{secs['ios'] / secs['est']:.0f}x"]
    print(f"  {device} " + " | ".join(map(str, row)), flush=True)
    return row, record


def measured_section(models: list[str], device: str, budget: float, rounds: int) -> tuple[list[str], list[Any], str]:
    """The measured table for ``device``: markdown lines, the records, and a summary line."""
    cache_dir = tempfile.mkdtemp(prefix="opsched-bench-")
    rows, records = [], []
    for name in models:
        row, record = measured(name, device, budget, rounds, cache_dir)
        rows.append(row)
        records.append(record)
    lat = geomean([r["median_ms"]["est"] / r["median_ms"]["ios"] for r in records])
    lat_m = geomean([r["median_ms"]["est (measured)"] / r["median_ms"]["ios"] for r in records])
    speed = geomean([r["schedule_s"]["ios"] / r["schedule_s"]["est"] for r in records])
    cut_short = [r["model"] for r in records if r["ios_stats"].get("budget_exhausted")]
    at_least = "at least " if cut_short else ""
    if device == "cuda":
        import torch

        where, how = f"this GPU ({torch.cuda.get_device_name()})", "each plan captured into one CUDA graph"
        label = "GPU"
    else:
        where, how = f"this CPU ({os.cpu_count()} cores)", "on the ONNX Runtime backend"
        label = "CPU"
    summary = (f"{label} measured: est / ios latency {lat:.3f}, est (measured) / ios {lat_m:.3f} (geomean); "
               f"est schedules {at_least}{speed:.0f}x faster than the measured DP")
    names = list(records[0]["median_ms"])
    lines = [f"## Measured on {where}; ms, median of {rounds} interleaved rounds, {how}", "",
             "Schedule time: the DP's includes measuring its stages (fresh profile store, budget "
             f"{budget:.0f} s); est's is the analytic model only; est (measured) runs after the "
             "DP on the same store, so its time counts only the operators and merges the DP had not measured. "
             "Where the DP ran out of its budget (marked >=), its time is the budget, less than the search "
             "needs, and its schedule finishes the unsolved parts with greedy or sequential stages.", "",
             format_table(["model", *names, "est / ios", "est (measured) / ios", "ios schedule s",
                           "est schedule ms", "est (measured) schedule s", "ios / est time"], rows,
                          markdown=True), "",
             f"Geometric means: est / ios latency {lat:.3f}; est (measured) / ios {lat_m:.3f}; "
             f"schedule-time ratio {at_least}{speed:.0f}x"
             + (f" (the DP ran out of its budget on {', '.join(cut_short)})." if cut_short else "."), ""]
    return lines, records, summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=list_models())
    p.add_argument("--devices", nargs="*", default=["V100", "H100"])
    p.add_argument("--cpu", action="store_true", help="also measure every schedule on this CPU")
    p.add_argument("--gpu", action="store_true", help="also measure every schedule on this machine's GPU")
    p.add_argument("--budget", type=float, default=60.0, help="seconds of measured DP search per model")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--name", default="schedulers")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default docs/results)")
    args = p.parse_args()
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--gpu needs a GPU (torch.cuda.is_available() is False)")
    graphs = {n: opsched.from_torch(get_model(n), example_inputs(n)) for n in args.models}
    out = ["# Schedulers: the IOS dynamic program, list scheduling (est) and the peers' lanes", "",
           "Batch 1. *ios*: the dynamic program (P(r=3, s=8), parallel and merge stages); *est*: "
           "early-start-time-first list scheduling on at most 8 lanes, with merges, no barriers; "
           "*nimble*: a minimum chain cover onto lanes; *opara*: a lane inherited from a producer. "
           "Schedule times are the wall time of a `schedule()` call on a fresh cost model, pricing included: "
           "the median of up to five calls within a second (a measured search: one call).", ""]
    data: dict[str, Any] = {"simulated": [], "cpu": [], "cuda": []}
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
    for flag, device in ((args.cpu, "cpu"), (args.gpu, "cuda")):
        if flag:
            lines, records, line = measured_section(args.models, device, args.budget, args.rounds)
            out += lines
            data[device] = records
            summary.append(line)
    out += ["## Summary", "", *(f"- {s}" for s in summary)]
    data["summary"] = summary
    md, js = write(args.name, "\n".join(out), data, args.out)
    print("\n".join(summary))
    print(f"wrote {md} and {js}")


if __name__ == "__main__":
    main()

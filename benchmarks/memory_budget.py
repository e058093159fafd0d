"""Latency against peak memory: the IOS search within a budget of live activations, on every zoo
model under an analytic device preset (-> docs/results/memory-budget.md, figure memory-budget.png).

Concurrency keeps more values alive at once. For each model: the sequential schedule (the
frugal end), the unconstrained IOS schedule (the fast end), and IOS searched within budgets
spread between their peaks (``--points``, as fractions of the way from the sequential peak to
IOS's). Per schedule, the analytic model's latency estimate and the peak of its plan
(:meth:`opsched.runtime.Plan.peak_bytes`: what ``optimize(memory_budget=...)`` checks). Nothing
is measured: the figures are the cost model's, on the preset's terms.

    python benchmarks/memory_budget.py                          # H100 preset, every zoo model
    python benchmarks/memory_budget.py --device V100 --models nasnet_mobile randwire_small
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import geomean, write_table  # noqa: E402

from opsched import from_torch  # noqa: E402
from opsched.cost import AnalyticCostModel  # noqa: E402
from opsched.ir import Graph  # noqa: E402
from opsched.models import example_inputs, get_model, list_models  # noqa: E402
from opsched.runtime import lower  # noqa: E402
from opsched.schedule import Schedule  # noqa: E402
from opsched.schedulers import schedule  # noqa: E402

MIB = 2**20


def peak(graph: Graph, sched: Schedule) -> int:
    plan = lower(graph, sched)
    return plan.peak_bytes([graph.types[name].nbytes for name in plan.slot_names])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=list_models())
    p.add_argument("--device", default="H100", help="analytic device preset")
    p.add_argument("--points", nargs="*", type=float, default=[0.0, 0.25, 0.5, 0.75],
                   help="budgets, as fractions of the way from the sequential plan's peak to IOS's")
    p.add_argument("--budget", type=float, default=30.0, help="seconds of IOS search per schedule")
    args = p.parse_args()
    logging.getLogger("opsched").setLevel(logging.ERROR)
    cost = AnalyticCostModel(args.device)
    rows, records = [], []
    gains: list[float] = []
    free_gains: list[float] = []
    for name in args.models:
        graph = from_torch(get_model(name).eval(), example_inputs(name))
        seq = schedule(graph, "sequential", cost)
        free = schedule(graph, "ios", cost, budget_s=args.budget)
        lo, hi = peak(graph, seq), peak(graph, free)
        points = []
        for f in args.points:
            budget = int(lo + f * (hi - lo))
            within = schedule(graph, "ios", cost, budget_s=args.budget, memory_budget=budget)
            points.append({"fraction": f, "budget": budget, "peak": peak(graph, within), "ms": within.estimated_ms,
                           "parts_one_at_a_time": within.stats["parts_over_memory"]})
        record = {"model": name, "sequential": {"peak": lo, "ms": seq.estimated_ms},
                  "ios": {"peak": hi, "ms": free.estimated_ms}, "within": points}
        records.append(record)
        if hi > lo:  # where concurrency costs memory: IOS at the sequential plan's peak, and free
            gains.append(seq.estimated_ms / points[0]["ms"])
            free_gains.append(seq.estimated_ms / free.estimated_ms)
        rows.append([name, f"{lo / MIB:.2f}", f"{seq.estimated_ms:.3f}", f"{hi / MIB:.2f}", f"{free.estimated_ms:.3f}",
                     *(f"{pt['ms']:.3f} @ {pt['peak'] / MIB:.2f}" for pt in points)])
        print(rows[-1], flush=True)
    headers = ["model", "sequential MiB", "sequential ms", "IOS MiB", "IOS ms",
               *(f"within {f:g}: ms @ MiB" for f in args.points)]
    write_table("memory-budget", [
        "# Latency against peak memory: IOS within a budget", "",
        f"Analytic preset {args.device}, batch 1; latencies are the cost model's estimates, peaks the plans' live "
        "activations (`Plan.peak_bytes`). *within f*: IOS searched with `memory_budget` a fraction f of the way "
        "from the sequential plan's peak to the unconstrained IOS plan's (0: no more memory than running one "
        "operator at a time). The geometric means below are over the models whose IOS plan needs more memory than "
        "the sequential one: speedups over the sequential schedule of IOS within the sequential plan's peak and "
        "of IOS unconstrained.",
    ], headers, rows, {"IOS within the sequential peak vs sequential": geomean(gains),
                       "IOS unconstrained vs sequential": geomean(free_gains)},
        {"device": args.device, "models": records})


if __name__ == "__main__":
    main()

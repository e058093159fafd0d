"""Placement on heterogeneous units: PartitionTuner's comparison, simulated and measured.

(a) Simulated, on the ``cpu+npu`` platform (a quad Cortex-A53 beside a VTA-like NPU that runs
dense convolutions with channels in multiples of 16; a 2 ms switch cost, as in PartitionTuner's
cost model; :mod:`opsched.cost.units`): every zoo model's makespan under the unit simulator for
the CPU alone, static type-based placement, per-layer profiled placement, HEFT, PEFT and
PartitionTuner; and, on a window of each model small enough to try every placement (at most
``--window`` operators that both units run), the exhaustive optimum beside them.

(b) Measured, on a platform whose units exist here (``cpu-pools`` on a CPU machine, ``cpu+cuda``
where a GPU is present): each scheduler's plan run by the units backend, interleaved in one
process with the plan of everything on the default unit (``--rounds`` rounds; medians). The
placement is decided on each unit's operators timed on it (``--profiles measured``, into a
profile store) or on the units' analytic presets (``--profiles analytic``).

    python benchmarks/heterogeneous.py                      # (a) on the zoo, (b) on cpu-pools
    python benchmarks/heterogeneous.py --measure cpu+cuda   # (b) on a GPU machine
    python benchmarks/heterogeneous.py --no-simulated --measure cpu+cuda   # (b) alone
"""

from __future__ import annotations

import argparse
import functools
import logging
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import geomean, iqr, write_table  # noqa: E402

import opsched  # noqa: E402
from opsched.cost import ProfileStore  # noqa: E402
from opsched.cost.unit_costs import PlatformCost, UnitCosts  # noqa: E402
from opsched.cost.units import platform  # noqa: E402
from opsched.costing import measured_cost, measured_platform  # noqa: E402
from opsched.ir import Graph, random_inputs  # noqa: E402
from opsched.models import example_inputs, get_model, list_models  # noqa: E402
from opsched.module import ScheduledModule  # noqa: E402
from opsched.schedule import Lane, Schedule  # noqa: E402
from opsched.schedulers import schedule  # noqa: E402
from opsched.schedulers.placed_sim import simulate_placed  # noqa: E402
from opsched.timing import interleave  # noqa: E402

PLACERS = ("type-based", "profiled", "heft", "peft", "partitiontuner")


def on_default(graph: Graph, pc: PlatformCost, name: str | None = None) -> Schedule:
    """Everything on one unit (the default one unless named), in topological order: a
    single-unit baseline."""
    unit = pc.platform.unit(name or pc.platform.default)
    return Schedule(graph.structural_hash(), (Lane(tuple(n.name for n in graph.nodes), unit.name, unit.backend),),
                    graph_name=graph.name, device=pc.platform.name, scheduler="default-unit",
                    options={"platform": pc.platform.name})


def placement(plan: Schedule) -> dict[str, int]:
    """Operators per unit in ``plan``."""
    counts: dict[str, int] = {}
    for lane in plan.lanes:
        counts[lane.device] = counts.get(lane.device, 0) + len(lane.nodes)
    return counts


def moved(units: dict[str, int], alone: dict[str, int]) -> str:
    """How a placement differs from a single-unit one: the operators it puts elsewhere, by unit
    (" =" where it is the same placement)."""
    (home,) = alone
    away = {u: n for u, n in units.items() if u != home and n}
    return " =" if not away else " [" + ", ".join(f"{n} on {u}" for u, n in sorted(away.items())) + "]"


def window(graph: Graph, costs: UnitCosts, movable: int) -> Graph:
    """The longest run of consecutive operators (topological order) from the first that both
    units run, holding at most ``movable`` such operators."""
    names = [n.name for n in graph.nodes]
    both = [sum(costs.runs(v, u) for u in costs.platform.names) > 1 and costs.exec_ms(v, costs.platform.default) > 0
            for v in names]
    start = both.index(True) if True in both else 0
    end, seen = start, 0
    while end < len(names) and seen + both[end] <= movable:
        seen += both[end]
        end += 1
    return graph.subgraph(names[start:end], name=f"{graph.name}[{start}:{end}]")


def simulated(models: list[str], movable: int) -> tuple[list[list[object]], dict[str, float], list[dict[str, object]]]:
    pc = PlatformCost(platform("cpu+npu"))
    rows, data = [], []
    ratios: dict[str, list[float]] = {"PT/static": [], "PT/profiled": [], "PT/heft": [], "PT/peft": [],
                                      "PT/optimum (window)": []}
    for name in models:
        graph = opsched.from_torch(get_model(name).eval(), example_inputs(name))
        costs = UnitCosts(graph, pc)
        ms = {s: schedule(graph, s, pc).estimated_ms for s in PLACERS}
        ms["cpu"] = simulate_placed(on_default(graph, pc), costs).makespan_ms
        ms["paper"] = schedule(graph, "partitiontuner", pc, refine=0).estimated_ms
        sub = window(graph, costs, movable)
        w = {s: schedule(sub, s, pc).estimated_ms for s in ("exhaustive", "partitiontuner", "type-based", "profiled")}
        pt = ms["partitiontuner"]
        gains = {"PT/static": ms["type-based"] / pt, "PT/profiled": ms["profiled"] / pt, "PT/heft": ms["heft"] / pt,
                 "PT/peft": ms["peft"] / pt, "PT/optimum (window)": w["exhaustive"] / w["partitiontuner"]}
        for k, v in gains.items():
            ratios[k].append(v)
        rows.append([name, f"{ms['cpu']:.1f}", *(f"{ms[s]:.1f}" for s in PLACERS), f"{ms['paper']:.1f}",
                     f"{100 * (gains['PT/static'] - 1):+.1f}%", f"{100 * (gains['PT/profiled'] - 1):+.1f}%",
                     f"{len(sub.nodes)}", f"{w['exhaustive']:.2f}", f"{w['partitiontuner']:.2f}",
                     f"{100 * (w['partitiontuner'] / w['exhaustive'] - 1):+.1f}%"])
        data.append({"model": name, "ms": ms, "window": {"nodes": len(sub.nodes), "ms": w}})
        print(rows[-1], flush=True)
    return rows, {k: geomean(v) for k, v in ratios.items()}, data


def measured(models: list[str], where: str, rounds: int, profiles: str,
             cache_dir: str) -> tuple[list[list[object]], dict[str, float], list[dict]]:
    store = ProfileStore(cache_dir)
    pc = (measured_platform(measured_cost(store=store), where) if profiles == "measured"
          else PlatformCost(platform(where)))
    rows, data, ratios = [], [], {s: [] for s in PLACERS}
    for name in models:
        graph = opsched.from_torch(get_model(name).eval(), example_inputs(name))
        costs = UnitCosts(graph, pc)
        alone = {f"{u}-only": on_default(graph, pc, u) for u in pc.platform.names
                 if u != pc.platform.default and all(costs.runs(n.name, u) for n in graph.nodes)}
        plans = {"default": on_default(graph, pc), **alone, **{s: schedule(graph, s, pc) for s in PLACERS}}
        modules = {k: ScheduledModule(graph, s) for k, s in plans.items()}
        x = random_inputs(graph)
        with torch.no_grad():
            walls = interleave({k: functools.partial(m, *x) for k, m in modules.items()}, rounds, 2)
        med = {k: statistics.median(v) for k, v in walls.items()}
        spread = {k: iqr(v) for k, v in walls.items()}
        for s in PLACERS:
            ratios[s].append(med["default"] / med[s])
        best_alone = min(("default", *alone), key=med.__getitem__)
        units = {k: placement(s) for k, s in plans.items()}
        rows.append([name, f"{med['default']:.2f}", f"{med[best_alone]:.2f}",
                     *(f"{med[s]:.2f} ±{spread[s]:.2f} ({med['default'] / med[s]:.2f}x, "
                       f"{med[best_alone] / med[s]:.2f}x)" + moved(units[s], units[best_alone]) for s in PLACERS)])
        data.append({"model": name, "median_ms": med, "iqr_ms": spread, "units": units,
                     "estimated_ms": {k: s.estimated_ms for k, s in plans.items()}})
        print(rows[-1], flush=True)
    store.close()
    return rows, {s: geomean(v) for s, v in ratios.items()}, data


def simulated_table(models: list[str], window: int) -> None:
    """Part (a): the simulated CPU + NPU comparison, written to ``heterogeneous``."""
    rows, geo, data = simulated(models, window)
    write_table("heterogeneous", [
        "# Placement on heterogeneous units (simulated CPU + NPU)", "",
        "Platform `cpu+npu` (`opsched.cost.units`): a quad Cortex-A53 (38 GFLOP/s peak, a quarter of it on "
        "convolutions) beside a VTA-like NPU (102 GOP/s, 0.15 ms per call) that runs dense convolutions whose "
        "channels are multiples of 16; one 2 GB/s DRAM and PartitionTuner's 2 ms switch cost per copy. Makespans "
        "in ms under the unit simulator (`opsched.schedulers.placed_sim`), batch 1. *cpu*: everything on the CPU. "
        "*PT vs*: how much faster PartitionTuner's placement is (paper: +5.03% over static on SqueezeNet; over "
        "profiling-based +7.18% ResNet-50, +5.36% ResNet-18, +2.73% SqueezeNet). *window*: the longest run of "
        f"operators with at most {window} that both units run, where the exhaustive optimum (every placement, "
        "topological order per unit) is computable. *PT, paper only*: PartitionTuner without opsched's makespan "
        "refinement (`refine=0`: the paper's DP and parallel deployment alone).",
    ], ["model", "cpu", *PLACERS, "PT, paper only", "PT vs static", "PT vs profiled", "window ops", "optimum", "PT",
        "PT vs optimum"],
        rows, geo, {"models": data})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=list_models())
    p.add_argument("--simulated", action=argparse.BooleanOptionalAction, default=True,
                   help="part (a), the simulated comparison (--no-simulated: part (b) alone)")
    p.add_argument("--window", type=int, default=12, help="operators both units run, per exhaustive window")
    p.add_argument("--measure", default="cpu+cuda" if torch.cuda.is_available() else "cpu-pools",
                   help="the platform of part (b), or 'none'")
    p.add_argument("--measure-models", nargs="*", default=["squeezenet1_1", "googlenet", "resnet18", "randwire_small"])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--profiles", choices=["measured", "analytic"], default="measured",
                   help="what part (b)'s placements are decided on: each unit's operators timed on it, or its preset")
    p.add_argument("--cache-dir", help="profile store of part (b)'s measurements (default: a fresh temporary one)")
    args = p.parse_args()
    logging.getLogger("opsched").setLevel(logging.ERROR)
    if args.simulated:
        simulated_table(args.models, args.window)
    if args.measure != "none":
        rows, geo, data = measured(args.measure_models, args.measure, args.rounds, args.profiles,
                                   args.cache_dir or tempfile.mkdtemp(prefix="opsched-units-"))
        write_table(f"heterogeneous-{args.measure.replace('+', '-')}", [
            f"# Placement on heterogeneous units (measured, `{args.measure}`)", "",
            "Each scheduler's plan run by the units backend, interleaved in one process with the plan of "
            "everything on the default unit and of everything on each other unit that runs every operator (on "
            f"`cpu+cuda`, the GPU alone); medians in ms of {args.rounds} rounds (± interquartile range), the speedups "
            "over the default unit and over the best single unit, and where the placement differs from the best "
            "single unit's: `=` the same placement (what remains is the timing's spread and the lanes' order), "
            "`[n on unit]` the operators it puts elsewhere. Placements are decided on "
            + ("each unit's operators and fused chains timed on it (a unit that exists only in the simulator: its "
               "preset)." if args.profiles == "measured" else "the units' analytic presets."),
        ], ["model", "default unit", "best single unit", *PLACERS], rows, geo,
            {"platform": args.measure, "models": data})


if __name__ == "__main__":
    main()

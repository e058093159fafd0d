"""How few stages could any search price and still prove the IOS optimum? A floor for the DP.

The DP prices a multi-group ending E of a state S unless a bound rules it out. For a monotone
cost model the only knowledge that rules E out without its own price is the price of a proper
sub-stage T (``L(E) >= L(T)``), and the strongest such T drop one group. Give a search the best
threshold it could ever hold, each state's optimal cost: an ending that no one-group-smaller
sub-stage rules out (``cost(S - E) + cut + L(T) < cost(S)`` for every such T) must still be
priced itself, and so must the stage each state's optimum ends with. Counted structurally (as
the profile store would measure them), these *forced* stages are a floor under the DP's
*distinct stages* for every search that proves its optimum from monotone bounds and solves the
states the DP solves. (A search that proved whole states irrelevant could go below it; the
top-down variant we tried skipped almost none.)

The floor is computed with an oracle: each part is solved first, then every ending of every
state is examined again against the state's optimal cost. A few minutes on RandWire.

    python benchmarks/stage_floor.py                     # RandWire and NASNet, V100, P(3, 8)
    python benchmarks/stage_floor.py --models inception_v3 --device H100
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from itertools import combinations
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write  # noqa: E402
from schedules import IOS_SEARCH  # noqa: E402

from opsched import from_torch  # noqa: E402
from opsched._toposort import bits  # noqa: E402
from opsched.cli.table import format_table  # noqa: E402
from opsched.cost import AnalyticCostModel  # noqa: E402
from opsched.ir import Graph  # noqa: E402
from opsched.models import example_inputs, get_model  # noqa: E402
from opsched.schedule.coster import StageCoster  # noqa: E402
from opsched.schedule.ios import _TIE, SearchStats, _PartCuts, _Solver, _to_stage  # noqa: E402 (the DP's own, examined)
from opsched.schedule.partition import partition  # noqa: E402
from opsched.schedule.units import UnitGraph  # noqa: E402


def stage_floor(graph: Graph, cost: AnalyticCostModel, r: int, s: int, max_part_size: int) -> dict[str, int]:
    ug = UnitGraph.build(graph)
    coster = StageCoster(graph, cost)  # the DP's: its distinct stages are the figure compared
    probe = StageCoster(graph, cost)   # the oracle's, kept apart so as not to count its prices
    stats = SearchStats()
    counts = Counter(dict.fromkeys(("multi-group endings", "ruled out by one group", "ruled out by a sub-stage",
                                    "forced"), 0))
    floor: set[tuple[object, ...]] = set()
    for part in partition(ug, max_part_size):
        cuts = _PartCuts.build(ug, part, coster.segment_cut) if coster.segment_cut is not None else None
        solver = _Solver(ug, part, coster, ("parallel", "merge"), r, s, lambda: None, stats, cuts)
        solver.solve()
        known: dict[tuple[str, tuple[int, ...]], tuple[float, tuple[object, ...]]] = {}

        def price(strategy: str, comps: tuple[int, ...]) -> tuple[float, tuple[object, ...]]:
            key = (strategy, tuple(sorted(comps)))
            if key not in known:
                stage = _to_stage(ug, part, (strategy, tuple(tuple(bits(c)) for c in comps)))
                known[key] = (probe.latency(stage), probe.stage_key(stage))
            return known[key]

        for state, (best, choice, _) in solver.memo.items():
            if not state:
                continue
            assert choice is not None
            strategy, groups = choice
            floor.add(price(strategy, tuple(sum(1 << i for i in g) for g in groups))[1])
            for strategy, mask, comps in solver.endings(state):
                if strategy != "parallel" or len(comps) < 2:
                    continue
                counts["multi-group endings"] += 1
                done = solver.memo[state & ~mask][0] + solver.cut(state & ~mask, state)
                if done + max(price("parallel", (c,))[0] for c in comps) >= best - _TIE:
                    counts["ruled out by one group"] += 1
                elif any(done + price("parallel", sub)[0] >= best - _TIE
                         for sub in combinations(comps, len(comps) - 1) if len(sub) > 1):
                    counts["ruled out by a sub-stage"] += 1
                else:
                    counts["forced"] += 1
                    floor.add(price("parallel", comps)[1])
    return {"states": stats.states, **counts, "floor": len(floor), "dp distinct": coster.stats.distinct}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["randwire_large", "nasnet_large"])
    p.add_argument("--device", default="V100")
    p.add_argument("--max-group-size", type=int, default=3)
    p.add_argument("--max-groups", type=int, default=8)
    p.add_argument("--max-part-size", type=int, default=50)
    p.add_argument("--name", default="stage-floor", help="results file name under docs/results/")
    args = p.parse_args()
    cost = AnalyticCostModel(args.device)
    rows, records = [], []
    for name in args.models:
        graph = from_torch(get_model(name), example_inputs(name), name=name)
        start = time.perf_counter()
        f = stage_floor(graph, cost, args.max_group_size, args.max_groups, args.max_part_size)
        secs = time.perf_counter() - start
        ios = IOS_SEARCH.get(name, (None, None, None))[2]
        rows.append([name, f["states"], f["multi-group endings"], f["ruled out by one group"],
                     f["ruled out by a sub-stage"], f["forced"], f["floor"], f["dp distinct"],
                     f"{f['dp distinct'] / f['floor']:.2f}", ios or "-", f"{ios / f['floor']:.1f}x" if ios else "-"])
        records.append({"model": name, **f, "ios_stages": ios, "seconds": secs})
        print(f"{name}: floor {f['floor']} distinct stages, the DP prices {f['dp distinct']} ({secs:.0f} s)",
              flush=True)
    headers = ["model", "states", "multi-group endings", "ruled out by one group", "ruled out by a sub-stage",
               "forced (not distinct)", "floor (distinct)", "DP distinct", "DP / floor", "IOS stages", "IOS / floor"]
    md = "\n".join([
        f"# How few stages a provably optimal search must price (analytic {cost.device}, "
        f"P(r={args.max_group_size}, s={args.max_groups}), max_part_size={args.max_part_size})", "",
        "Every multi-group ending of every state the DP solves, examined against the state's optimal "
        "cost: *ruled out by one group* when the price of its costliest group already reaches it; "
        "*by a sub-stage* when the price of the ending without one of its groups does; otherwise "
        "*forced*: no monotone bound can rule it out without its own price. The *floor* counts, "
        "structurally distinct, the forced endings and every state's optimal last stage: what any "
        "search proving its optimum from monotone bounds must price. *IOS stages* is the original "
        "optimizer's count at the same r, s and part size.", "",
        format_table(headers, rows, markdown=True), ""])
    md_path, js_path = write(args.name, md, {"device": cost.device, "models": records})
    print()
    print(format_table(headers, rows))
    print(f"\nwrote {md_path} and {js_path}")


if __name__ == "__main__":
    main()

"""How few stages could any search price and still prove the IOS optimum? A floor for the DP.

The DP prices a multi-group ending E of a state S unless a bound rules it out. For a monotone
cost model the only knowledge that rules E out without its own price is the price of a proper
sub-stage T (``L(E) >= L(T)``), and the strongest such T drop one group. Give a search the best
threshold it could ever hold, each state's optimal cost: an ending that no one-group-smaller
sub-stage rules out (``cost(S - E) + cut + L(T) < cost(S)`` for every such T) must still be
priced itself, and so must the stage each state's optimum ends with. Counted structurally (as
the profile store would measure them), these *forced* stages are a floor under the DP's
*distinct stages* for every search that proves its optimum from monotone bounds and solves the
states the DP solves.

The DP's bounds drop whole groups. Physically a stage is also never faster than the stage
with one unit fewer at an end of one of its groups (the group stays one chain; splitting it
in two would add a lane and a barrier, so that is not a sub-stage). The second floor lets a
search rule endings out with those *sub-chains* too: what the strongest monotone argument
could still not spare.

A search could also skip whole states, branch and bound over the states: holding the optimum
as its incumbent and a lower bound B(S) on the cost of what comes after state S, it needs no
ending of S whose ``cost(S - E) + cut + bound(E)`` reaches ``optimum - B(S)``, and no state
that only such endings lead to. How much that spares depends on how tight B is; the third
floor gives the search B = f x the exact cost after S (an oracle again), for fractions f
(``--suffix-bounds``), and counts what it must still price: every kind of ending that no
group, sub-stage or sub-chain bound rules out against ``min(cost(S), optimum - B(S))``, in
the states it reaches. The bound a search can compute without pricing (the critical path of
isolated units, or the work) is about half the optimum on these graphs (``Both / bound`` in
docs/results/schedules.md), where this floor is the sub-chain floor's.

The floors are computed with an oracle: each part is solved first, then every ending of every
state is examined again against the state's optimal cost (and priced, for the exact cost after
each state). Several minutes on RandWire.

Beside it, what the original optimizer's rule would price on the same graph: it measured every
ending it generated, cached per part by node set. The IOS paper's counts come from its own
graphs, and ours differ (RandWire's wiring is drawn from another seed), so this is the
like-for-like reference for the DP's count.

    python benchmarks/stage_floor.py                     # RandWire and NASNet, V100, P(3, 8)
    python benchmarks/stage_floor.py --models inception_v3 --device H100
    python benchmarks/stage_floor.py --models randwire_large --randwire-graphs ws-16-4-0.75-2.txt \
        ws-32-4-0.75-3.txt ws-32-4-0.75-4.txt ws-32-4-0.75-5.txt --name stage-floor-ios-randwire

(the last on IOS's own stored RandWire graphs, from its repository: see benchmarks/schedules.py)
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write  # noqa: E402
from schedules import IOS_SEARCH, stored_graphs, zoo_model  # noqa: E402

from opsched import from_torch  # noqa: E402
from opsched._toposort import ancestor_masks, bits  # noqa: E402
from opsched.cli.table import format_table  # noqa: E402
from opsched.cost import (
    AnalyticCostModel,  # noqa: E402
    StageCoster,  # noqa: E402
)
from opsched.ir import Graph  # noqa: E402
from opsched.models import example_inputs  # noqa: E402
from opsched.models.randwire import RandWire  # noqa: E402
from opsched.schedulers.ios_part import TIE, PartCuts, PartSolver, SearchStats, to_stage  # noqa: E402 (the DP's own, examined)
from opsched.schedulers.partition import down_sets, partition  # noqa: E402
from opsched.schedulers.units import UnitGraph  # noqa: E402

#: The IOS paper's DP states on its RandWire's four random stage graphs (WS(16, 4, 0.75), then
#: three WS(32, 4, 0.75)): each block's states are all the down-sets of its DAG.
IOS_RANDWIRE_STATES = (235, 4_276, 5_420, 4_799)


def components(mask: int, adj: Sequence[int]) -> tuple[int, ...]:
    """The weakly connected components of the units in ``mask`` (``adj``: neighbour masks)."""
    out = []
    while mask:
        comp = frontier = mask & -mask
        while frontier:
            reach = 0
            for i in bits(frontier):
                reach |= adj[i]
            frontier = reach & mask & ~comp
            comp |= frontier
        out.append(comp)
        mask &= ~comp
    return tuple(out)


def sub_chains(comps: Sequence[int], adj: Sequence[int]) -> list[int]:
    """The stages with one unit fewer at an end of one of the groups ``comps``, each group kept
    one chain (a one-unit group just goes)."""
    mask = sum(comps)
    return [mask & ~(1 << u) for g in comps for u in bits(g)
            if g.bit_count() == 1 or len(components(g & ~(1 << u), adj)) == 1]


Endings = dict[int, list[tuple[str, int, tuple[int, ...]]]]  # per state of a part, its endings


def costs_after(solver: PartSolver, endings: Endings, price: Callable[[str, int], tuple[float, object]]
                ) -> dict[int, float]:
    """The exact cost of scheduling the part's units outside each state, once the state has run:
    the DP run backwards from the full part, every ending priced."""
    full = (1 << solver.n) - 1
    after = {full: 0.0}
    for state in sorted(solver.memo, key=int.bit_count, reverse=True):
        if not state or state not in after:
            continue
        for strategy, mask, comps in endings[state]:
            rest = state & ~mask
            cut = solver.cut(state)(rest) if strategy == "parallel" and len(comps) > 1 else 0.0
            total = after[state] + cut + price(strategy, mask)[0]
            if total < after.get(rest, float("inf")):
                after[rest] = total
    return after


def state_pruned_floor(solver: PartSolver, endings: Endings, price: Callable[[str, int], tuple[float, object]],
                       adj: Sequence[int],
                       after: dict[int, float], fraction: float) -> tuple[set[object], int]:
    """The stages (structural keys) a branch and bound over states must price when the bound on
    what comes after a state is ``fraction`` of its exact cost, and the states it reaches."""
    full = (1 << solver.n) - 1
    optimum = solver.memo[full][0]
    assert abs(after[0] - optimum) <= 1e-6 * max(1.0, optimum), "backwards and forwards, one optimum"
    forced: set[object] = set()
    reached = {full}
    for state in sorted(solver.memo, key=int.bit_count, reverse=True):
        if not state or state not in reached:
            continue
        best, choice, _ = solver.memo[state]
        threshold = min(best, optimum - fraction * after[state])
        if best <= threshold + TIE:  # an optimum may pass here: its last stage is priced
            assert choice is not None
            forced.add(price(choice[0], sum(1 << i for g in choice[1] for i in g))[1])
        for strategy, mask, comps in endings[state]:
            rest = state & ~mask
            several = strategy == "parallel" and len(comps) > 1
            done = solver.memo[rest][0] + (solver.cut(state)(rest) if several else 0.0)
            bounds = [0.0]
            if strategy == "parallel":
                subs = [*comps, *(mask & ~c for c in comps)] if several else []
                bounds += [price("parallel", sub)[0] for sub in subs + sub_chains(comps, adj) if sub]
            if done + max(bounds) >= threshold - TIE:
                continue
            forced.add(price(strategy, mask)[1])
            if rest:
                reached.add(rest)
    return forced, len(reached)


class PartPrices:
    """A part's stages by their units, priced once each: a parallel stage's groups are the
    components of its units, a merge's its units; (price, structural key)."""

    def __init__(self, ug: UnitGraph, part: list[int], adj: list[int], probe: StageCoster) -> None:
        self.ug, self.part, self.adj, self.probe = ug, part, adj, probe
        self.known: dict[tuple[str, int], tuple[float, tuple[object, ...]]] = {}

    def __call__(self, strategy: str, mask: int) -> tuple[float, tuple[object, ...]]:
        if (strategy, mask) not in self.known:
            groups = components(mask, self.adj) if strategy == "parallel" else tuple(1 << i for i in bits(mask))
            stage = to_stage(self.ug, self.part, (strategy, tuple(tuple(bits(c)) for c in groups)))
            self.known[strategy, mask] = (self.probe.latency(stage), self.probe.stage_key(stage))
        return self.known[strategy, mask]


def stage_floor(graph: Graph, cost: AnalyticCostModel, r: int, s: int, max_part_size: int,
                suffix_bounds: Sequence[float] = ()) -> dict[str, int]:
    ug = UnitGraph.build(graph)
    coster = StageCoster(graph, cost)  # the DP's: its distinct stages are the figure compared
    probe = StageCoster(graph, cost)   # the oracle's, kept apart so as not to count its prices
    stats = SearchStats()
    counts = Counter(dict.fromkeys(("multi-group endings", "ruled out by one group", "ruled out by a sub-stage",
                                    "forced", "ruled out by a sub-chain"), 0))
    floor: set[tuple[object, ...]] = set()
    floor_chains: set[tuple[object, ...]] = set()
    by_node_set: set[tuple[int, str, int]] = set()  # what the original optimizer would price here
    pruned: dict[float, set[object]] = {f: set() for f in suffix_bounds}
    reached: dict[float, int] = dict.fromkeys(suffix_bounds, 0)
    for index, part in enumerate(partition(ug, max_part_size)):
        cuts = PartCuts.build(ug, part, coster.segment_cut) if coster.segment_cut is not None else None
        solver = PartSolver(ug, part, coster, ("parallel", "merge"), r, s, lambda: None, stats, cuts)
        solver.solve()
        adj = list(solver.succ)
        for i, succ in enumerate(solver.succ):
            for j in bits(succ):
                adj[j] |= 1 << i
        price = PartPrices(ug, part, adj, probe)

        # enumerated once: the floors below and the passes for the cost after each state all walk them
        endings = {state: solver.endings(state) for state in solver.memo if state}
        for state, (best, choice, _) in solver.memo.items():
            if not state:
                continue
            assert choice is not None
            strategy, groups = choice
            last = price(strategy, sum(1 << i for g in groups for i in g))[1]
            floor.add(last)
            floor_chains.add(last)
            for strategy, mask, comps in endings[state]:
                by_node_set.add((index, strategy, mask))
                if strategy != "parallel" or len(comps) < 2:
                    continue
                counts["multi-group endings"] += 1
                done = solver.memo[state & ~mask][0] + solver.cut(state)(state & ~mask)
                if done + max(price("parallel", c)[0] for c in comps) >= best - TIE:
                    counts["ruled out by one group"] += 1
                elif any(done + price("parallel", mask & ~c)[0] >= best - TIE for c in comps):
                    counts["ruled out by a sub-stage"] += 1
                else:
                    counts["forced"] += 1
                    floor.add(price("parallel", mask)[1])
                    if any(done + price("parallel", sub)[0] >= best - TIE for sub in sub_chains(comps, adj)):
                        counts["ruled out by a sub-chain"] += 1
                    else:
                        floor_chains.add(price("parallel", mask)[1])
        if suffix_bounds:
            after = costs_after(solver, endings, price)
            for f in suffix_bounds:
                keys, states = state_pruned_floor(solver, endings, price, adj, after, f)
                pruned[f] |= keys
                reached[f] += states
    return {"states": stats.states, **counts, "floor": len(floor), "floor with sub-chains": len(floor_chains),
            "dp distinct": coster.stats.distinct, "by node set": len(by_node_set),
            **{f"floor skipping states, bound {f:g}": len(pruned[f]) for f in suffix_bounds},
            **{f"states reached, bound {f:g}": reached[f] for f in suffix_bounds}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["randwire_large", "nasnet_large"])
    p.add_argument("--device", default="V100")
    p.add_argument("--max-group-size", type=int, default=3)
    p.add_argument("--max-lanes", type=int, default=8, help="s: groups per stage")
    p.add_argument("--max-part-size", type=int, default=50)
    p.add_argument("--randwire-graphs", nargs=4, metavar="FILE",
                   help="RandWire-large on these stage graphs (edge lists, e.g. IOS's), not ours")
    p.add_argument("--suffix-bounds", nargs="*", type=float, default=[0.5, 0.9, 0.95], metavar="F",
                   help="fractions of the exact cost after a state given to the state-skipping floor")
    p.add_argument("--name", default="stage-floor", help="results file name under docs/results/")
    args = p.parse_args()
    cost = AnalyticCostModel(args.device)
    rows, records, wiring = [], [], []
    for name in args.models:
        title, model = zoo_model(name, args.randwire_graphs)
        graph = from_torch(model, example_inputs(name), name=name)
        if isinstance(model, RandWire):
            ours = [down_sets(ancestor_masks(stage.preds)) for stage in model.stages]
            wiring.append(f"The stage graphs of {title} have {' / '.join(f'{n:,}' for n in ours)} down-sets "
                          f"({sum(ours):,} in all) against {' / '.join(f'{n:,}' for n in IOS_RANDWIRE_STATES)} "
                          f"({sum(IOS_RANDWIRE_STATES):,}) in the IOS paper's RandWire (its DP states per block): "
                          f"{sum(ours) / sum(IOS_RANDWIRE_STATES):.1f}x the search space, from the wiring alone.")
        start = time.perf_counter()
        f = stage_floor(graph, cost, args.max_group_size, args.max_lanes, args.max_part_size, args.suffix_bounds)
        secs = time.perf_counter() - start
        ios_states, _, ios = IOS_SEARCH.get(name, (None, None, None))
        rows.append([title, f["states"], f["multi-group endings"], f["ruled out by one group"],
                     f["ruled out by a sub-stage"], f["forced"], f["floor"], f["ruled out by a sub-chain"],
                     f["floor with sub-chains"], f["dp distinct"], f"{f['dp distinct'] / f['floor']:.2f}",
                     ios_states or "-", ios or "-", f"{ios / f['floor']:.1f}x" if ios else "-",
                     f"{ios / f['floor with sub-chains']:.1f}x" if ios else "-", f["by node set"],
                     f"{f['by node set'] / f['dp distinct']:.1f}x"]
                    + [f"{f[f'floor skipping states, bound {b:g}']} ({f[f'states reached, bound {b:g}']} states)"
                       + (f", IOS / it {ios / f[f'floor skipping states, bound {b:g}']:.1f}x" if ios else "")
                       for b in args.suffix_bounds])
        records.append({"model": name, "title": title, **f, "ios_states": ios_states, "ios_stages": ios,
                        "seconds": secs})
        print(f"{title}: floor {f['floor']} distinct stages ({f['floor with sub-chains']} with sub-chains), "
              f"the DP prices {f['dp distinct']} ({secs:.0f} s)", flush=True)
    headers = ["model", "states", "multi-group endings", "ruled out by one group", "ruled out by a sub-stage",
               "forced (not distinct)", "floor (distinct)", "then ruled out by a sub-chain",
               "floor with sub-chains", "DP distinct", "DP / floor", "IOS states", "IOS stages", "IOS / floor",
               "IOS / floor with sub-chains", "by node set, here", "by node set / DP"] + [
               f"floor skipping states, B = {b:g} x after" for b in args.suffix_bounds]
    md = "\n".join([
        f"# How few stages a provably optimal search must price (analytic {cost.device}, "
        f"P(r={args.max_group_size}, s={args.max_lanes}), max_part_size={args.max_part_size})", "",
        "Every multi-group ending of every state the DP solves, examined against the state's optimal "
        "cost: *ruled out by one group* when the price of its costliest group already reaches it; "
        "*by a sub-stage* when the price of the ending without one of its groups does; otherwise "
        "*forced*: no bound that drops groups can rule it out without its own price. The *floor* counts, "
        "structurally distinct, the forced endings and every state's optimal last stage: what any "
        "search proving its optimum from such bounds must price (the DP's bounds are of this kind). "
        "*Then ruled out by a sub-chain*: forced endings that the stage with one unit fewer at an end "
        "of a group rules out; the *floor with sub-chains* counts the rest, the floor for a search "
        "that also used those bounds. *IOS states* and *IOS stages* are the original optimizer's "
        "counts at the same r, s and part size, on its own graphs (compare the states: RandWire's "
        "wiring and NASNet's cells differ from ours unless the stage graphs are IOS's). *By node set, "
        "here* counts what the original optimizer's rule would price on this graph: every ending of "
        "every state, cached per part by its set of nodes (no structural sharing, no bound), with the "
        "corrected ending rule. *Floor skipping states, B = f x after*: what a branch and bound over "
        "states must price (and how many states it reaches) when its lower bound on the cost after each "
        "state is that fraction of the exact one and its incumbent is the optimum; every kind of ending "
        "counts. The bounds a search can compute without pricing are about half the optimum here.", "",
        format_table(headers, rows, markdown=True), "",
        *([stored_graphs(args.randwire_graphs), ""] if args.randwire_graphs else []),
        *(line + "\n" for line in wiring)])
    md_path, js_path = write(args.name, md, {"device": cost.device, "randwire_graphs": args.randwire_graphs,
                                             "models": records})
    print()
    print(format_table(headers, rows))
    print(f"\nwrote {md_path} and {js_path}")


if __name__ == "__main__":
    main()

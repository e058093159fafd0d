"""The IOS dynamic program (Ding et al., MLSys 2021), with correct endings and shared pricing.

For a set S of units still to schedule, ``cost(S) = min over endings S' of cost(S - S') +
L(S')``, ``cost({}) = 0``, where S' is a valid last stage (:mod:`opsched.schedulers.endings`)
and ``L`` prices it with the better of two strategies: *parallel* (its weakly connected
components run at once, one lane each) and *merge* (two or more sink convolutions that read
one tensor, as one wider convolution; :mod:`opsched.ir.ops.conv`). States are down-sets of
a part; the number of states is at most (n/d + 1)^d for n units of width d, and the pruning
P(r, s) (``max_group_size``, ``max_lanes``: units per group, groups per stage) bounds the
endings per state.

What makes it cheap:

* the graph is cut into parts automatically (:mod:`opsched.schedulers.partition`) and units
  (:mod:`opsched.schedulers.units`) absorb light operators into their neighbours;
* structurally identical parts (repeated NASNet cells) are solved once and the solution is
  mapped onto the others (same structure, same prices, so the same optimum);
* every stage is priced once per *structure* (:mod:`opsched.cost.coster`);
* branch and bound, for cost models that declare themselves ``monotone``: a stage is never
  faster than any part of it, ``L(S') >= L(S'')`` for every subset S'' of its groups (true of
  the analytic model by construction, and physically of any device: adding work to a stage
  cannot speed up what was there). Endings are visited in increasing order of
  ``cost(S - S') + max_g L({g})``; once that bound reaches the best cost found, no later
  ending can win and none of them is priced. An ending that passes is priced through its
  prefixes: the sub-stage of its two most expensive groups, then three... stopping as soon as
  a prefix shows it cannot win. Prefixes are shared by many endings (and priced once per
  structure), so many-group endings are often discarded on the price of a small, common
  sub-stage. The optimum is unchanged. Merge stages are always priced (a merged convolution
  can beat its slowest member alone).

Where the cost model charges for cutting one-lane segments (:class:`opsched.cost.SegmentCut`:
ONNX Runtime's session calls and layout conversions), an ending of several groups also pays
``resume + leave(values live before it) + enter(values live after it)`` (:mod:`opsched.cost.cuts`); those
sums depend only on the states on either side, so they are kept per state, and they join the
bound above as the exact terms they are.

With ``memory_budget`` (bytes), an ending is admitted only if its stage's peak of live
activations, bounded as the plan will count it, keeps within the budget (:mod:`.ios_memory`):
the result is optimal among the schedules whose every stage fits. A part with no such schedule
runs one unit at a time.

A part's states are counted before it is solved (:func:`~opsched.schedulers.partition.state_count`,
milliseconds), and one with more than ``max_states`` (20,000) is split into as few pieces as have
at most that many each, cut where few values cross (:func:`~opsched.schedulers.partition.split_to_fit`):
the DP is exact within each piece and loses only the concurrency across the cuts. Width, not
size, makes a part hard: 32 units in a dozen short branches (torchvision's box decoding) have
66,130 states. Searched whole, on this repository's CPU, they took 5.3 s under the CPU2 preset
and 79 s under H100's; split, 0.8 s and 4.2 s, for the same estimate (the optimum of operators
this small is sequential on both presets). A Phi decoder layer's 29,181 took 4.6 s and 42 s,
split 0.4 s and 1.7 s; a Mamba mixer's 2.5 million ran out of 120 s on both, split 0.6 s and
2.1 s (``docs/results/wide-parts.md``). Where concurrency pays, a split gives some of it up:
RandWire-large under H100, its parts cut to 5,000 states, searched in 4 s instead of 33 s for an
estimate 1.5% over the optimum, cut to 500, 8.3% over (``docs/results/wide-parts-sweep.md``; a
first version, which cut in halves, gave up 6.7% and 13%). Every zoo model's parts fit the default
(RandWire-large's largest has 14,879 states), so their searches are exact, as before.

A search can be bounded by ``budget_s`` (seconds) or ``max_stage_costs`` (distinct stages
priced: measurements, for a measured cost model). Parts are searched smallest first (by their
states), so when the budget runs out, the parts already solved keep their optimum and only the
largest fall back to a heuristic schedule (of greedy and sequential, the one the cost model
prices lower: on a CPU of few cores the greedy wavefront is often the slower; choosing prices
those stages, so a measured search goes a little past a ``max_stage_costs`` budget: at most one
stage per unit of each unsolved part, most of them single units already measured). The call
always returns a valid schedule. In the graph's order, the part the budget ran out in took every
later part down with it. A probe on this repository's CPU with measured costs, torchvision's
RetinaNet at 320x320 (backbone, FPN and heads in one graph): in the graph's order, the budget ran
out in a part of 9,289 states and the 8 parts after it fell back too, among them parts of 4,640
and 108 states that solve in 10 s and 22 s; smallest first, 11 of its 13 parts were solved and
only the two largest, of 9,289 and 16,384 states, fell back (the counts of parts differ: the first
probe ran an earlier version of the split above).
"""

from __future__ import annotations

import logging
import time
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from opsched.cost import CostModel, StageCoster
from opsched.cost.cuts import cut_latency
from opsched.errors import ScheduleError
from opsched.ir import Graph, structural_hash
from opsched.schedule import Schedule, Stage, Strategy
from opsched.schedulers.greedy import wavefront
from opsched.schedulers.ios_memory import PartMemory
from opsched.schedulers.ios_part import (
    OverBudget,
    PartCuts,
    PartSolution,
    PartSolver,
    SearchStats,
    summarize,
    to_stage,
)
from opsched.schedulers.partition import partition, split_to_fit, state_count
from opsched.schedulers.registry import Progress, SchedulerSpec, option, positive, register, staged
from opsched.schedulers.units import UnitGraph

__all__ = ["IosOptions", "ios_stages", "SearchStats", "PartSolution"]

log = logging.getLogger(__name__)


class _BudgetExhausted(Exception):
    pass


@dataclass(frozen=True)
class IosOptions:
    """The IOS search's options (:func:`ios_stages`)."""

    max_group_size: int = option(3, "r: most units in one group of a stage")
    max_lanes: int = option(8, "s: most groups in one stage (each runs on its own lane)")
    max_part_size: int = option(50, "most units in one part of the graph (larger blocks are split)")
    max_states: int | None = option(20_000, "most DP states (down-sets) of one part; a part with more is split "
                                            "into as few pieces as fit, cut where few values cross (exact within "
                                            "each, no concurrency across the cuts); None: no bound")
    strategies: tuple[str, ...] = option(("parallel", "merge"), "stage strategies: parallel, merge or both")
    budget_s: float | None = option(60.0, "seconds of search (None: no limit); then unsolved parts use greedy or "
                                          "sequential stages, so that a wide graph's search always ends")
    max_stage_costs: int | None = option(None, "most distinct stages priced (measurements); then as budget_s")
    memory_budget: int | None = option(None, "bytes of live activations a stage may reach (None: no limit); a part "
                                             "that cannot keep within it runs one unit at a time")

    def __post_init__(self) -> None:
        for name in ("max_group_size", "max_lanes", "max_part_size"):
            positive("ios", name, getattr(self, name))
        if self.max_states is not None and self.max_states < 2:
            raise ScheduleError(f"option max_states of scheduler 'ios' must be at least 2 (a single unit's states: "
                                f"before and after it), got {self.max_states}")
        positive("ios", "budget_s", self.budget_s, allow_none=True)
        positive("ios", "max_stage_costs", self.max_stage_costs, allow_none=True)
        positive("ios", "memory_budget", self.memory_budget, allow_none=True)
        if not self.strategies or any(s not in ("parallel", "merge") for s in self.strategies):
            raise ScheduleError(f"option strategies of scheduler 'ios' must be a non-empty subset of "
                                f"('parallel', 'merge'), got {self.strategies}")


def ios_stages(graph: Graph, cost: CostModel, *, max_group_size: int = 3, max_lanes: int = 8,
               max_part_size: int = 50, strategies: Iterable[Strategy] = ("parallel", "merge"),
               max_states: int | None = None, budget_s: float | None = None, max_stage_costs: int | None = None,
               units: UnitGraph | None = None, coster: StageCoster | None = None,
               progress: Progress | None = None, memory_budget: int | None = None) -> tuple[list[Stage], SearchStats]:
    """Optimal stages under the IOS model and P(max_group_size, max_lanes), part by part; with
    ``memory_budget``, optimal among the schedules whose every stage keeps within it
    (:mod:`.ios_memory`)."""
    strategies = tuple(strategies)
    IosOptions(max_group_size, max_lanes, max_part_size, max_states, strategies, budget_s, max_stage_costs,
               memory_budget)  # checks them
    start = time.perf_counter()
    ug = units or UnitGraph.build(graph)
    coster = coster or StageCoster(graph, cost)
    stats = SearchStats()
    parts = []
    for part in partition(ug, max_part_size):
        pieces = [part] if max_states is None else split_to_fit(ug, part, max_states)
        stats.parts_split += len(pieces) > 1
        parts += pieces
    stats.parts = len(parts)
    deadline = start + budget_s if budget_s is not None else None
    base_distinct = coster.stats.distinct

    def check_budget() -> None:
        if deadline is not None and time.perf_counter() > deadline:
            raise _BudgetExhausted
        if max_stage_costs is not None and coster.stats.distinct - base_distinct >= max_stage_costs:
            raise _BudgetExhausted

    solved: dict[str, PartSolution] = {}
    by_part: list[list[Stage]] = [[] for _ in parts]
    # the smallest searches first: where the budget runs out, it leaves the largest parts to the heuristic,
    # not every part after the one it ran out in (the DP's order of parts does not change their optima)
    order = sorted(range(len(parts)), key=lambda k: state_count(ug, parts[k]))
    for done, k in enumerate(order):
        part = parts[k]
        if progress:
            progress(done, len(parts), f"states {stats.states} stages priced {coster.stats.distinct}")
        cuts = PartCuts.build(ug, part, coster.segment_cut) if coster.segment_cut is not None else None
        memory = PartMemory.build(ug, part, memory_budget) if memory_budget is not None else None
        key = _part_key(graph, ug, part, strategies, max_group_size, max_lanes, cuts, memory)
        solution = solved.get(key)
        if solution is not None:
            stats.parts_reused += 1
        elif not stats.budget_exhausted:
            try:
                solution = PartSolver(ug, part, coster, strategies, max_group_size, max_lanes, check_budget,
                                      stats, cuts, memory).solve()
                solved[key] = solution
                stats.parts_solved += 1
            except _BudgetExhausted:
                stats.budget_exhausted = True
                log.warning("search budget exhausted after %d of %d parts, the smallest; the rest use greedy or "
                            "sequential stages", done, len(parts))
            except OverBudget:
                stats.parts_over_memory += 1
                log.warning("no schedule of part %d of %d keeps its live activations within memory_budget=%d bytes; "
                            "it runs one unit at a time", k, len(parts), memory_budget)
                by_part[k] = _one_at_a_time(ug, part)
                continue
        if solution is None:
            stats.parts_fallback += 1
            by_part[k] = _fallback(ug, part, coster, max_lanes, memory)
            continue
        by_part[k] = [to_stage(ug, part, st) for st in solution.stages]
    stages = [stage for part_stages in by_part for stage in part_stages]
    if progress:
        progress(len(parts), len(parts), f"states {stats.states} stages priced {coster.stats.distinct}")
    stats.stage_requests = coster.stats.requests
    stats.distinct_stages = coster.stats.distinct
    stats.structural_hits = coster.stats.structural_hits
    stats.seconds = time.perf_counter() - start
    return stages, stats


def _ios(graph: Graph, cost: CostModel, options: IosOptions, progress: Progress | None) -> Schedule:
    coster = StageCoster(graph, cost)
    stages, stats = ios_stages(graph, cost, max_group_size=options.max_group_size, max_lanes=options.max_lanes,
                               max_part_size=options.max_part_size, max_states=options.max_states,
                               strategies=typing.cast(tuple[Strategy, ...], options.strategies),
                               budget_s=options.budget_s, max_stage_costs=options.max_stage_costs, coster=coster,
                               progress=progress, memory_budget=options.memory_budget)
    return staged(graph, cost, stages, "ios", options, stats.as_dict(), coster)


def _defaults(device_type: str, cores: int) -> dict[str, Any]:
    # more concurrent groups than cores only oversubscribe a CPU (a one-off probe on Inception:
    # 3 lanes on 2 cores ran 1.7-1.8x slower in the plan than measured alone)
    return {"max_lanes": cores} if device_type == "cpu" else {}


register(SchedulerSpec("ios", _ios, IosOptions, "the IOS dynamic program over stages (optimal under its model)",
                       _defaults, summarize))


def _one_at_a_time(ug: UnitGraph, part: list[int]) -> list[Stage]:
    """A part's units in order, one stage each: what a part runs when nothing better is found
    or fits."""
    return [Stage((ug.units[u],)) for u in part]


def _fallback(ug: UnitGraph, part: list[int], coster: StageCoster, max_lanes: int,
              memory: PartMemory | None) -> list[Stage]:
    """The cheaper of the greedy wavefront and the sequential order of a part; under a memory
    budget, the greedy wavefront only if every stage of it keeps within the budget."""
    sequential = _one_at_a_time(ug, part)
    waves = wavefront(part, ug, max_lanes)
    local = {u: i for i, u in enumerate(part)}
    if memory is not None and not memory.admits([[local[u] for u in st] for st in waves]):
        return sequential
    greedy = [Stage(tuple(ug.units[u] for u in st)) for st in waves]
    done = [v for u in range(part[0]) for v in ug.units[u]]

    def price(stages: list[Stage]) -> float:
        return sum(coster.latency(s) for s in stages) + cut_latency(ug.graph, stages, coster.segment_cut, done)
    return min((greedy, sequential), key=price)


def _part_key(graph: Graph, ug: UnitGraph, part: list[int], *options: object) -> str:
    names = [v for u in part for v in ug.units[u]]
    shape = tuple(len(ug.units[u]) for u in part)
    sub = graph.subgraph(names)  # priced as the coster prices it: a view's position is no part of it
    return f"{structural_hash(sub, sub.cost_signatures)}|{shape}|{options}"

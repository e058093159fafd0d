"""The IOS dynamic program over one part of a graph (:mod:`opsched.schedulers.ios` cuts the graph
into parts, reuses solutions of identical parts and falls back where the budget runs out).

States are down-sets of the part's units, as bitmasks; ``cost(S) = min over endings S' of
cost(S - S') + L(S') (+ the segment cuts an ending of several groups pays)``, with the branch
and bound described in :mod:`opsched.schedulers.ios`.

The states are solved bottom up, in increasing order as numbers
(:func:`~opsched.schedulers.partition.ascending_down_sets`: a proper subset is a smaller
number), so every state an ending leaves is solved before the state it starts from, and each
state's endings are made once, as its solution needs them: its groups priced alone, ordered
dearest first, and combined in that order, so that an ending's bound (its dearest group's price
on top of what comes before it) is at hand as the ending is made. (A walk down from the whole
part, which made each state's endings to find the states they leave, then again to choose
among them, spent half its time listing and sorting them.)
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import combinations
from operator import itemgetter
from typing import Any

from opsched._text import count
from opsched._toposort import bits
from opsched.cost import SegmentCut, StageCoster
from opsched.ir.ops.conv import merge_class
from opsched.schedule import Stage
from opsched.schedulers.endings import disjoint_unions, parallel_groups, predecessor_masks
from opsched.schedulers.ios_memory import PartMemory
from opsched.schedulers.partition import ascending_down_sets
from opsched.schedulers.units import UnitGraph

__all__ = ["LocalStage", "TIE", "SearchStats", "summarize", "PartSolution", "to_stage", "PartCuts", "PartSolver",
           "OverBudget"]

# An ending of several groups with its bound: (bound, cost before it and its cut, the state it
# leaves, its groups' masks).
Bounded = tuple[float, float, int, tuple[int, ...]]

# A last stage as the search finds it: (strategy, its groups' masks).
Choice = tuple[str, tuple[int, ...]]

# A stage in part-local terms: (strategy, groups as tuples of local unit indices).
LocalStage = tuple[str, tuple[tuple[int, ...], ...]]


#: Totals closer than this (ms) are ties: sums of the same prices in another order differ by
#: rounding, and an ending that cannot beat the best by more than rounding cannot improve it.
TIE = 1e-9


@dataclass
class SearchStats:
    parts: int = 0
    parts_solved: int = 0
    parts_reused: int = 0
    parts_fallback: int = 0
    states: int = 0
    transitions: int = 0
    pruned: int = 0  # states whose remaining endings the bound discarded unpriced
    stage_requests: int = 0
    distinct_stages: int = 0
    structural_hits: int = 0
    seconds: float = 0.0
    budget_exhausted: bool = False
    parts_over_memory: int = 0  # parts no schedule of which fits the memory budget: run one unit at a time
    parts_split: int = 0  # parts with more than max_states states, split until each piece fits

    def as_dict(self) -> dict[str, float | int | bool]:
        return dict(self.__dict__)

    def __str__(self) -> str:
        return summarize(self.as_dict())


def summarize(stats: Mapping[str, Any]) -> str:
    """One line about an IOS search, from a schedule's stats."""
    line = (f"search {stats.get('states', 0)} states, {stats.get('distinct_stages', 0)} distinct stages priced, "
            f"{stats.get('seconds', 0.0):.2f} s")
    if stats.get("parts_split"):
        line += f" ({count(stats['parts_split'], 'part')} over max_states split)"
    if stats.get("budget_exhausted"):
        line += f" (budget ran out: {stats.get('parts_fallback', 0)} of {stats.get('parts', 0)} parts fell back)"
    if stats.get("parts_over_memory"):
        line += (f" ({stats['parts_over_memory']} of {stats.get('parts', 0)} parts fit the memory budget in no "
                 f"schedule: one unit at a time)")
    return line


class OverBudget(Exception):
    """No schedule of the part keeps every stage within the memory budget."""


@dataclass
class PartSolution:
    cost: float
    stages: list[LocalStage] = field(default_factory=list)


def to_stage(ug: UnitGraph, part: list[int], st: LocalStage) -> Stage:
    strategy, groups = st
    return Stage(tuple(tuple(v for i in g for v in ug.units[part[i]]) for g in groups), strategy)  # type: ignore[arg-type]


@dataclass(frozen=True)
class PartCuts:
    """A :class:`SegmentCut` in one part's local terms. A value counts where it is live: a unit's
    value (its last node's) while a reader is still to run; a value from before the part (a graph
    input, an earlier part's unit) while a reader in the part is, or always, if one runs after it.

    Equal records mean equal cut costs, so a part's solution is reused only with an equal one."""

    resume_ms: float
    always: tuple[float, float]                           # (leave, enter) of values live throughout
    outside: tuple[tuple[int, float, float], ...]         # (local readers, leave, enter), earlier values
    inside: tuple[tuple[bool, float, float], ...]         # per local unit: (read after the part, leave, enter)

    @classmethod
    def build(cls, ug: UnitGraph, part: list[int], cut: SegmentCut) -> PartCuts:
        local = {u: i for i, u in enumerate(part)}
        first, last = part[0], part[-1]
        always = [0.0, 0.0]
        outside = []
        for x in ug.live_before[first]:  # earlier values a unit of the part or after it reads
            us = ug.reader_units[x]
            leave, enter = cut.leave_ms.get(x, 0.0), cut.enter_ms.get(x, 0.0)
            if us[-1] > last:
                always[0] += leave
                always[1] += enter
            else:
                outside.append((sum(1 << local[u] for u in us[bisect.bisect_left(us, first):]), leave, enter))
        inside = tuple((any(s > last for s in ug.succs[u]), cut.leave_ms.get(ug.units[u][-1], 0.0),
                        cut.enter_ms.get(ug.units[u][-1], 0.0)) for u in part)
        return cls(cut.resume_ms, (always[0], always[1]), tuple(sorted(outside)), inside)

    def live(self, state: int, succ: Sequence[int]) -> tuple[float, float]:
        """(leave, enter) summed over the values live once the local units ``state`` have run."""
        leave, enter = self.always
        for readers, out_ms, in_ms in self.outside:
            if readers & ~state:
                leave += out_ms
                enter += in_ms
        for i, (later, out_ms, in_ms) in enumerate(self.inside):
            if (state >> i) & 1 and (later or succ[i] & ~state):
                leave += out_ms
                enter += in_ms
        return leave, enter


class PartSolver:
    """The DP over one part; unit indices are local (0..n-1, topological)."""

    def __init__(self, ug: UnitGraph, part: list[int], coster: StageCoster, strategies: tuple[str, ...],
                 r: int, s: int, check_budget: Callable[[], None], stats: SearchStats,
                 cuts: PartCuts | None, memory: PartMemory | None = None) -> None:
        self.ug, self.part, self.coster = ug, part, coster
        self.cuts = cuts
        self.memory = memory
        self._bytes: dict[int, int] = {}  # live bytes per state, with a memory budget
        self._live: dict[int, tuple[float, float]] = {}
        self.r, self.s = r, s
        self.check_budget, self.stats = check_budget, stats
        n = len(part)
        self.succ = ug.local_masks(part)[0]
        self.pred = predecessor_masks(self.succ)
        graph = ug.graph
        self.merge_cls: list[object | None] = []
        for u in part:
            names = ug.units[u]
            self.merge_cls.append(merge_class(graph, graph.node(names[0])) if len(names) == 1 else None)
        self.memo: dict[int, tuple[float, LocalStage | None, int]] = {0: (0.0, None, 0)}
        # Stage prices by strategy and mask: the mask alone names the stage, as a parallel stage's
        # groups are the weakly connected components of its units (:mod:`.endings`; so are any of
        # them together) and a merge's are its units.
        self.prices: dict[str, dict[int, float]] = {"parallel": {}, "merge": {}}
        self.singles: dict[int, float] = {}  # one-group stage prices by group mask (the hot lookup)
        self.n = n
        self.parallel, self.merge = "parallel" in strategies, "merge" in strategies
        self.monotone = coster.cost.monotone

    def price(self, strategy: str, comps: tuple[int, ...], mask: int) -> float:
        """The price of the stage whose groups are ``comps`` (their union: ``mask``)."""
        known = self.prices[strategy]
        value = known.get(mask)
        if value is None:
            self.check_budget()
            groups = tuple(tuple(v for i in bits(c) for v in self.ug.units[self.part[i]]) for c in comps)
            value = known[mask] = self.coster.latency(Stage(groups, strategy))  # type: ignore[arg-type]
        return value

    def cut(self, state: int) -> Callable[[int], float]:
        """What an ending of several groups from ``state`` pays for the cut segments, by the state
        it leaves (``rest``): its part that depends on ``state`` alone found once."""
        cuts = self.cuts
        if cuts is None:
            return lambda rest: 0.0
        entering = self._entering(cuts, state)
        return lambda rest: self._live_at(cuts, rest)[0] + entering

    def _entering(self, cuts: PartCuts, state: int) -> float:
        """The part of a cut's charge that depends on the state an ending starts from."""
        return cuts.resume_ms + self._live_at(cuts, state)[1]

    def _live_at(self, cuts: PartCuts, state: int) -> tuple[float, float]:
        """(leave, enter) of the values live at ``state``, computed once per state."""
        live = self._live.get(state)
        if live is None:
            live = self._live[state] = cuts.live(state, self.succ)
        return live

    def fits(self, strategy: str, rest: int, comps: tuple[int, ...]) -> bool:
        """Whether the stage ``comps`` run from ``rest`` keeps within the memory budget."""
        memory = self.memory
        assert memory is not None
        return memory.stage_peak(rest, comps, strategy == "merge" or len(comps) > 1, self._live_bytes) <= memory.budget

    def _live_bytes(self, state: int) -> int:
        """:meth:`PartMemory.live`, once per state."""
        value = self._bytes.get(state)
        if value is None:
            assert self.memory is not None
            value = self._bytes[state] = self.memory.live(state)
        return value

    def single(self, comp: int) -> float:
        value = self.singles[comp] = self.price("parallel", (comp,), comp)
        return value

    def groups(self, state: int) -> list[int]:
        """The groups a stage from ``state`` may be made of: the successor-closed connected sets
        of at most r units (:mod:`.endings`), or with IOS-Merge alone, the sink units."""
        if self.parallel:
            return parallel_groups(state, self.succ, self.pred, self.r)
        return [1 << i for i in bits(state) if not self.succ[i] & state]

    def merges(self, state: int) -> list[tuple[int, tuple[int, ...]]]:
        """The merge stages from ``state``: two or more sink units of one merge class."""
        if not self.merge:
            return []
        classes: dict[object, list[int]] = defaultdict(list)
        for i in bits(state):
            if self.merge_cls[i] is not None and not self.succ[i] & state:
                classes[self.merge_cls[i]].append(i)
        return [(sum(1 << i for i in sub), tuple(1 << i for i in sub))
                for members in classes.values() for k in range(2, len(members) + 1)
                for sub in combinations(members, k)]

    def endings(self, state: int) -> list[tuple[str, int, tuple[int, ...]]]:
        """Every ending of ``state`` the search admits, as (strategy, mask, group masks): what
        :meth:`best_ending` chooses among, listed whole (for inspection; the search itself
        enumerates them only as far as its bound needs)."""
        groups = self.groups(state)
        out = [("parallel", m, c) for m, c in ([(g, (g,)) for g in groups]
                                               + (disjoint_unions(groups, self.s) if self.parallel else []))]
        out += [("merge", m, c) for m, c in self.merges(state)]
        if self.memory is not None:
            out = [(st, mask, comps) for st, mask, comps in out if self.fits(st, state & ~mask, comps)]
        return out

    def best_ending(self, state: int) -> tuple[float, Choice | None, int]:
        """(cost of ``state``, its best last stage as (strategy, group masks), the state before it).

        Stages of one group and merges are priced outright; those of several groups are
        combined from the groups after (:meth:`_several`)."""
        memo, singles, memory = self.memo, self.singles, self.memory
        best, nxt = float("inf"), 0
        choice: Choice | None = None
        groups = self.groups(state)
        weighed = []  # (price alone, group)
        for g in groups:
            price = singles.get(g)
            if price is None:
                price = self.single(g)
            weighed.append((price, g))
            rest = state & ~g
            if memory is not None and not self.fits("parallel", rest, (g,)):
                continue
            total = memo[rest][0] + price
            if total < best:
                best, choice, nxt = total, ("parallel", (g,)), rest
        merges = self.merges(state)
        for mask, comps in merges:
            rest = state & ~mask
            if memory is not None and not self.fits("merge", rest, comps):
                continue
            total = memo[rest][0] + self.price("merge", comps, mask)
            if total < best:
                best, choice, nxt = total, ("merge", comps), rest
        self.stats.transitions += len(groups) + len(merges)
        if not self.parallel or self.s < 2 or len(groups) < 2:
            return best, choice, nxt
        return self._several(state, weighed, (best, choice, nxt))

    def _several(self, state: int, weighed: list[tuple[float, int]], found: tuple[float, Choice | None, int]
                 ) -> tuple[float, Choice | None, int]:
        """The best of ``found`` and the endings of several groups, the groups ``weighed`` with
        their prices alone. With a monotone cost model, the branch and bound of :mod:`.ios`: the
        groups ordered dearest first, an ending's first group is its dearest, so its bound is at
        hand as it is combined; those that beat the best are visited in increasing order of it
        and priced through their prefixes, the dearest groups first. Otherwise every one is
        priced."""
        memo, memory, stats = self.memo, self.memory, self.stats
        best, choice, nxt = found
        cut_from = self.cut(state)
        if not self.monotone:
            several = disjoint_unions([g for _, g in weighed], self.s)
            stats.transitions += len(several)
            for mask, comps in several:
                rest = state & ~mask
                if memory is not None and not self.fits("parallel", rest, comps):
                    continue
                total = memo[rest][0] + cut_from(rest) + self.price("parallel", comps, mask)
                if total < best:
                    best, choice, nxt = total, ("parallel", comps), rest
            return best, choice, nxt
        weighed = sorted(weighed, key=itemgetter(0), reverse=True)  # stable: ties as enumerated
        # a group that alone reaches the best is the dearest of any ending it is in: none of them wins
        ordered = [g for price, g in weighed if price < best - TIE]
        bounded, count = self._bounded(state, ordered, best, cut_from)
        stats.transitions += count
        cut_short = len(bounded) < count or len(ordered) < len(weighed)
        priced = self.prices["parallel"]
        for bound, done, rest, comps in bounded:
            if bound >= best - TIE:
                cut_short = True
                break
            if memory is not None and not self.fits("parallel", rest, comps):
                continue
            prefix = comps[0]
            for t in range(2, len(comps) + 1):
                prefix |= comps[t - 1]
                value = priced.get(prefix)
                total = done + (value if value is not None else self.price("parallel", comps[:t], prefix))
                if total >= best - TIE:
                    break
            else:
                best, choice, nxt = total, ("parallel", comps), rest
        stats.pruned += cut_short
        return best, choice, nxt

    def _bounded(self, state: int, ordered: list[int], best: float, cut_from: Callable[[int], float]
                 ) -> tuple[list[Bounded], int]:
        """The endings of several of the groups ``ordered`` (dearest first) whose bound beats
        ``best``, in increasing order of it, as (bound, cost before it and the cut, the state it
        leaves, its groups); and how many endings there were."""
        memo, singles = self.memo, self.singles
        several = disjoint_unions(ordered, self.s)
        kept = []
        for mask, comps in several:
            rest = state & ~mask
            done = memo[rest][0] + cut_from(rest)
            bound = done + singles[comps[0]]
            if bound < best - TIE:
                kept.append((bound, done, rest, comps))
        kept.sort(key=itemgetter(0))
        return kept, len(several)

    def solve(self) -> PartSolution:
        full = (1 << self.n) - 1
        memo, stats = self.memo, self.stats
        # bottom up: every state's endings leave states solved before it
        for state in ascending_down_sets(self.pred, self.check_budget)[1:]:
            stats.states += 1
            if stats.states % 256 == 0:
                self.check_budget()
            best, choice, nxt = self.best_ending(state)
            if choice is None:  # no stage from here fits the memory budget
                memo[state] = (best, None, 0)
                continue
            memo[state] = (best, (choice[0], tuple(tuple(bits(c)) for c in choice[1])), nxt)
        if self.memo[full][1] is None:
            raise OverBudget
        stages: list[LocalStage] = []
        state = full
        while state:
            _, last, nxt = self.memo[state]
            assert last is not None
            stages.append(last)
            state = nxt
        stages.reverse()
        return PartSolution(self.memo[full][0], stages)

"""Makespan refinement of a placement: whole groups of nodes moved between units, each move kept
only where the unit simulator's makespan falls.

PartitionTuner's backend finder (:mod:`.chain_dp`) minimises each branch's summed time, its
nodes' times plus the copies it pays, one branch at a time in topological order with its
producers fixed. A sum cannot see concurrency: a move that adds a copy can still end the model
sooner when that copy overlaps other work. A SqueezeNet fire module shows it on the simulated
CPU + NPU platform. The summed cost keeps its squeeze convolution on the CPU, where its input
already is. On the NPU, the squeeze runs twice as fast. The copy of its output back to the CPU,
for the 1x1 expand, then runs while the NPU computes the 3x3 expand, so the module ends sooner
despite the extra copy.

The refinement replays the placement (:func:`.placement.placement_makespan`) instead of
summing it. Each pass visits the groups (PartitionTuner's branches) in topological order and
moves the group to the unit, among those that run every node of it, with the least makespan
if that is shorter than the current one by more than ``tolerance``; passes repeat until one moves
nothing or ``passes`` have run. The result is never longer than the placement it starts from.
One pass replays the model once per group and unit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opsched.cost.unit_costs import UnitCosts
from opsched.schedulers.placement import placement_makespan

__all__ = ["Refined", "refine_placement"]


@dataclass(frozen=True)
class Refined:
    unit_of: dict[str, str]
    makespan_ms: float
    start_ms: float   # the makespan of the placement it started from
    moves: int
    passes: int


def refine_placement(costs: UnitCosts, unit_of: Mapping[str, str], groups: Sequence[Sequence[str]],
                     order: Sequence[str], passes: int = 4, tolerance: float = 1e-9) -> Refined:
    """``unit_of`` improved by moves of whole ``groups`` (see the module docstring); ``order``:
    the order in which each unit runs its nodes (kept)."""
    current = dict(unit_of)
    units = costs.platform.names
    best = start = placement_makespan(costs, current, order)
    candidates = [[u for u in units if all(costs.runs(v, u) for v in group)] for group in groups]
    moves = done = 0
    moved = True
    while moved and done < passes:
        done, moved = done + 1, False
        for group, choices in zip(groups, candidates):
            here = {current[v] for v in group}
            tried = {}
            for u in choices:
                if here != {u}:
                    tried[u] = placement_makespan(costs, {**current, **dict.fromkeys(group, u)}, order)
            if not tried:
                continue
            target = min(tried, key=lambda u: (tried[u], units.index(u)))
            if tried[target] < best - tolerance:
                current.update(dict.fromkeys(group, target))
                best, moves, moved = tried[target], moves + 1, True
    return Refined(current, best, start, moves, done)

"""HEFT (Topcuoglu, Hariri and Wu, IEEE TPDS 2002): list scheduling on heterogeneous units.

Each task's upward rank is its mean time over the units plus the longest way from it to the end,
``rank_u(i) = w̄_i + max over successors k of (c̄_ik + rank_u(k))``, where ``c̄`` averages an
edge's copy over pairs of distinct units. Tasks are taken by decreasing rank (ties in
topological order); each goes to the unit where it finishes earliest, starting in the earliest
idle gap long enough for it (the insertion policy).
"""

from __future__ import annotations

from opsched.cost import CostModel
from opsched.ir import Graph
from opsched.schedule import Schedule
from opsched.schedulers.placement import PlacementOptions, placed_tasks, unit_costs
from opsched.schedulers.registry import Progress, SchedulerSpec, register
from opsched.schedulers.tasks import TaskGraph, TaskSchedule, Timeline, graph_tasks

__all__ = ["upward_ranks", "heft"]


def upward_ranks(tasks: TaskGraph) -> list[float]:
    rank = [0.0] * tasks.n
    for i in range(tasks.n - 1, -1, -1):
        rank[i] = tasks.mean_w(i) + max((tasks.mean_comm(d) + rank[k] for k, d in tasks.succs[i]), default=0.0)
    return rank


def heft(tasks: TaskGraph) -> TaskSchedule:
    rank = upward_ranks(tasks)
    line = Timeline(tasks)
    for i in sorted(range(tasks.n), key=lambda i: (-rank[i], i)):
        line.place_best(i)
    return line.result()


def _heft(graph: Graph, cost: CostModel, options: PlacementOptions, progress: Progress | None) -> Schedule:
    _, costs = unit_costs(graph, cost, options)
    gt = graph_tasks(graph, costs)
    result = heft(gt.tasks)
    return placed_tasks(graph, costs, gt, result, "heft", options)


register(SchedulerSpec("heft", _heft, PlacementOptions,
                       "HEFT: operators to units by upward rank and earliest finish (placement)"))

"""PEFT (Arabnejad and Barbosa, IEEE TPDS 2014): list scheduling with an optimistic cost table.

``OCT(i, p)`` is the longest of the shortest ways from task ``i``'s end to the exit when ``i``
runs on ``p``: ``OCT(i, p) = max over successors j of min over units q of (OCT(j, q) +
w(j, q) + c̄_ij if q != p)``, 0 at the exit. Ready tasks are taken by decreasing mean OCT; each
goes to the unit minimising its earliest finish (insertion policy) plus its OCT there, a
look-ahead that HEFT does not have, at the same cost.
"""

from __future__ import annotations

import statistics

from opsched.cost import CostModel
from opsched.ir import Graph
from opsched.schedule import Schedule
from opsched.schedulers.placement import PlacementOptions, placed_tasks, unit_costs
from opsched.schedulers.registry import Progress, SchedulerSpec, register
from opsched.schedulers.tasks import TaskGraph, TaskSchedule, Timeline, graph_tasks

__all__ = ["optimistic_costs", "peft"]


def optimistic_costs(tasks: TaskGraph) -> list[list[float]]:
    """The optimistic cost table, ``oct[i][p]``."""
    procs = range(tasks.processors)
    table = [[0.0] * tasks.processors for _ in range(tasks.n)]
    for i in range(tasks.n - 1, -1, -1):
        succs = [(table[j], tasks.w[j], tasks.mean_comm(d)) for j, d in tasks.succs[i]]
        for p in procs:
            table[i][p] = max((min(oct_j[q] + w_j[q] + (c if q != p else 0.0) for q in procs)
                               for oct_j, w_j, c in succs), default=0.0)
    return table


def peft(tasks: TaskGraph) -> TaskSchedule:
    table = optimistic_costs(tasks)
    rank = [statistics.fmean(row) for row in table]
    line = Timeline(tasks)
    waiting = [len(p) for p in tasks.preds]
    ready = {i for i in range(tasks.n) if waiting[i] == 0}
    while ready:
        i = min(ready, key=lambda i: (-rank[i], i))
        ready.remove(i)
        line.place_best(i, table[i])
        for k, _ in tasks.succs[i]:
            waiting[k] -= 1
            if waiting[k] == 0:
                ready.add(k)
    return line.result()


def _peft(graph: Graph, cost: CostModel, options: PlacementOptions, progress: Progress | None) -> Schedule:
    _, costs = unit_costs(graph, cost, options)
    gt = graph_tasks(graph, costs)
    return placed_tasks(graph, costs, gt, peft(gt.tasks), "peft", options)


register(SchedulerSpec("peft", _peft, PlacementOptions,
                       "PEFT: operators to units by optimistic cost table look-ahead (placement)"))

"""PEFT (Arabnejad and Barbosa, IEEE TPDS 2014): list scheduling with an optimistic cost table.

``OCT(i, p)`` is the longest of the shortest ways from task ``i``'s end to the exit when ``i``
runs on ``p``: ``OCT(i, p) = max over successors j of min over units q of (OCT(j, q) +
w(j, q) + c̄_ij if q != p)``, 0 at the exit. Ready tasks are taken by decreasing mean OCT; each
goes to the unit minimising its earliest finish (insertion policy) plus its OCT there, a
look-ahead that HEFT does not have, at the same cost.
"""

from __future__ import annotations

import math
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
        for p in procs:
            table[i][p] = max((min(table[j][q] + tasks.w[j][q] + (tasks.mean_comm(d) if q != p else 0.0)
                                   for q in procs) for j, d in tasks.succs[i]), default=0.0)
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
        best = min(range(tasks.processors), key=lambda p: (line.eft(i, p)[1] + table[i][p], p))
        if not math.isfinite(line.eft(i, best)[1]):
            raise AssertionError(f"task {tasks.name(i)} fits no processor")  # TaskGraph checks every row
        line.place(i, best)
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

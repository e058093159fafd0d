"""The sequential schedule: one unit per stage, in topological order (what frameworks do)."""

from __future__ import annotations

from opsched.cost import CostModel
from opsched.ir import Graph
from opsched.schedule import Schedule, Stage
from opsched.schedulers.registry import NoOptions, Progress, SchedulerSpec, register, staged
from opsched.schedulers.units import UnitGraph

__all__ = ["sequential_stages"]


def sequential_stages(graph: Graph, units: UnitGraph | None = None) -> list[Stage]:
    ug = units or UnitGraph.build(graph)
    return [Stage((names,)) for names in ug.units]


def _sequential(graph: Graph, cost: CostModel, options: NoOptions, progress: Progress | None) -> Schedule:
    return staged(graph, cost, sequential_stages(graph), "sequential", options)


register(SchedulerSpec("sequential", _sequential, NoOptions, "one unit per stage, in topological order"))

"""The greedy (wavefront) schedule of IOS: every ready unit at once, at most ``max_lanes``.

Kahn's algorithm: a stage is every unit whose producers have all run, one group each; past
``max_lanes`` the rest wait for the next stage, ahead of units that become ready later.
It exposes all parallelism and balances none of it (IOS: slower than sequential on SqueezeNet).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opsched.cost import CostModel
from opsched.ir import Graph
from opsched.schedule import Schedule, Stage
from opsched.schedulers.registry import Progress, SchedulerSpec, option, positive, register, staged
from opsched.schedulers.units import UnitGraph

__all__ = ["GreedyOptions", "greedy_stages", "wavefront"]


@dataclass(frozen=True)
class GreedyOptions:
    max_lanes: int = option(10, "most units in one stage (each runs on its own lane)")

    def __post_init__(self) -> None:
        positive("greedy", "max_lanes", self.max_lanes)


def wavefront(units: Sequence[int], ug: UnitGraph, max_lanes: int) -> list[list[int]]:
    """Stages (lists of unit indices) of the wavefront over ``units`` (a subset closed under the
    order: producers outside it are taken as done)."""
    inside = set(units)
    indeg = {u: sum(1 for p in ug.preds[u] if p in inside) for u in units}
    ready = [u for u in units if indeg[u] == 0]
    stages = []
    while ready:
        stage, ready = ready[:max_lanes], ready[max_lanes:]
        stages.append(stage)
        for u in stage:
            for v in ug.succs[u]:
                if v in indeg:
                    indeg[v] -= 1
                    if indeg[v] == 0:
                        ready.append(v)
    return stages


def greedy_stages(graph: Graph, max_lanes: int = 10, units: UnitGraph | None = None) -> list[Stage]:
    ug = units or UnitGraph.build(graph)
    return [Stage(tuple(ug.units[u] for u in stage)) for stage in wavefront(range(len(ug)), ug, max_lanes)]


def _greedy(graph: Graph, cost: CostModel, options: GreedyOptions, progress: Progress | None) -> Schedule:
    return staged(graph, cost, greedy_stages(graph, options.max_lanes), "greedy", options)


def _defaults(device_type: str, cores: int) -> dict[str, Any]:
    return {"max_lanes": cores} if device_type == "cpu" else {}


register(SchedulerSpec("greedy", _greedy, GreedyOptions, "IOS's wavefront: every ready unit at once", _defaults))

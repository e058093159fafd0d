"""The greedy (wavefront) schedule of IOS: every ready unit at once, at most ``max_streams``.

Kahn's algorithm: a stage is every unit whose producers have all run, one group each; past
``max_streams`` the rest wait for the next stage, ahead of units that become ready later.
It exposes all parallelism and balances none of it (IOS: slower than sequential on SqueezeNet).
"""

from __future__ import annotations

from collections.abc import Sequence

from opsched.ir import Graph
from opsched.schedule.types import Stage
from opsched.schedule.units import UnitGraph

__all__ = ["greedy_stages", "wavefront"]


def wavefront(units: Sequence[int], ug: UnitGraph, max_streams: int) -> list[list[int]]:
    """Stages (lists of unit indices) of the wavefront over ``units`` (a subset closed under the
    order: producers outside it are taken as done)."""
    if max_streams < 1:
        raise ValueError(f"max_streams must be positive, got {max_streams}")
    inside = set(units)
    indeg = {u: sum(1 for p in ug.preds[u] if p in inside) for u in units}
    ready = [u for u in units if indeg[u] == 0]
    stages = []
    while ready:
        stage, ready = ready[:max_streams], ready[max_streams:]
        stages.append(stage)
        for u in stage:
            for v in ug.succs[u]:
                if v in indeg:
                    indeg[v] -= 1
                    if indeg[v] == 0:
                        ready.append(v)
    return stages


def greedy_stages(graph: Graph, max_streams: int = 10, units: UnitGraph | None = None) -> list[Stage]:
    ug = units or UnitGraph.build(graph)
    return [Stage(tuple(ug.units[u] for u in stage)) for stage in wavefront(range(len(ug)), ug, max_streams)]

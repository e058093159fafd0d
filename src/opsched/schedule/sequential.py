"""The sequential schedule: one unit per stage, in topological order (what frameworks do)."""

from __future__ import annotations

from opsched.ir import Graph
from opsched.schedule.types import Stage
from opsched.schedule.units import UnitGraph

__all__ = ["sequential_stages"]


def sequential_stages(graph: Graph, units: UnitGraph | None = None) -> list[Stage]:
    ug = units or UnitGraph.build(graph)
    return [Stage((names,)) for names in ug.units]

"""The instance DAG of a grouping: which nodes of the split graph each sub-graph instance runs,
and which instances each reads.

A *group* is a sub-graph with its split factor. :func:`instance_dag` rewrites the graph with the
groups' splits (:func:`~opsched.transforms.split_instances.split_instances`) and cuts the result
into *units*: one per instance of each group (a group of factor 1 is one unit), and one per
*piece* the rewrite made between groups (a slice or a concat of producer instances, which the
order and binding algorithms place like any instance). A unit's ``preds`` are the units whose
values it reads, so a consumer instance depends only on the producer instances that cover its
samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opsched.ir import Graph
from opsched.transforms.split_instances import Split, split_graph

__all__ = ["Group", "Unit", "InstanceDag", "instance_dag", "PIECE"]

#: The group index of a piece: a slice or concat between groups of different factors.
PIECE = -1


@dataclass(frozen=True, slots=True)
class Group:
    """A sub-graph (node names of the model's graph, in its order), its split factor and the axis
    it splits (0: the batch, 2: the rows)."""

    nodes: tuple[str, ...]
    factor: int = 1
    axis: int = 0


@dataclass(frozen=True, slots=True)
class Unit:
    """Instance ``index`` of group ``group`` (``PIECE`` for a slice or concat between groups):
    the nodes of the split graph it runs, in order."""

    nodes: tuple[str, ...]
    group: int
    index: int = 0

    @property
    def label(self) -> str:
        return f"piece {self.nodes[0]}" if self.group == PIECE else f"g{self.group}#{self.index}"


@dataclass(frozen=True)
class InstanceDag:
    """The split graph, its units (in the graph's order) and, per unit, the units it reads."""

    graph: Graph
    groups: tuple[Group, ...]
    units: tuple[Unit, ...]
    preds: tuple[tuple[int, ...], ...]

    @property
    def splits(self) -> tuple[Split, ...]:
        return tuple(Split(g.nodes, g.factor, g.axis) for g in self.groups if g.factor > 1)

    def factor(self, unit: int) -> int:
        group = self.units[unit].group
        return 1 if group == PIECE else self.groups[group].factor


def instance_dag(graph: Graph, groups: Sequence[Group]) -> InstanceDag:
    """The units of ``groups`` (a partition of ``graph``'s nodes) over the split graph."""
    groups = tuple(groups)
    split_groups = [k for k, g in enumerate(groups) if g.factor > 1]
    split = split_graph(graph, [Split(groups[k].nodes, groups[k].factor, groups[k].axis) for k in split_groups])
    unit_of_name = {name: (split_groups[s], i) for name, (s, i) in split.owner.items()}
    unit_of_name.update((v, (k, 0)) for k, g in enumerate(groups) if g.factor == 1 for v in g.nodes)
    members: dict[tuple[int, int], list[str]] = {}
    for n in split.graph.nodes:
        key = unit_of_name.get(n.name, (PIECE, len(members)))
        members.setdefault(key, []).append(n.name)
    units = tuple(Unit(tuple(names), k, i if k != PIECE else 0) for (k, i), names in members.items())
    index_of = {v: u for u, unit in enumerate(units) for v in unit.nodes}
    preds = tuple(tuple(dict.fromkeys(index_of[x] for v in unit.nodes for x in split.graph.node(v).inputs
                                      if x in index_of and index_of[x] != u))
                  for u, unit in enumerate(units))
    return InstanceDag(split.graph, groups, units, preds)

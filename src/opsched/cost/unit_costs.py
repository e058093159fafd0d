"""Profiles per processing unit: what each operator, and each chain a unit fuses, costs on each
unit of a platform, and what moving a value between units costs.

Each unit is priced by a :class:`~opsched.cost.CostModel` of its own: the analytic model of its
preset by default, or any model given (the measured one, timing stages on the unit's backend
with the unit's cores, its figures kept in the profile store). An operator alone is a stage of
one node; a fused chain is the analytic model's fused kernel, or, for a measured model, a stage
of that one chain (a backend that fuses, as ONNX Runtime does within a segment, is timed
fused). A unit that cannot run an operator prices it at infinity.

:class:`PlatformCost` carries a platform and its per-unit models through the scheduler registry:
it is a cost model (of the default unit) that placement schedulers unwrap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from opsched.cost.analytic import AnalyticCostModel
from opsched.cost.base import CostModel, SegmentCut
from opsched.cost.units import Platform, Unit, costs_nothing, platform
from opsched.errors import CostModelError
from opsched.ir import Graph, op_schema
from opsched.schedule import Stage
from opsched.transforms.place import place

__all__ = ["UnitCosts", "PlatformCost", "platform_cost", "resolve_platform"]


@dataclass(frozen=True, eq=False)
class PlatformCost:
    """A platform with a cost model per unit (analytic where none is given). As a
    :class:`CostModel` it prices stages on the default unit."""

    platform: Platform
    models: Mapping[str, CostModel] = field(default_factory=dict)

    def __post_init__(self) -> None:
        models = {u.name: self.models.get(u.name) or AnalyticCostModel(u.spec) for u in self.platform.units}
        unknown = set(self.models) - set(models)
        if unknown:
            raise CostModelError(f"cost models for units {sorted(unknown)} that platform {self.platform.name!r} "
                                 f"does not have ({', '.join(self.platform.names)})")
        object.__setattr__(self, "models", models)

    @property
    def key(self) -> str:
        return f"platform/{self.platform.name}/" + "/".join(f"{u}={m.key}" for u, m in self.models.items())

    @property
    def device(self) -> str:
        return self.platform.name

    @property
    def monotone(self) -> bool:
        return all(m.monotone for m in self.models.values())

    def stage_latency(self, graph: Graph, stage: Stage) -> float:
        return self.models[self.platform.default].stage_latency(graph, stage)

    def segment_cut(self, graph: Graph) -> SegmentCut | None:
        return self.models[self.platform.default].segment_cut(graph)


def platform_cost(cost: CostModel, name: str | Platform | None = None) -> PlatformCost:
    """The platform ``name`` and its units' cost models: ``cost`` itself where it is a
    :class:`PlatformCost` (of that platform, if one is named); otherwise the preset ``name``
    (None: ``cpu+cuda`` where a GPU is present, else ``cpu-pools``), each unit priced by its
    analytic preset."""
    if isinstance(cost, PlatformCost):
        wanted = name.name if isinstance(name, Platform) else name
        if wanted is not None and cost.platform.name != wanted:
            raise CostModelError(f"the cost model is for platform {cost.platform.name!r}, the scheduler was asked "
                                 f"for {wanted!r}")
        return cost
    return PlatformCost(resolve_platform(name))


def resolve_platform(name: str | Platform | None) -> Platform:
    """The platform ``name`` (a preset's name, or a platform itself); None: ``cpu+cuda`` where a
    GPU is present, else ``cpu-pools``."""
    if isinstance(name, Platform):
        return name
    return platform(name if name is not None else "cpu+cuda" if torch.cuda.is_available() else "cpu-pools")


class UnitCosts:
    """The profile table of one graph on one platform (computed once, asked many times)."""

    def __init__(self, graph: Graph, cost: PlatformCost) -> None:
        self.graph, self.platform, self.models = graph, cost.platform, cost.models
        self.units: tuple[Unit, ...] = cost.platform.units
        self._placed: dict[str, Graph] = {}
        self.readers: dict[str, list[str]] = {}
        for node in graph.nodes:
            for v in dict.fromkeys(node.inputs):
                self.readers.setdefault(v, []).append(node.name)
        self._column = {u.name: k for k, u in enumerate(self.units)}
        self._exec = {n.name: tuple(self._price(n.name, u) for u in self.units) for n in graph.nodes}
        self._chains: dict[tuple[tuple[str, ...], str], float] = {}

    def _graph_on(self, unit: Unit) -> Graph:
        """The graph as ``unit``'s measured model times it: its weights on the unit's device (a
        GPU's model launches kernels there, as the units backend runs them), placed once."""
        if unit.device is None or torch.device(unit.device).type == "cpu":
            return self.graph
        if unit.name not in self._placed:
            self._placed[unit.name] = place(self.graph, unit.device)
        return self._placed[unit.name]

    def _price(self, name: str, unit: Unit) -> float:
        node = self.graph.node(name)
        if not unit.runs(self.graph, node):
            return math.inf
        if costs_nothing(node):
            return 0.0
        model = self.models[unit.name]
        if isinstance(model, AnalyticCostModel):
            return model.op_latency(self.graph, node)
        return model.stage_latency(self._graph_on(unit), Stage(((name,),)))

    def exec_ms(self, name: str, unit: str) -> float:
        """``name`` alone on ``unit`` (infinite where the unit cannot run it)."""
        return self._exec[name][self._column[unit]]

    def row(self, name: str) -> tuple[float, ...]:
        """``name`` on each unit, in the platform's order."""
        return self._exec[name]

    def runs(self, name: str, unit: str) -> bool:
        return math.isfinite(self.exec_ms(name, unit))

    def fusable(self, names: Sequence[str], unit: str) -> bool:
        """Whether ``unit`` fuses the chain ``names``: a pattern it declares, each node reading the
        one before it, each intermediate read by nothing else and not a graph output."""
        if len(names) < 2:
            return len(names) == 1
        u = self.platform.unit(unit)
        nodes = [self.graph.node(v) for v in names]
        if not u.fuse_pattern(tuple(op_schema(n.op).category for n in nodes)):
            return False
        outputs = set(self.graph.outputs)
        for a, b in zip(names, names[1:]):
            if a in outputs or self.readers.get(a) != [b] or not self.runs(b, unit):
                return False
        return self.runs(names[0], unit)

    def chain_ms(self, names: Sequence[str], unit: str) -> float:
        """The chain ``names`` run on ``unit``: fused where the unit fuses it, one after another
        otherwise; infinite where the unit cannot run one of them."""
        names = tuple(names)
        if len(names) == 1:
            return self.exec_ms(names[0], unit)
        if not self.fusable(names, unit):
            return sum(self.exec_ms(v, unit) for v in names)
        key = (names, unit)
        if key not in self._chains:
            model = self.models[unit]
            if isinstance(model, AnalyticCostModel):
                self._chains[key] = model.fused_latency(self.graph, names)
            else:
                self._chains[key] = model.stage_latency(self._graph_on(self.platform.unit(unit)), Stage((names,)))
        return self._chains[key]

    def copy_ms(self, value: str, src: str, dst: str) -> float:
        """Moving ``value`` from unit ``src`` to unit ``dst`` (0 on one unit)."""
        link = self.platform.between(src, dst)
        return 0.0 if link is None else link.copy_ms(self.graph.types[value].nbytes)

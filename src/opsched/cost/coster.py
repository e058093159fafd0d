"""Stage pricing for schedulers: one cost-model call per *structurally* distinct stage.

The equality is :func:`opsched.ir.stage_key`'s (the profile store's key); here it is kept as
tuples of interned ints, because the search asks for it millions of times. Two stages are
structurally equal when their groups, as multisets, have the same operator
signatures in the same order with the same wiring inside each group (which external tensor
a group reads is not part of the key: any operator reading a tensor of the right type costs
the same). NASNet's repeated cells, RandWire's identical separable convolutions and the same
branch at another place then share one price, and so do stages that differ only in where
a view reads its input (:func:`opsched.ir.hashing.cost_signature`: an unrolled loop's select of
patch 11 and of patch 12). Counters report how much sharing saved.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property

from opsched.cost.base import CostModel, SegmentCut
from opsched.cost.cuts import cut_latency
from opsched.ir import Graph, group_wiring
from opsched.schedule import Stage

__all__ = ["StageCoster", "CosterStats", "estimate_stages"]


@dataclass
class CosterStats:
    requests: int = 0        # stage prices asked for
    distinct: int = 0        # structurally distinct stages priced by the cost model
    structural_hits: int = 0  # requests answered by a structurally equal stage priced before


class StageCoster:
    def __init__(self, graph: Graph, cost: CostModel) -> None:
        self.graph, self.cost = graph, cost
        self.stats = CosterStats()
        ids: dict[str, int] = {}
        self._node_sig = {v: ids.setdefault(sig, len(ids)) for v, sig in graph.cost_signatures.items()}
        self._cache: dict[tuple[object, ...], float] = {}
        self._group_keys: dict[tuple[str, ...], tuple[object, ...]] = {}  # a group recurs in many stages

    @cached_property
    def segment_cut(self) -> SegmentCut | None:
        """The cost model's :class:`~opsched.cost.SegmentCut` for this graph, asked for once."""
        return self.cost.segment_cut(self.graph)

    def group_key(self, group: Sequence[str]) -> tuple[object, ...]:
        """:func:`opsched.ir.stage_key`'s notion of a group, with signatures interned to ints."""
        group = tuple(group)
        key = self._group_keys.get(group)
        if key is None:
            key = self._group_keys[group] = tuple(zip((self._node_sig[v] for v in group),
                                                      group_wiring(self.graph, group)))
        return key

    def stage_key(self, stage: Stage) -> tuple[object, ...]:
        return (stage.strategy, tuple(sorted(self.group_key(g) for g in stage.groups)))

    def latency(self, stage: Stage) -> float:
        self.stats.requests += 1
        key = self.stage_key(stage)
        hit = self._cache.get(key)
        if hit is not None:
            self.stats.structural_hits += 1
            return hit
        value = float(self.cost.stage_latency(self.graph, stage))
        self._cache[key] = value
        self.stats.distinct += 1
        return value


def estimate_stages(graph: Graph, stages: Sequence[Stage], cost: CostModel | StageCoster) -> float:
    """The cost model's latency of a stage list: the sum of its stages (the IOS model), plus, where
    the model charges for them, the segments its stages of several groups cut (:mod:`.cuts`)."""
    coster = cost if isinstance(cost, StageCoster) else StageCoster(graph, cost)
    return sum(coster.latency(s) for s in stages) + cut_latency(graph, stages, coster.segment_cut)

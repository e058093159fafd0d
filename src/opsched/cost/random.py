"""A seeded random cost model: arbitrary stage prices, for testing searches.

IOS kept one for counting its search space; we use it to check that the dynamic program finds
the true optimum of *any* additive stage pricing, not just of well-behaved ones. Prices are a
pure function of the seed and the stage's structure (so structurally equal stages agree, as the
protocol requires) and are not monotone: a stage may be cheaper than a part of it. With
``cuts``, cutting segments costs something too (:class:`~opsched.cost.SegmentCut`, random per
value), so that searches are checked on that term of the objective as well.
"""

from __future__ import annotations

import hashlib

from opsched.cost.base import SegmentCut
from opsched.ir import Graph, stage_key
from opsched.schedule import Stage

__all__ = ["RandomCostModel"]


class RandomCostModel:
    monotone = False

    def __init__(self, seed: int = 0, low: float = 0.1, high: float = 1.0, cuts: bool = False) -> None:
        self.seed, self.low, self.high, self.cuts = seed, low, high, cuts

    @property
    def device(self) -> str:
        return "random"

    @property
    def key(self) -> str:
        return f"random/{self.seed}/{self.low}/{self.high}" + ("/cuts" if self.cuts else "")

    def _unit(self, text: str) -> float:
        digest = hashlib.sha256(f"{self.seed}|{text}".encode()).digest()
        return int.from_bytes(digest[:8], "big") / 2**64

    def stage_latency(self, graph: Graph, stage: Stage) -> float:
        return self.low + (self.high - self.low) * self._unit(stage_key(graph, stage.groups, stage.strategy))

    def segment_cut(self, graph: Graph) -> SegmentCut | None:
        if not self.cuts:
            return None
        values = [i.name for i in graph.inputs] + [n.name for n in graph.nodes]
        scale = self.high / 2
        return SegmentCut(scale * self._unit("resume"), {v: scale * self._unit(f"leave {v}") for v in values},
                          {v: scale * self._unit(f"enter {v}") for v in values})

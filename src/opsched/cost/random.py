"""A seeded random cost model: arbitrary stage prices, for testing searches.

IOS kept one for counting its search space; we use it to check that the dynamic program finds
the true optimum of *any* additive stage pricing, not just of well-behaved ones. Prices are a
pure function of the seed and the stage's structure (so structurally equal stages agree, as the
protocol requires) and are not monotone: a stage may be cheaper than a part of it.
"""

from __future__ import annotations

import hashlib

from opsched.ir import Graph, stage_key
from opsched.schedule.types import Stage

__all__ = ["RandomCostModel"]


class RandomCostModel:
    monotone = False

    def __init__(self, seed: int = 0, low: float = 0.1, high: float = 1.0) -> None:
        self.seed, self.low, self.high = seed, low, high

    @property
    def device(self) -> str:
        return "random"

    @property
    def key(self) -> str:
        return f"random/{self.seed}/{self.low}/{self.high}"

    def stage_latency(self, graph: Graph, stage: Stage) -> float:
        digest = hashlib.sha256(f"{self.seed}|{stage_key(graph, stage.groups, stage.strategy)}".encode()).digest()
        unit = int.from_bytes(digest[:8], "big") / 2**64
        return self.low + (self.high - self.low) * unit

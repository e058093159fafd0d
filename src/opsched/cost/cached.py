"""A cost model that remembers: answers come from the profile store when they can.

Wraps any cost model (in practice the measured one): a stage's structural key is looked up
(:func:`opsched.ir.stage_key`) under the wrapped model's measuring context; only a miss
reaches the model, and its answer is committed at once. Optimising the same model twice
measures nothing the second time, and a search interrupted with Ctrl-C keeps everything it
measured.
"""

from __future__ import annotations

from collections.abc import Callable

from opsched.cost.base import CostModel, SegmentCut
from opsched.cost.store import ProfileContext, ProfileStore
from opsched.ir import Graph, stage_key
from opsched.schedule.types import Stage

__all__ = ["StoredCostModel"]


class StoredCostModel:
    def __init__(self, model: CostModel, store: ProfileStore, context: ProfileContext) -> None:
        self.model, self.store, self.context = model, store, context
        self.hits = 0
        self.misses = 0
        bind = getattr(model, "use_store", None)
        if bind is not None:  # a model that builds prices from parts and calibrations takes them from here
            bind(self.stage_latency, self._remember)

    def _remember(self, name: str, measure: Callable[[], float]) -> float:
        key = f"calibration/{name}"
        known = self.store.get(self.context, key)
        if known is None:
            known = float(measure())
            self.store.put(self.context, key, known)
        return known

    def segment_cut(self, graph: Graph) -> SegmentCut | None:
        ask = getattr(self.model, "segment_cut", None)
        return ask(graph) if ask is not None else None

    @property
    def measurements(self) -> int:
        """Stages the wrapped model ran to answer the misses (``misses`` where it does not say)."""
        return int(getattr(self.model, "measurements", self.misses))

    @property
    def monotone(self) -> bool:
        return bool(getattr(self.model, "monotone", False))

    @property
    def device(self) -> str:
        return self.model.device

    @property
    def key(self) -> str:
        return self.model.key

    def stage_latency(self, graph: Graph, stage: Stage) -> float:
        key = stage_key(graph, stage.groups, stage.strategy)
        known = self.store.get(self.context, key)
        if known is not None:
            self.hits += 1
            return known
        value = float(self.model.stage_latency(graph, stage))
        self.store.put(self.context, key, value)
        self.misses += 1
        return value

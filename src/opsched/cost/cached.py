"""A cost model that remembers: answers come from the profile store when they can.

Wraps any cost model (in practice the measured one): a stage's structural key is looked up
under the wrapped model's measuring context; only a miss reaches the model, and its answer is
committed at once. Optimising the same model twice measures nothing the second time, and a
search interrupted with Ctrl-C keeps everything it measured.
"""

from __future__ import annotations

import hashlib

from opsched.cost.base import CostModel
from opsched.cost.store import ProfileContext, ProfileStore
from opsched.ir import Graph, node_signature
from opsched.schedule.types import Stage

__all__ = ["StoredCostModel", "stable_stage_key"]


def stable_stage_key(graph: Graph, stage: Stage) -> str:
    """A process-independent structural key of a stage (the profile store's key)."""
    groups = []
    for group in stage.groups:
        local = {v: i for i, v in enumerate(group)}
        groups.append("|".join(f"{node_signature(graph, graph.node(v))}<"
                               f"{','.join(str(local.get(u, -1)) for u in graph.node(v).inputs)}" for v in group))
    text = stage.strategy + "\n" + "\n".join(sorted(groups))
    return hashlib.sha256(text.encode()).hexdigest()


class StoredCostModel:
    def __init__(self, model: CostModel, store: ProfileStore, context: ProfileContext) -> None:
        self.model, self.store, self.context = model, store, context
        self.hits = 0
        self.misses = 0

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
        key = stable_stage_key(graph, stage)
        known = self.store.get(self.context, key)
        if known is not None:
            self.hits += 1
            return known
        value = float(self.model.stage_latency(graph, stage))
        self.store.put(self.context, key, value)
        self.misses += 1
        return value

"""The cost-model protocol: how long one stage takes, in milliseconds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

from opsched.ir import Graph

if TYPE_CHECKING:
    from opsched.schedule.types import Stage

__all__ = ["CostModel"]


@runtime_checkable
class CostModel(Protocol):
    """Prices stages. Schedulers ask; they never run kernels themselves.

    ``key`` identifies the model and everything its answers depend on (device, backend,
    library versions...): caches of its answers are keyed by it. A model must give the same
    answer for structurally equal stages (same op signatures, grouping and wiring), which is
    what lets schedulers share one answer across repeated blocks.

    ``monotone`` promises that a stage never costs less than a stage made of a subset of its
    groups (adding work cannot speed up what was there). Searches use it to discard stages
    unpriced; a model that cannot promise it sets it to ``False``.
    """

    monotone: bool

    @property
    def key(self) -> str: ...

    @property
    def device(self) -> str: ...

    def stage_latency(self, graph: Graph, stage: Stage) -> float: ...

"""The cost-model protocol: how long one stage takes, in milliseconds, and what cutting a
backend's segments around it costs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Protocol, runtime_checkable

from opsched.ir import Graph
from opsched.schedule import Stage

__all__ = ["CostModel", "SegmentCut"]


@dataclass(frozen=True)
class SegmentCut:
    """What a phase of several lanes costs beyond its own price, by cutting the one-lane segment
    it interrupts (:mod:`opsched.runtime.plan`): ``resume_ms`` for the segment that resumes after
    it, ``leave_ms[v]`` for each value ``v`` live where the segment before it ends, and
    ``enter_ms[v]`` for each value live where the next one begins (values not named: nothing).
    On ONNX Runtime that is a session call and converting tensors out of and into its blocked
    layout; a backend whose segments cost nothing to cut has no ``SegmentCut``."""

    resume_ms: float
    leave_ms: Mapping[str, float] = field(default_factory=dict)
    enter_ms: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "leave_ms", MappingProxyType(dict(self.leave_ms)))
        object.__setattr__(self, "enter_ms", MappingProxyType(dict(self.enter_ms)))


@runtime_checkable
class CostModel(Protocol):
    """Prices stages. Schedulers ask; they never run kernels themselves.

    ``key`` identifies the model and everything its answers depend on (device, backend,
    library versions...). A model must give the same answer for structurally equal stages (same
    op signatures, grouping and wiring), which is what lets schedulers share one answer across
    repeated blocks.

    ``monotone`` promises that a stage never costs less than a stage made of a subset of its
    groups (adding work cannot speed up what was there). Searches use it to discard stages
    unpriced; a model that cannot promise it is ``False``.

    ``segment_cut(graph)``: what a stage of several groups costs beyond its price by cutting the
    segment around it, or ``None`` where cutting costs nothing. Schedules are priced with it
    (:func:`opsched.cost.estimate_stages`), and the IOS search optimises it.
    """

    @property
    def key(self) -> str: ...

    @property
    def device(self) -> str: ...

    @property
    def monotone(self) -> bool: ...

    def stage_latency(self, graph: Graph, stage: Stage) -> float: ...

    def segment_cut(self, graph: Graph) -> SegmentCut | None: ...

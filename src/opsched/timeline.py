"""What a run or a simulation records: one event per step (or kernel) on its lane, in time."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TraceEvent"]


@dataclass(frozen=True, slots=True)
class TraceEvent:
    """One item's run, for timelines: times in ms from the start of the call.

    ``op`` is the op kind it computes (``"conv2d(merged)"`` for a merged convolution, a
    backend's own kind for kernels no step owns) and ``category`` what it mostly does (an
    :data:`opsched.ir.CATEGORIES` entry, or a backend's own: ``"layout"``, ``"segment"``).
    """

    phase: int
    lane: int
    label: str
    op: str
    start_ms: float
    end_ms: float
    category: str = "other"

"""What the ``torch.compile`` backend reports of the graphs Dynamo handed it
(:func:`opsched.dynamo.compiled_graphs`, :func:`opsched.dynamo.report`): small frozen records,
each its own text.

- :class:`Bucket`: one plan of a graph (its input shapes, how it was made, what it runs);
- :class:`AsCaptured`: the calls a graph ran as Dynamo captured them, with no plan, and why;
- :class:`CompiledGraphInfo`: a graph, its buckets and those calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from opsched._text import count
from opsched.buckets import MAX_SHAPES
from opsched.report import ScheduleSummary

__all__ = ["AsCaptured", "Bucket", "CompiledGraphInfo", "shapes_text"]


@dataclass(frozen=True)
class Bucket:
    """One specialisation of a graph: its inputs' shapes (and integer arguments), how long it took
    to make, the schedule it runs (None where it runs eagerly, and ``fallback`` then says why)."""

    shapes: tuple[tuple[int, ...], ...]
    ints: tuple[int, ...]
    seconds: float
    schedule: ScheduleSummary | None
    backend: str | None
    fallback: str | None = None
    reason: str = "first call"
    #: The bucket (its place in its graph's) whose schedule this one reapplies, with no search
    #: (None: searched for this one).
    schedule_of: int | None = None
    #: The graph (its number in this process) of that bucket, where it is another graph's.
    graph_of: int | None = None
    #: The schedule cache's file whose schedule this bucket loaded, with no search (None: not one).
    cached: str | None = None

    @property
    def searched(self) -> bool:
        """Whether its schedule was searched for it (not reapplied, not loaded, not eager)."""
        return self.schedule is not None and self.schedule_of is None and self.cached is None

    def __str__(self) -> str:
        ints = f" ints {list(self.ints)}" if self.ints else ""
        graph = "" if self.graph_of is None else f"graph {self.graph_of}'s "
        reused = ("" if self.schedule_of is None else f", {graph}bucket {self.schedule_of}'s schedule") + (
            "" if self.cached is None else f", the schedule cache's {Path(self.cached).name}")
        how = (f"eager ({self.fallback})" if self.schedule is None
               else f"{self.schedule.scheduler} on {self.backend}: {self.schedule}")
        return f"{shapes_text(self.shapes)}{ints} ({self.reason}, {self.seconds:.1f} s{reused}): {how}"


@dataclass(frozen=True)
class AsCaptured:
    """Calls a graph ran as Dynamo captured them, at shapes it keeps no plan (nor bucket) for, and why."""

    why: str  #: past ``max_shapes``, or after ``max_new_in_a_row`` new shapes in a row
    calls: int
    first: tuple[tuple[int, ...], ...]  #: the first such call's input shapes
    last: tuple[tuple[int, ...], ...]

    def __str__(self) -> str:
        return f"{count(self.calls, 'call')} {self.why}, eagerly: {shapes_text(self.first)} to {shapes_text(self.last)}"


def shapes_text(shapes: Sequence[Sequence[int]]) -> str:
    """``[1x3x224x224, 1x10]``."""
    return "[" + (", ".join("x".join(map(str, s)) for s in shapes) or "no tensors") + "]"


@dataclass(frozen=True)
class CompiledGraphInfo:
    """A graph Dynamo handed over: its number in this process, its operators, its buckets."""

    index: int
    operators: int
    buckets: tuple[Bucket, ...]
    max_shapes: int = MAX_SHAPES
    #: Calls at shapes past ``max_shapes``, or after ``max_new_in_a_row`` new ones in a row.
    as_captured: tuple[AsCaptured, ...] = ()

    @property
    def recompiles(self) -> int:
        """Buckets made after the first (a new shape, new weights)."""
        return max(0, len(self.buckets) - 1)

    @property
    def searches(self) -> int:
        """Buckets whose schedule was searched for them (the others reapply one, load one from the
        schedule cache, or run eagerly)."""
        return sum(1 for b in self.buckets if b.searched)

    def __str__(self) -> str:
        loaded = sum(b.cached is not None for b in self.buckets)
        cached = f", {loaded} from the schedule cache" if loaded else ""
        lines = [f"graph {self.index}: {count(self.operators, 'operator')}, {count(len(self.buckets), 'bucket')} "
                 f"({self.searches} searched{cached}), {count(self.recompiles, 'recompile')}"]
        lines += [f"  {i}: {b}" for i, b in enumerate(self.buckets)]
        lines += [f"  {c}" for c in self.as_captured]  # a decoding loop's every length, a detector's every count
        return "\n".join(lines)

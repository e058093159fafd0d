"""What :func:`opsched.optimize` made and found, as typed records (``module.report()``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from opsched._text import count, size
from opsched.cost.measured import MeasurementCounts
from opsched.race import Standings
from opsched.runtime import Plan
from opsched.schedule import Schedule
from opsched.schedulers import scheduler_names, spec

__all__ = ["ScheduleSummary", "RaceResult", "OptimizeOutcome", "OptimizeReport"]


@dataclass(frozen=True)
class ScheduleSummary:
    """A schedule's shape: ``stages`` where it has IOS's shape (None for free-running lanes),
    ``phases`` of its plan, at most ``concurrency`` lanes at once, ``merges`` merged convolutions."""

    scheduler: str
    stages: int | None
    lanes: int
    phases: int
    concurrency: int
    merges: int
    estimated_ms: float | None
    stats: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, schedule: Schedule, plan: Plan) -> ScheduleSummary:
        stages = schedule.stages
        return cls(schedule.scheduler, None if stages is None else len(stages), len(schedule.lanes),
                   len(plan.phases), plan.max_lanes, len(schedule.merges), schedule.estimated_ms, dict(schedule.stats))

    @property
    def search(self) -> str | None:
        """The scheduler's own line about its work, where it has one."""
        summarize = spec(self.scheduler).summarize if self.scheduler in scheduler_names() else None
        return summarize(self.stats) if summarize is not None and self.stats else None

    def __str__(self) -> str:
        shape = count(self.stages, "stage") if self.stages is not None else count(self.lanes, "lane")
        text = (f"{shape}, {count(self.phases, 'phase')}, up to {count(self.concurrency, 'concurrent lane')}, "
                f"{count(self.merges, 'merged convolution')}")
        if self.estimated_ms is not None:
            text += f"; estimated {self.estimated_ms:.3f} ms"
        return text


@dataclass(frozen=True)
class RaceResult:
    """One interleaved race of plans: every contender's time per round, which was kept (the
    fastest that fits the memory budget, compared round by round), and each contender's peak of
    live activations in bytes, where known."""

    standings: Standings[str]
    kept: str
    peak_bytes: Mapping[str, int] = field(default_factory=dict)

    @property
    def times_ms(self) -> dict[str, float]:
        """Each contender's median ms."""
        return self.standings.medians

    @property
    def relative(self) -> dict[str, float]:
        """Each contender's time as a multiple of the kept one's, paired round by round: what
        decided the race."""
        return self.standings.relative(self.kept)

    def cut_off(self, name: str) -> str:
        """"cut off after N rounds" for a contender the race stopped timing, else ""."""
        s = self.standings
        return f"cut off after {count(len(s.samples[name]), 'round')}" if name in s.cut_off else ""

    def __str__(self) -> str:
        relative = self.relative

        def one(name: str, ms: float) -> str:
            text = f"{name} {ms:.2f} ms" + ("" if name == self.kept else f" ({relative[name]:.2f}x)")
            text += f" at {size(self.peak_bytes[name])}" if name in self.peak_bytes else ""
            return text + (f", {cut}" if (cut := self.cut_off(name)) else "")
        return ", ".join(one(name, ms) for name, ms in self.times_ms.items()) + f": kept {self.kept}"


@dataclass(frozen=True)
class OptimizeOutcome:
    """What optimizing found beyond the schedule it kept: the race of plans, the schedules searched
    that lost it, the measurements it took, its time."""

    race: RaceResult | None = None
    searched: tuple[ScheduleSummary, ...] = ()
    measurements: MeasurementCounts | None = None
    seconds: float | None = None
    memory_budget: int | None = None
    over_budget: Mapping[str, int] = field(default_factory=dict)  # plans left out of the race: their peaks
    same_plan: Mapping[str, str] = field(default_factory=dict)  # left out of the race: the contender running its plan

    @property
    def contenders(self) -> frozenset[str]:
        """The plans that fit the memory budget: those raced, and those that run as one of them."""
        raced = self.race.times_ms if self.race is not None else ()
        return frozenset(raced) | frozenset(self.same_plan) | frozenset(self.same_plan.values())


@dataclass(frozen=True)
class OptimizeReport:
    """A scheduled module's account of itself (``print`` it)."""

    model: str
    operators: int
    batch: int
    device: str
    backend: str
    executor: str
    schedule: ScheduleSummary
    outcome: OptimizeOutcome = OptimizeOutcome()
    peak_bytes: int | None = None
    fixed_inputs: str = ""  # the inputs the graph was made for one value of: "sr=16000 (int64)"

    def __str__(self) -> str:
        s = self.schedule
        lines = [f"{self.model}: {self.operators} operators, scheduled by {s.scheduler} for batch {self.batch} on "
                 f"{self.device}, running on the {self.backend} backend",
                 f"  {s}", f"  {self.executor}"]
        if self.fixed_inputs:
            lines.append(f"  computes for inputs fixed at {self.fixed_inputs} (input_values)")
        if self.peak_bytes is not None:
            budget = self.outcome.memory_budget
            lines.append(f"  peak activations: {size(self.peak_bytes)}"
                         + (f" (budget {size(budget)})" if budget is not None else ""))
        if s.search:
            lines.append(f"  {s.search}")
        o = self.outcome
        if o.race is not None:
            lines.append(f"  end-to-end check: {o.race}")
        for name, twin in o.same_plan.items():
            lines.append(f"  {name}'s plan was left out of the race: it runs as {twin}'s does")
        for name, peak in o.over_budget.items():
            lines.append(f"  {name}'s plan was left out: its activations peak at {size(peak)}, over the budget")
        for other in o.searched:
            lines.append(f"  searched schedule ({other.scheduler}, lost the race): {other}"
                         + (f"; {other.search}" if other.search else ""))
        if o.seconds is not None:
            lines.append(f"  optimize time: {o.seconds:.2f} s")
        if o.measurements is not None:
            lines.append(f"  measurements: {o.measurements}")
        return "\n".join(lines)

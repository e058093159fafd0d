"""The measured cost model: stages timed on a backend, priced as a plan runs them, every figure
kept in the profile store.

One model for every backend. The backend (:class:`StageTimer`, which every
:class:`opsched.backends.Backend` is) runs and times stages its own way: ONNX Runtime reads its
kernels from its own profiler, torch subtracts an empty call, CUDA times captured replays with
events. This model decides what to time and how to price it, and keeps every answer in the
profile store (:class:`~opsched.cost.store.ProfileStore`), keyed by the backend's measuring
context and the stage's *structural* key, so identical stages are measured once, a second
search measures nothing, and a search interrupted with Ctrl-C keeps everything it measured.

What a stage costs inside a plan is not what it costs alone. In a plan, consecutive stages of
one group run as one segment (:mod:`opsched.runtime.plan`): one backend call, and on ONNX
Runtime one session, whose tensors stay in ORT's blocked layout from kernel to kernel. Alone,
a stage also pays the call and, on ORT, the layout conversions at its session's edges: for an
Inception V3 average pool, 0.05 ms of kernel in 0.17 ms of call. And on a CPU the figures
drift: on a shared 2-core machine one operator measured 0.07 ms, then 0.31 ms for seconds on
end. A search that compares prices taken at different moments then picks whatever was
measured in a quiet spell (a plan priced 68 ms against sequential's 83 ran within 1% of it). So,
where the backend's clock drifts (:attr:`StageTimer.relative_pricing`), prices are built from
per-node figures, and every choice between running nodes together or one after another is
timed as a pair, interleaved, so that drift moves both sides alike:

* a **node** costs its time as a stretch of a segment (:attr:`StageTiming.segment_ms`);
* a **stage of one group** costs the sum of its nodes;
* a **stage of several groups**, or a **merge**, is run interleaved with the same nodes run as
  one group, and costs the sum of its nodes times the ratio of the two, round by round, taken
  at the upper quartile (:data:`PAIR_QUANTILE`): it is priced below its serial twin only when
  it paid in most rounds. Run together, it is timed as a phase of its own (the call's wall
  time: lanes, threads, their conversions, the join); a merge as the one step it is. A stage
  of several groups never costs less than its dearest group (the model is monotone);
* what a stage of several groups costs the **segments around it** depends on what else is live
  there, so it is the search's to add (:meth:`MeasuredCostModel.segment_cut`, the backend's).

A backend whose clock does not drift (CUDA graphs replayed between events) prices every stage
by timing it directly.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from opsched.cost.base import SegmentCut
from opsched.cost.store import ProfileContext, ProfileStore
from opsched.execution import RunOptions
from opsched.ir import Graph, stage_key
from opsched.schedule import Stage, graph_batch

__all__ = ["MeasuredCostModel", "StageTimer", "StageTiming", "TimingPolicy", "Calibrations", "PAIR_QUANTILE",
           "MeasurementCounts"]

#: Where among a pair's per-round ratios its price is taken: the upper quartile, so that running
#: nodes together (or merged) is priced below running them one after another only when it
#: paid in most rounds, not in a lucky one (see the module docstring).
PAIR_QUANTILE = 0.75


@dataclass(frozen=True, slots=True)
class TimingPolicy:
    """How stages are timed: ``warmup`` untimed rounds, ``repeat`` timed ones (medians are taken
    over them) and, where one sample times several back-to-back runs (CUDA graph replays),
    ``inner`` runs per sample."""

    warmup: int = 2
    repeat: int = 7
    inner: int = 10


@dataclass(frozen=True, slots=True)
class StageTiming:
    """One stage's timed rounds, in ms; entry r of each is the r-th timed round.

    ``wall_ms``: the stage's call as a phase of its own (its lanes, their join, conversions at
    its edges). ``segment_ms``: what the stage's steps cost as a stretch of a one-lane segment
    of a plan (on ONNX Runtime its kernels, plus the conversions a merged convolution's split
    forces; on torch the call less an empty one; on CUDA the replay less an empty replay)."""

    wall_ms: tuple[float, ...]
    segment_ms: tuple[float, ...]


class Calibrations(Protocol):
    """Where a backend keeps the figures it calibrates once (an empty call, a layout conversion
    rate): ``remember(name, measure)`` returns the stored figure, measuring it the first time."""

    def remember(self, name: str, measure: Callable[[], float]) -> float: ...


class StageTimer(Protocol):
    """What the measured model needs of a backend; every :class:`opsched.backends.Backend` is one."""

    @property
    def name(self) -> str: ...

    @property
    def relative_pricing(self) -> bool:
        """Whether its clock drifts, so that stages are priced relative to their serial twins."""

    @property
    def default_policy(self) -> TimingPolicy:
        """How its stages are timed unless told otherwise."""

    def profile_tag(self, run: RunOptions) -> str:
        """The profile store's name for measurements on it; its version changes whenever what
        its measurements mean changes."""

    def fingerprint(self, run: RunOptions) -> str:
        """The device it runs on, as measurements depend on it (model, cores, memory)."""

    def versions(self) -> str:
        """The libraries whose kernels it runs."""

    def time_stages(self, graph: Graph, stages: Sequence[Stage], run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> list[StageTiming]:
        """Each stage cut out of ``graph``, run alone, all of them interleaved round by round."""

    def segment_cut(self, graph: Graph, run: RunOptions, policy: TimingPolicy,
                    calibrations: Calibrations) -> SegmentCut | None:
        """What cutting its one-lane segments costs in ``graph`` (None: nothing)."""


@dataclass(frozen=True, slots=True)
class MeasurementCounts:
    """What a search cost: stages (or pairs of stages) timed now, and distinct stored figures it
    found in the profile store from earlier runs."""

    timed: int
    reused: int

    def __str__(self) -> str:
        return f"{self.timed} timed now, {self.reused} reused from the profile store"


class MeasuredCostModel:
    """Stage latencies by measurement on ``backend`` (see the module docstring).

    ``run`` says how plans will run (cores, layout), which the measurements must match;
    ``store`` keeps every figure (None: kept in memory for this model only).
    """

    monotone = True  # physically: a stage with more work does not run faster (up to noise)

    def __init__(self, backend: StageTimer, run: RunOptions | None = None, policy: TimingPolicy | None = None,
                 store: ProfileStore | None = None) -> None:
        self.backend = backend
        self.run = run or RunOptions()
        self.policy = policy or backend.default_policy
        self.store = store
        self._device = backend.fingerprint(self.run)
        self._versions = backend.versions()
        self._tag = backend.profile_tag(self.run)
        self._memory: dict[tuple[int, str], float] = {}  # without a store
        self._written: set[tuple[int, str]] = set()      # figures this model measured
        self._reused: set[tuple[int, str]] = set()       # stored figures it found from earlier runs
        self._timed = 0

    @property
    def device(self) -> str:
        return self._device

    @property
    def key(self) -> str:
        p = self.policy
        return f"measured/{self._tag}/{self._device}/{self._versions}/{p.warmup}x{p.repeat}x{p.inner}"

    def context(self, batch: int) -> ProfileContext:
        return ProfileContext(self._device, self._tag, self._versions, batch)

    @property
    def counts(self) -> MeasurementCounts:
        return MeasurementCounts(self._timed, len(self._reused))

    # --- the store --------------------------------------------------------------------------
    def _lookup(self, batch: int, key: str, measure: Callable[[], float]) -> float:
        slot = (batch, key)
        if self.store is None:
            if slot not in self._memory:
                self._memory[slot] = measure()
            return self._memory[slot]
        ctx = self.context(batch)
        known = self.store.get(ctx, key)
        if known is not None:
            if slot not in self._written:
                self._reused.add(slot)
            return known
        value = float(measure())
        self.store.put(ctx, key, value)
        self._written.add(slot)
        return value

    def remember(self, name: str, measure: Callable[[], float]) -> float:
        """A backend's calibration ``name``, from the store, or measured once and stored."""
        def counted() -> float:
            self._timed += 1
            return measure()
        return self._lookup(0, f"calibration/{name}", counted)

    # --- pricing ----------------------------------------------------------------------------
    def stage_latency(self, graph: Graph, stage: Stage) -> float:
        return self._lookup(graph_batch(graph), stage_key(graph, stage.groups, stage.strategy),
                            lambda: self._price(graph, stage))

    def segment_cut(self, graph: Graph) -> SegmentCut | None:
        return self.backend.segment_cut(graph, self.run, self.policy, self)

    def _time(self, graph: Graph, stages: Sequence[Stage]) -> list[StageTiming]:
        self._timed += 1
        return self.backend.time_stages(graph, stages, self.run, self.policy, self)

    def _price(self, graph: Graph, stage: Stage) -> float:
        nodes = stage.nodes
        one_group = len(stage.groups) == 1 and stage.strategy == "parallel"
        if not self.backend.relative_pricing or (one_group and len(nodes) == 1):
            (alone,) = self._time(graph, [stage])
            return statistics.median(alone.segment_ms)
        if one_group:
            return self._sum(graph, nodes)
        serial = Stage((nodes,))  # the same nodes as one group: each group's chain, one after another
        together, apart = self._time(graph, [stage, serial])
        ran = together.segment_ms if stage.strategy == "merge" else together.wall_ms
        ratios = [a / max(b, 1e-6) for a, b in zip(ran, apart.segment_ms)]
        price = self._sum(graph, nodes) * float(np.quantile(ratios, PAIR_QUANTILE))
        if stage.strategy == "parallel":
            price = max(price, *(self._sum(graph, g) for g in stage.groups))
        return price

    def _sum(self, graph: Graph, nodes: Sequence[str]) -> float:
        return sum(self.stage_latency(graph, Stage(((v,),))) for v in nodes)

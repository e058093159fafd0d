"""The resource model: what each operator needs from the device, and how co-running ones share it.

Each operator has a **duration** (its time alone on the device) and a **demand** (the fraction
of the device it occupies alone: SMs its grid fills on a GPU, cores it keeps busy on a CPU), so
its **area**, ``duration * demand``, is its time with the whole device. While operators run at
once, each advances through its duration at the same speed

    ``rate = 1 / max(1, load, 1 + (1 - overlap) * (k - 1))``

where ``load`` is the sum of their demands and ``k`` how many of them there are:

* ``load <= 1`` and ``overlap = 1``: each runs as fast as alone (the device had room);
* ``load > 1``: processor sharing, the device completes exactly one unit of area per unit of
  time and never more;
* ``overlap < 1``: co-running operators also contend for caches, memory bandwidth and the
  block scheduler: ``k`` of them that fit still slow each other down. With this rate a set of
  groups (chains) that never oversubscribe the device takes ``longest + (1 - overlap) *
  (sum - longest)`` over their chain times, which is the analytic stage formula's term.

Whatever the overlap, ``k`` operators together advance at least one unit of duration per unit
of time in total (``k * rate >= 1``, as ``load <= k`` and ``1 + (1 - overlap)(k - 1) <= k``), so
any schedule that keeps one operator running is never slower than running them one by one.

The analytic cost model provides one (:meth:`AnalyticCostModel.resources`); other cost models
price single-operator stages for the durations and borrow the demands of an analytic device
model (:func:`opsched.cost.demands.resources_for`). The simulator (:mod:`opsched.schedulers.simulate`) and the
``est`` list scheduler (:mod:`opsched.schedulers.est`) both run on this model.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from opsched.errors import CostModelError

__all__ = ["OpDemand", "ResourceModel"]


@dataclass(frozen=True, slots=True)
class OpDemand:
    """``fork_ms``: what starting this operator beside running ones costs the plan beyond it,
    where the backend charges for cutting its one-lane segments (ONNX Runtime: the
    :class:`~opsched.cost.SegmentCut`'s resume, and converting what the operator reads out of
    the blocked layout and what it writes back in); a scheduler should not start it beside
    others to gain less than that. The simulator does not charge it."""

    duration_ms: float  # alone on the device
    demand: float       # fraction of the device it occupies alone, in [0, 1]
    fork_ms: float = 0.0

    def __post_init__(self) -> None:
        if self.duration_ms < 0 or not 0.0 <= self.demand <= 1.0 or self.fork_ms < 0:
            raise CostModelError(f"an operator needs duration >= 0, demand in [0, 1] and fork cost >= 0, got "
                                 f"{self.duration_ms} ms, {self.demand} and {self.fork_ms} ms")

    @property
    def area_ms(self) -> float:
        return self.duration_ms * self.demand


@dataclass(frozen=True)
class ResourceModel:
    """Per-operator demands (keyed by node name; a merged convolution by its nodes joined with
    ``+``), the ``overlap`` of co-running operators, and the cost of a stage barrier.

    ``oversubscribe``: whether operators may be started beyond the device's capacity and then
    share it (a GPU's block scheduler does this); false where the executor gives each lane a
    fixed share (CPU threads), so that a scheduler should start only what fits. The simulator
    treats both alike (as sharing).
    """

    ops: Mapping[str, OpDemand]
    overlap: float = 1.0
    barrier_ms: float = 0.0
    device: str = ""
    oversubscribe: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.overlap <= 1.0:
            raise CostModelError(f"overlap must lie in [0, 1], got {self.overlap}")
        object.__setattr__(self, "ops", MappingProxyType(dict(self.ops)))

    def __getitem__(self, key: str) -> OpDemand:
        try:
            return self.ops[key]
        except KeyError:
            raise CostModelError(f"the resource model{' of ' + self.device if self.device else ''} has no "
                                 f"operator {key!r}") from None

    def rate(self, load: float, count: int) -> float:
        """Speed of each of ``count`` operators running at once with total demand ``load``."""
        return 1.0 / max(1.0, load, 1.0 + (1.0 - self.overlap) * (count - 1))

"""Racing plans end to end: contenders run interleaved in one process, the fastest kept.

Stage prices are taken in isolation, and neither scheduler wins everywhere (on an H100, est's
barrier-free lanes ran NASNet 17% faster than the DP's stages, the DP's stages GoogLeNet 27%
faster than est's lanes), so :func:`opsched.optimize` races the plans it made before keeping
one. Timing follows :func:`opsched.timing.interleave`: a fresh order each round; in its turn a
contender sleeps ``settle_s`` (an ONNX Runtime session's spinning threads kept a core busy for
about 40 ms after its run here), runs once untimed, then ``block`` timed calls.

A turn depends on the device (:func:`turn_for`): on a CPU it settles and times 3 calls; on a GPU
nothing spins after a call, so it does not settle, and it times 10 calls, since single calls of a
captured plan at batch 1 (0.1-1 ms) spread by up to 30% between rounds on an H200.

Contenders are compared round by round (:func:`opsched.timing.paired_ratio`), so that load
which comes and goes during the race slows both sides of a comparison alike; the fastest is the
contender whose slowest comparison is the best: the one that beats every other, where one does.

A race on a CPU stops timing a contender once another has beaten it clearly (:class:`Cutoff`:
by more than 10% in each of its first 3 rounds), and ends when one is left. The main job's race
of Inception V3's plans ran 15 rounds of 3 contenders, 17 s, to keep a plan that beat the others
by 1.29x and 1.69x; with the cutoff it ends after 3 (``benchmarks/race.py`` counts the races in
which a cutoff stopped timing the faster plan, and the turns it saved). A GPU race of plans that
take 0.1-1 ms a call costs well under a second, so it runs every round.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from opsched.progress import Progress
from opsched.timing import Clock, interleave, median, paired_ratio, wall_ms

__all__ = ["race", "Standings", "Turn", "turn_for", "Cutoff", "cutoff_for"]

K = TypeVar("K")


@dataclass(frozen=True)
class Standings(Generic[K]):
    """A race's samples: each contender's times (ms), one per round, in round order. A contender
    the race stopped timing (``cut_off``, by a :class:`Cutoff`) has those of the rounds it ran,
    the first ones."""

    samples: Mapping[K, tuple[float, ...]]
    cut_off: frozenset[K] = frozenset()

    @property
    def rounds(self) -> int:
        """The timed rounds the race ran."""
        return max(map(len, self.samples.values()), default=0)

    @property
    def medians(self) -> dict[K, float]:
        return {k: median(v) for k, v in self.samples.items()}

    def ratio(self, a: K, b: K) -> float:
        """How many times longer ``a`` took than ``b``, paired by round, over the rounds both ran."""
        both = min(len(self.samples[a]), len(self.samples[b]))
        return paired_ratio(self.samples[a][:both], self.samples[b][:both])

    @property
    def fastest(self) -> K:
        """Of the contenders not cut off, the one whose worst paired ratio against the others is
        the lowest: the one that beat each other contender in most rounds, where one did (ties:
        the first named)."""
        def worst(k: K) -> float:
            return max((self.ratio(k, other) for other in self.samples if other != k), default=1.0)
        return min((k for k in self.samples if k not in self.cut_off), key=worst)

    def relative(self, to: K) -> dict[K, float]:
        """Each contender's time as a multiple of ``to``'s, paired by round."""
        return {k: self.ratio(k, to) for k in self.samples}


@dataclass(frozen=True, slots=True)
class Cutoff:
    """When a race stops timing a contender: once it has run ``rounds`` timed rounds and was
    slower than one other contender by more than ``margin`` in each of them.

    Each round so far, not the last few: a contender that led, or trailed by less, in any
    round runs every round. Load that comes and goes on a shared machine can slow the faster
    contender's turns in a few rounds running. A rule that looked at the latest rounds tests
    afresh each round, and is fooled more often the longer the race; this one is in effect
    tested once, after the first ``rounds`` (a contender that lost each of 4 rounds lost each of
    the first 3). In 240 races of two contenders 5-50% apart (``benchmarks/race.py``), this rule
    stopped timing the faster in 1, a window of the last 3 rounds in 2, all under bursts of load
    on one of two cores at gaps of 5-10%."""

    rounds: int = 3
    margin: float = 0.10

    def __post_init__(self) -> None:
        if self.rounds < 1 or not self.margin >= 0:
            raise ValueError(f"a cutoff takes rounds >= 1 and margin >= 0, got {self.rounds} and {self.margin}")

    def beaten(self, samples: Mapping[K, Sequence[float]]) -> set[K]:
        """The contenders, of ``samples`` (the rounds so far, all of one length), to time no more."""
        if any(len(v) < self.rounds for v in samples.values()):
            return set()
        return {k for k, mine in samples.items()
                if any(all(a > b * (1 + self.margin) for a, b in zip(mine, theirs))
                       for other, theirs in samples.items() if other != k)}


@dataclass(frozen=True)
class Turn:
    """A contender's turn in a race: ``settle_s`` of sleep, one untimed call, ``block`` timed ones."""

    settle_s: float = 0.05
    block: int = 3


#: Turns by the device type the contenders run on (others: a CPU's).
TURNS = {"cpu": Turn(), "cuda": Turn(settle_s=0.0, block=10)}


def turn_for(device_type: str) -> Turn:
    return TURNS.get(device_type, TURNS["cpu"])


#: Cutoffs by device type: a CPU's race (seconds of calls) stops early; any other runs every round.
CUTOFFS = {"cpu": Cutoff()}


def cutoff_for(device_type: str) -> Cutoff | None:
    return CUTOFFS.get(device_type)


def race(calls: Mapping[K, Callable[[], object]], *, clock: Clock = wall_ms, rounds: int = 7, warmup: int = 1,
         turn: Turn = Turn(), cutoff: Cutoff | None = None, progress: Progress | None = None) -> Standings[K]:
    """Each call timed by ``clock`` (to completion, on a GPU), interleaved over at most ``rounds``
    of ``turn``s (``cutoff``: fewer, once decided); ``progress`` follows the rounds."""
    def on_round(done: int, total: int) -> None:
        if progress is not None:
            progress(done, total, f"{len(calls)} contenders")
    cut: set[K] = set()

    def drop(samples: Mapping[K, Sequence[float]]) -> set[K]:
        beaten = cutoff.beaten(samples) if cutoff is not None else set()
        cut.update(beaten)
        return beaten
    with torch.no_grad():
        times = interleave(calls, rounds, warmup, clock=clock, settle_s=turn.settle_s, block=turn.block,
                           on_round=on_round, drop=drop if cutoff is not None else None)
    return Standings({k: tuple(v) for k, v in times.items()}, frozenset(cut))

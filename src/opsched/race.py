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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

import torch

from opsched.progress import Progress
from opsched.timing import Clock, interleave, median, paired_ratio, wall_ms

__all__ = ["race", "Standings", "Turn", "turn_for"]

K = TypeVar("K")


@dataclass(frozen=True)
class Standings(Generic[K]):
    """A race's samples: each contender's times (ms), one per round, in round order."""

    samples: Mapping[K, tuple[float, ...]]

    @property
    def medians(self) -> dict[K, float]:
        return {k: median(v) for k, v in self.samples.items()}

    def ratio(self, a: K, b: K) -> float:
        """How many times longer ``a`` took than ``b``, paired by round."""
        return paired_ratio(self.samples[a], self.samples[b])

    @property
    def fastest(self) -> K:
        """The contender whose worst paired ratio against the others is the lowest: the one that
        beat each other contender in most rounds, where one did (ties: the first named)."""
        def worst(k: K) -> float:
            return max((self.ratio(k, other) for other in self.samples if other != k), default=1.0)
        return min(self.samples, key=worst)

    def relative(self, to: K) -> dict[K, float]:
        """Each contender's time as a multiple of ``to``'s, paired by round."""
        return {k: self.ratio(k, to) for k in self.samples}


@dataclass(frozen=True)
class Turn:
    """A contender's turn in a race: ``settle_s`` of sleep, one untimed call, ``block`` timed ones."""

    settle_s: float = 0.05
    block: int = 3


#: Turns by the device type the contenders run on (others: a CPU's).
TURNS = {"cpu": Turn(), "cuda": Turn(settle_s=0.0, block=10)}


def turn_for(device_type: str) -> Turn:
    return TURNS.get(device_type, TURNS["cpu"])


def race(calls: Mapping[K, Callable[[], object]], *, clock: Clock = wall_ms, rounds: int = 7, warmup: int = 1,
         turn: Turn = Turn(), progress: Progress | None = None) -> Standings[K]:
    """Each call timed by ``clock`` (to completion, on a GPU), interleaved over ``rounds`` of
    ``turn``s; ``progress`` follows the rounds."""
    def on_round(done: int, total: int) -> None:
        if progress is not None:
            progress(done, total, f"{len(calls)} contenders")
    with torch.no_grad():
        times = interleave(calls, rounds, warmup, clock=clock, settle_s=turn.settle_s, block=turn.block,
                           on_round=on_round)
    return Standings({k: tuple(v) for k, v in times.items()})

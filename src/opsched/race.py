"""Racing plans end to end: contenders run interleaved in one process, the fastest kept.

Stage prices are taken in isolation, and neither scheduler wins everywhere (on an H100, est's
barrier-free lanes ran NASNet 17% faster than the DP's stages, the DP's stages GoogLeNet 27%
faster than est's lanes), so :func:`opsched.optimize` races the plans it made before keeping
one. Timing follows :func:`opsched.timing.interleave`: a fresh order each round; in its turn a
contender sleeps ``settle_s`` (an ONNX Runtime session's spinning threads kept a core busy for
about 40 ms after its run here), runs once untimed, then ``block`` timed calls.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TypeVar

import torch

from opsched.progress import Progress
from opsched.timing import Clock, interleave, median, wall_ms

__all__ = ["race", "fastest"]

K = TypeVar("K")


def race(calls: Mapping[K, Callable[[], object]], *, clock: Clock = wall_ms, rounds: int = 7, warmup: int = 1,
         settle_s: float = 0.05, block: int = 3, progress: Progress | None = None) -> dict[K, float]:
    """Each call's median latency (ms), timed by ``clock`` (to completion, on a GPU), interleaved;
    ``progress`` follows the rounds."""
    def on_round(done: int, total: int) -> None:
        if progress is not None:
            progress(done, total, f"{len(calls)} contenders")
    with torch.no_grad():
        times = interleave(calls, rounds, warmup, clock=clock, settle_s=settle_s, block=block, on_round=on_round)
    return {k: median(v) for k, v in times.items()}


def fastest(calls: Mapping[K, Callable[[], object]], *, clock: Clock = wall_ms, rounds: int = 7,
            progress: Progress | None = None) -> tuple[K, dict[K, float]]:
    """The call that ran fastest in one race, and every call's median."""
    times = race(calls, clock=clock, rounds=rounds, progress=progress)
    return min(times, key=times.__getitem__), times

"""Timing contenders against each other: interleaved rounds in one process, shuffled each round.

Interleaving lets every contender see the same machine (its load, its clock, its caches' wear),
so that ratios from one run compare like with like. But a fixed order does not: a call can
leave the machine worse for whatever follows it. Eager PyTorch leaves its OpenMP workers
spinning after each parallel region; on this project's 2-core machine, whichever call ran next
(always the same one, in a fixed order) took 20% longer (SqueezeNet 1.0 on ONNX Runtime: 12.3
ms after eager PyTorch, 9.8 ms after another session). Shuffling the order each round, with a
seed, spreads such effects over all contenders instead of charging them to one.

Spinning threads also help their own contender: ONNX Runtime's default sessions keep their
idle threads spinning between kernels and for about 40 ms after a run (measured here), which
makes back-to-back calls of one session faster and a call of anything else right after it
slower. ``block`` and ``settle_s`` time that fairly: each contender runs a block of calls in
its turn (the sample is the block's median, after one untimed call), and sleeps ``settle_s``
first, so the last contender's threads have gone idle.

Nor is the machine fair to two searches at once: each would time its plans under the other's
load, and keep those times. :func:`alone` lets one thread of a process measure at a time.
"""

from __future__ import annotations

import contextlib
import logging
import random
import statistics
import threading
import time
from collections.abc import Callable, Collection, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import TypeVar

__all__ = ["Clock", "interleave", "wall_ms", "synchronized", "cuda_events_ms", "median", "paired_ratio", "alone"]

log = logging.getLogger("opsched")

K = TypeVar("K", bound=Hashable)

#: Times one call, in ms.
Clock = Callable[[Callable[[], object]], float]


def wall_ms(call: Callable[[], object]) -> float:
    """The wall-clock time of one call, in ms."""
    start = time.perf_counter()
    call()
    return (time.perf_counter() - start) * 1e3


def synchronized(sync: Callable[[], None]) -> Clock:
    """A wall clock for work that runs asynchronously (a GPU's): ``sync`` before and after, so a
    call is timed to its completion."""
    def clock(call: Callable[[], object]) -> float:
        sync()
        start = time.perf_counter()
        call()
        sync()
        return (time.perf_counter() - start) * 1e3
    return clock


def cuda_events_ms(call: Callable[[], object]) -> float:
    """One call timed by CUDA events on the current stream (GPU time, host overhead excluded
    where the GPU is the bottleneck)."""
    import torch  # only when timing a GPU: this module needs no torch otherwise

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    call()
    end.record()
    end.synchronize()
    return float(start.elapsed_time(end))


def median(samples: Iterable[float]) -> float:
    return statistics.median(samples)


def paired_ratio(a: Sequence[float], b: Sequence[float]) -> float:
    """How many times longer ``a`` took than ``b``: the median, over rounds, of ``a``'s sample
    over ``b``'s from the same round (as :func:`interleave` returns them).

    Load on a shared machine comes and goes over tenths of a second, slowing both contenders of
    a round alike; the ratio within a round cancels it, where the ratio of two medians mixes
    rounds of different load. Two contenders 5% apart, raced under bursts of load on one of two
    cores (7 rounds, ``block`` 3): the paired ratio named the faster in 26 of 30 races, the
    medians in 16 (``benchmarks/race.py``)."""
    if len(a) != len(b) or not a:
        raise ValueError(f"paired samples: two equal, non-empty series, got {len(a)} and {len(b)}")
    return statistics.median(x / y for x, y in zip(a, b))


def interleave(calls: Mapping[K, Callable[[], object]], rounds: int, warmup: int = 2, *,
               clock: Clock = wall_ms, seed: int = 0, settle_s: float = 0.0, block: int = 1,
               on_round: Callable[[int, int], None] | None = None,
               drop: Callable[[Mapping[K, Sequence[float]]], Collection[K]] | None = None) -> dict[K, list[float]]:
    """Run every call once a round, in a fresh (seeded) order each round: ``warmup`` rounds
    untimed, then ``rounds`` timed by ``clock``. With ``block`` > 1 a call's turn is one
    untimed call and ``block`` timed ones, its sample their median; each turn begins with
    ``settle_s`` seconds of sleep (untimed: threads the previous call left spinning go idle).
    Returns each call's samples, one per timed round, in round order (so the k-th samples of
    two calls come from the same round). ``on_round(done, total)`` follows the rounds.

    ``drop``, called after each timed round with the samples of the calls still running (all
    of one length), names calls that run no more: their samples stop there, a prefix of the
    rounds, and once fewer than two calls are left the rounds end."""
    order = list(calls)
    rng = random.Random(seed)
    times: dict[K, list[float]] = {k: [] for k in order}
    for r in range(warmup + rounds):
        rng.shuffle(order)
        for k in order:
            if settle_s:
                time.sleep(settle_s)
            if block > 1:
                calls[k]()
                elapsed = statistics.median(clock(calls[k]) for _ in range(block))
            else:
                elapsed = clock(calls[k])
            if r >= warmup:
                times[k].append(elapsed)
        if r >= warmup and drop is not None:
            gone = drop({k: times[k] for k in order})
            order = [k for k in order if k not in gone]
            if len(order) < 2 and len(order) < len(calls):
                if on_round is not None:
                    on_round(warmup + rounds, warmup + rounds)
                break
        if on_round is not None:
            on_round(r + 1, warmup + rounds)
    return times


#: Held by the thread whose search measures the machine (:func:`alone`).
_MACHINE = threading.RLock()


@contextlib.contextmanager
def alone(what: str, wait: bool = True,
          waiting: Callable[[int, int, str], None] | None = None) -> Iterator[bool]:
    """Hold the machine while ``what`` (a search and its race) measures it: another thread's,
    in this process, waits for its turn, and so measures the machine alone in turn (a search's
    ``budget_s`` counts from its turn), reporting ``waiting(0, 1, ...)`` and then ``(1, 1, ...)``
    (a progress bar). Yields whether the machine is held: without ``wait`` (a thread holding a
    lock that the holder may need) it goes on without it, and says so."""
    held, waited = _MACHINE.acquire(blocking=False), False
    if not held and wait:
        log.info("opsched: %s waits for another thread's search to finish measuring", what)
        if waiting is not None:
            waiting(0, 1, what)
        held = waited = _MACHINE.acquire()
    elif not held:
        log.warning("opsched: %s measures while another thread's search does: each times plans under the other's "
                    "load", what)
    try:
        if waited and waiting is not None:
            waiting(1, 1, what)  # within: the machine is let go whatever the callback does
        yield held
    finally:
        if held:
            _MACHINE.release()

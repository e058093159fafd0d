"""Memory bandwidth of this CPU, measured by copying a working set of a given size.

A copy of ``nbytes`` (half of it read, half written) from a buffer into another, repeated
until a block of copies takes long enough to time, the fastest of a few blocks kept. What a
copy of so many bytes costs beyond a copy of almost nothing (the call itself, measured the
same way) is the time the data took to move; where that is under ten times the call's own
cost, the figure would be mostly noise and none is given.

The working set decides which level of the hierarchy serves the copy: one that fits a core's
L2 runs at L2 speed, one many times the last-level cache at DRAM speed. Which sizes to copy for
which level, and what the figures replace, is :func:`opsched.cost.hierarchy.measured_host_hierarchy`'s
business; this module only times copies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch

log = logging.getLogger(__name__)

__all__ = ["copy_gbps", "copy_seconds"]

#: A block of copies lasts at least this long, so the clock's resolution does not matter.
BLOCK_S = 0.02
#: Blocks timed per size; the fastest is kept (the others met an interruption).
BLOCKS = 5
#: A copy must take this many times a near-empty copy's time to be called a measurement.
SIGNAL = 10.0


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.0f} MiB" if nbytes >= 2**20 else f"{nbytes / 2**10:,.0f} KiB"


@contextmanager
def _threads(n: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def copy_seconds(nbytes: int, threads: int = 1) -> float:
    """Seconds one copy of an ``nbytes`` working set takes on ``threads`` threads (the
    fastest block's mean)."""
    n = max(nbytes // 8, 1)  # float32 elements per buffer: source and destination make nbytes
    src, dst = torch.ones(n), torch.empty(n)
    with _threads(threads):
        dst.copy_(src)  # first touch: pages mapped, caches warm
        reps, spent = 1, 0.0
        while spent < BLOCK_S:
            reps *= 2
            t = time.perf_counter()
            for _ in range(reps):
                dst.copy_(src)
            spent = time.perf_counter() - t
        best = spent / reps
        for _ in range(BLOCKS - 1):
            t = time.perf_counter()
            for _ in range(reps):
                dst.copy_(src)
            best = min(best, (time.perf_counter() - t) / reps)
    return best


def copy_gbps(nbytes: int, threads: int = 1) -> float | None:
    """GB/s a working set of ``nbytes`` moves at (bytes read and written over the copy's time
    beyond a near-empty copy's); None where that time is too small against the call's own, or
    where the buffers cannot be had (a machine short of memory keeps the typical figure)."""
    log.info("measuring memory bandwidth: copies of a %s working set on %d thread(s)", _size(nbytes), threads)
    empty = copy_seconds(64, threads)
    try:
        spent = copy_seconds(nbytes, threads)
    except (MemoryError, RuntimeError) as e:  # torch's allocator raises RuntimeError
        log.warning("cannot measure the bandwidth of a %s working set (%s); keeping the typical figure",
                    _size(nbytes), e)
        return None
    if spent < SIGNAL * empty:
        return None
    return nbytes / (spent - empty) / 1e9

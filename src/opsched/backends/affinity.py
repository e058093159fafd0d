"""Which CPU each intra-op worker thread of an ONNX Runtime session is pinned to.

A session of ``n`` intra-op threads runs on the caller's thread and ``n - 1`` workers. Unpinned,
a worker woken for a kernel may be placed on the caller's core (Linux places a woken thread
near its waker) and wait there for the scheduler's next tick while the caller spins for it:
a 4-7 ms stall in a call of 1.5 ms. A session whose threads stop spinning when a run returns
(``session.force_spinning_stop``, which opsched's sessions set: :mod:`.ort_program`) wakes its
workers at every call, so it meets that often: on this repository's two-core VM, a probe of
PP-LCNet's file in a session of two threads took 2.7 ms per call in median, 6.3 ms at the 90th
percentile; its worker pinned, 1.6 ms and 1.7 ms, as fast as ONNX Runtime's own default session
(which pins its threads where it picks their count itself, and never stops them spinning). In
``benchmarks/onnx_files.py`` opsched's plan of it ran at 0.59x of that session unpinned (at
d2adba7), 0.91x pinned. So each worker
is pinned to a core of its own, one logical processor per physical core, none of them the first
of the cores the process may use (left to the caller).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

__all__ = ["physical_cpus", "worker_affinities"]

_TOPOLOGY = Path("/sys/devices/system/cpu")


@functools.cache
def physical_cpus() -> tuple[int, ...]:
    """One logical processor per physical core among those this process may run on, in order
    (the first of each core's hyper-threads); empty where the topology cannot be read (not
    Linux, no sysfs), as then no pinning can be told to use cores apart."""
    try:
        allowed = sorted(os.sched_getaffinity(0))
        cores: dict[tuple[str, str], int] = {}
        for cpu in allowed:
            topology = _TOPOLOGY / f"cpu{cpu}" / "topology"
            key = ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
            cores.setdefault(key, cpu)
    except (AttributeError, OSError):
        return ()
    return tuple(sorted(cores.values()))


def worker_affinities(threads: int) -> str | None:
    """ONNX Runtime's ``session.intra_op_thread_affinities`` for a session of ``threads`` intra-op
    threads: each of its ``threads - 1`` workers on a physical core of its own, past the first
    (1-based logical processor ids, ``;`` between threads); None where it has no workers or the
    process has too few physical cores for them (nothing is pinned then)."""
    cpus = physical_cpus()
    if threads < 2 or len(cpus) < threads:
        return None
    return ";".join(str(cpu + 1) for cpu in cpus[1:threads])

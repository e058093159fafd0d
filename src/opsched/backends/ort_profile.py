"""Reading ONNX Runtime's own profiler: per run of a session, its kernels and their times.

ONNX Runtime runs convolutions in a blocked layout (NCHWc) and converts tensors into it and back
(``ReorderInput``/``ReorderOutput`` kernels) where a session begins and ends. Its profile is how
the measured cost model tells a stage's kernels from what being a session of its own added, and
how timelines show every kernel, named after the step it computes.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["KernelEvent", "KernelTimes", "LAYOUT_KERNELS", "kernel_events", "kernel_times", "owner",
           "ort_category"]

#: The kernels ORT inserts to move tensors into and out of its blocked layout.
LAYOUT_KERNELS = ("ReorderInput", "ReorderOutput")

#: What ORT's own operator kinds mostly do, for kernels no opsched step owns.
_ORT_CATEGORIES = {
    "Conv": "conv", "FusedConv": "conv", "NchwcConv": "conv", "Gemm": "gemm", "MatMul": "gemm", "FusedGemm": "gemm",
    "MaxPool": "pool", "AveragePool": "pool", "GlobalAveragePool": "reduce", "GlobalMaxPool": "reduce",
    "Add": "elementwise", "Sum": "elementwise", "Mul": "elementwise", "Relu": "activation", "Clip": "activation",
    "Concat": "data", "Split": "data", "Reshape": "view", "Flatten": "view", "Slice": "view", "Identity": "view",
}


def ort_category(op_type: str) -> str:
    return "layout" if op_type in LAYOUT_KERNELS else _ORT_CATEGORIES.get(op_type, "other")


@dataclass(frozen=True, slots=True)
class KernelEvent:
    """One kernel of one run of a profiled session, by ORT's own timing."""

    name: str        # ORT's node name (for opsched's exports, it starts with its step's label)
    op: str          # ORT's operator kind: Conv, MaxPool, ReorderInput...
    start_ms: float  # from the start of the run
    dur_ms: float


@dataclass(frozen=True, slots=True)
class KernelTimes:
    """One run of a profiled session, by ORT's own kernel timings (ms)."""

    compute_ms: float     # every kernel but the layout conversions
    layout_in_ms: float   # conversions into the blocked layout (``ReorderInput``)
    layout_out_ms: float  # conversions out of it (``ReorderOutput``)


def kernel_events(session: Any) -> list[list[KernelEvent]]:
    """End the profiling of a session made to profile itself; per run, in order, its kernels."""
    path = session.end_profiling()
    try:
        with open(path) as f:
            events = json.load(f)
    finally:
        os.remove(path)
    runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    out: list[list[KernelEvent]] = [[] for _ in runs]
    for e in events:
        name = e.get("name", "")
        if e.get("cat") != "Node" or not name.endswith("_kernel_time"):
            continue
        k = bisect.bisect_right(runs, e["ts"]) - 1
        if k >= 0:
            out[k].append(KernelEvent(name.removesuffix("_kernel_time"), e.get("args", {}).get("op_name", ""),
                                      (e["ts"] - runs[k]) / 1e3, e["dur"] / 1e3))
    return out


def kernel_times(session: Any) -> list[KernelTimes]:
    """End the profiling of a session made to profile itself; per run, in order, its kernel
    times. (A layout conversion inside a session, before an operator that has no blocked kernel,
    counts as layout too; in the zoo that is only the classifier's flatten.)"""
    times = []
    for run in kernel_events(session):
        sums = dict.fromkeys(("compute", *LAYOUT_KERNELS), 0.0)
        for e in run:
            sums[e.op if e.op in LAYOUT_KERNELS else "compute"] += e.dur_ms
        times.append(KernelTimes(sums["compute"], *(sums[op] for op in LAYOUT_KERNELS)))
    return times


def owner(name: str, labels: Mapping[str, str]) -> str | None:
    """The step whose label is the longest prefix of an ORT node name (ORT extends the names it
    is given when it fuses or converts nodes)."""
    for cut in range(len(name), 0, -1):
        if name[:cut] in labels:
            return name[:cut]
    return None

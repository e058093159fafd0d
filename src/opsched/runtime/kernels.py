"""Binding plan steps to torch kernels: what the torch backends (CPU and CUDA) and the
reference interpreter run. Each op's kernel is its family's (:mod:`opsched.ir.ops`); binding happens
once, when an executor is prepared, so the per-call loop does no lookups or dispatch on strings."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from opsched.ir import Graph
from opsched.ir.ops import Kernel, torch_kernel
from opsched.ir.ops.conv import merged_kernel
from opsched.runtime.plan import Step

__all__ = ["step_kernel", "bind_step"]


def step_kernel(graph: Graph, step: Step) -> Kernel:
    """The step's torch call: its node's kernel, or the merged convolution (weights built now)."""
    if step.merged:
        return merged_kernel(graph, step.nodes)
    return torch_kernel(graph, graph.node(step.nodes[0]))


def bind_step(graph: Graph, step: Step, release: bool = True) -> Callable[[list[Any]], None]:
    """``step`` as a call on a run's slot list: read its inputs, write its outputs and, with
    ``release``, drop the slots that die right after it (an executor that releases slots itself,
    as the CUDA one does, passes ``False``)."""
    kernel, ins, outs = step_kernel(graph, step), step.inputs, step.outputs
    frees = step.frees if release else ()
    if len(outs) == 1:
        (o,) = outs

        def run(slots: list[Any]) -> None:
            slots[o] = kernel(*[slots[i] for i in ins])
            for f in frees:
                slots[f] = None
    else:
        def run(slots: list[Any]) -> None:
            for slot, value in zip(outs, kernel(*[slots[i] for i in ins])):
                slots[slot] = value
            for f in frees:
                slots[f] = None
    return run

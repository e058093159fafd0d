"""The torch CPU backend: every step a torch kernel call, lanes on CPU threads."""

from __future__ import annotations

from opsched.backends.base import CpuBackend, Executor, register_backend
from opsched.backends.lanes import LaneExecutor, torch_program
from opsched.execution import RunOptions
from opsched.ir import Graph
from opsched.runtime import Plan

__all__ = ["TorchCpuBackend"]


class TorchCpuBackend(CpuBackend):
    """Eager torch kernels; it runs every op (each op's family has a torch kernel)."""

    name = "torch"

    def prepare(self, graph: Graph, plan: Plan, run: RunOptions) -> Executor:
        return LaneExecutor(torch_program(graph, plan), run.cores, self.name)


register_backend(TorchCpuBackend())

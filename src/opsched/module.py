"""ScheduledModule: a drop-in ``nn.Module`` that runs a graph by its schedule."""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from opsched.backends import Backend, Executor, resolve_backend
from opsched.errors import OpschedError
from opsched.execution import RunOptions
from opsched.ir import Graph
from opsched.report import OptimizeOutcome, OptimizeReport, ScheduleSummary
from opsched.runtime import Plan, check_inputs, lower
from opsched.schedule import Schedule
from opsched.timeline import TraceEvent

__all__ = ["ScheduledModule"]


class ScheduledModule(nn.Module):
    """Returns exactly what the original model returns, computed by the schedule's plan.

    ``schedule`` is the schedule it runs, ``plan`` its lowering, ``backend`` the backend whose
    kernels run it; ``report()`` says what it is and how it was found; ``save(path)`` writes the
    schedule as JSON, to be reapplied with :func:`opsched.load`. Inputs must match the example
    inputs' shapes and dtypes (the schedule is specialised to them).
    """

    def __init__(self, graph: Graph, schedule: Schedule, *, backend: str | Backend = "auto",
                 device: str | torch.device = "cpu", graphs: bool = True, channels_last: bool = False,
                 single_output: bool = True, outcome: OptimizeOutcome | None = None) -> None:
        super().__init__()
        self.graph = graph
        self.schedule = schedule
        self.run = RunOptions(torch.device(device), None, graphs, channels_last, spin=True)
        self.backend: Backend = (resolve_backend(backend, self.run.device) if isinstance(backend, str) else backend)
        self.plan: Plan = lower(graph, schedule)
        for lane in schedule.lanes:
            if lane.backend not in (None, self.backend.name) or lane.device not in (None, str(self.run.device)):
                raise OpschedError(f"schedule of {graph.name!r} places a lane on {lane.device or 'the module device'}"
                                   f" with backend {lane.backend}: this module runs every lane on "
                                   f"{self.run.device} with {self.backend.name}")
        self._executor: Executor = self.backend.prepare(graph, self.plan, self.run)
        self._single = single_output and len(graph.outputs) == 1
        self.outcome = outcome or OptimizeOutcome()

    @property
    def device(self) -> torch.device:
        return self.run.device

    def forward(self, *inputs: torch.Tensor) -> Any:
        check_inputs(self.graph, inputs)
        outputs = self._executor(inputs)
        return outputs[0] if self._single else tuple(outputs)

    def profile(self, *inputs: torch.Tensor) -> list[TraceEvent]:
        """Run once, recording when each step ran on which lane (on ONNX Runtime, each kernel of
        each segment, by ORT's own profiler)."""
        check_inputs(self.graph, inputs)
        return self._executor.trace(inputs)

    def save(self, path: str | os.PathLike[str]) -> None:
        self.schedule.save(path)

    def report(self) -> OptimizeReport:
        s = self.schedule
        return OptimizeReport(self.graph.name, len(self.graph.nodes), s.batch, s.device, self.backend.name,
                              self._executor.describe(), ScheduleSummary.of(s, self.plan), self.outcome)

    def __del__(self) -> None:
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.close()

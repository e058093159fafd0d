"""ScheduledModule: a drop-in ``nn.Module`` that runs a graph by its schedule."""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from opsched.backends import Backend, Executor, get_backend, resolve_backend
from opsched.errors import InputMismatchError, OpschedError
from opsched.execution import RunOptions
from opsched.ir import Graph
from opsched.report import OptimizeOutcome, OptimizeReport, ScheduleSummary
from opsched.runtime import Plan, check_inputs, lower_instances
from opsched.schedule import Schedule
from opsched.timeline import TraceEvent

__all__ = ["ScheduledModule", "OutputStructure"]


@dataclass(frozen=True)
class OutputStructure:
    """How a model's outputs nest (tuples, lists, dicts, dataclass outputs: its pytree), which of
    its leaves are the graph's outputs, in order, and what the others are (constants such as None)."""

    spec: pytree.TreeSpec
    slots: tuple[int | None, ...]  # per leaf: the graph output it is, or None for a constant
    constants: tuple[Any, ...]     # per leaf: the constant (None where the leaf is a graph output)

    @classmethod
    def of(cls, example: Any) -> OutputStructure:
        """The structure of a model's output ``example`` (its tensors are the graph's outputs)."""
        leaves, spec = pytree.tree_flatten(example)
        slots, k = [], 0
        for leaf in leaves:
            slots.append(k if isinstance(leaf, torch.Tensor) else None)
            k += isinstance(leaf, torch.Tensor)
        return cls(spec, tuple(slots), tuple(None if isinstance(x, torch.Tensor) else x for x in leaves))

    @classmethod
    def flat(cls, n: int) -> OutputStructure:
        """One tensor, or (for ``n`` other than 1) a tuple of ``n``: a graph's outputs as they are."""
        dummy = torch.empty(0)
        return cls.of(dummy if n == 1 else tuple(dummy for _ in range(n)))

    @property
    def tensors(self) -> int:
        return sum(s is not None for s in self.slots)

    def build(self, outputs: Sequence[torch.Tensor]) -> Any:
        if self._plain is not None:  # one tensor, or a tuple of them in order: no tree to rebuild
            return outputs[0] if self._plain else tuple(outputs)
        leaves = [c if s is None else outputs[s] for s, c in zip(self.slots, self.constants)]
        return pytree.tree_unflatten(leaves, self.spec)

    @functools.cached_property
    def _plain(self) -> bool | None:
        """True where the output is the one graph output, False where it is a tuple of every graph
        output in order, None where the tree must be rebuilt (a call costs microseconds less)."""
        in_order = self.slots == tuple(range(len(self.slots)))
        if in_order and self.spec.is_leaf():
            return True
        if in_order and self.spec.type is tuple and all(c.is_leaf() for c in self.spec.children()):
            return False
        return None


class ScheduledModule(nn.Module):
    """Returns exactly what the original model returns, computed by the schedule's plan.

    ``schedule`` is the schedule it runs, ``plan`` its lowering, ``graph`` what the plan computes
    (for a schedule with splits, the graph with its instances), ``backend`` the backend whose
    kernels run it; ``report()`` says what it is and how it was found; ``save(path)`` writes the
    schedule as JSON, to be reapplied with :func:`opsched.load`. Inputs must match the example
    inputs' shapes and dtypes (the schedule is specialised to them).
    """

    def __init__(self, graph: Graph, schedule: Schedule, *, backend: str | Backend = "auto",
                 device: str | torch.device = "cpu", graphs: bool = True, channels_last: bool = False,
                 outputs: OutputStructure | None = None, outcome: OptimizeOutcome | None = None) -> None:
        super().__init__()
        plan: Plan
        graph, plan = lower_instances(graph, schedule)  # graph: what the plan's steps compute
        self.plan = plan
        self.graph = graph
        self.schedule = schedule
        placed = schedule.options.get("platform")
        self.run = RunOptions(torch.device(device), None, graphs, channels_last, spin=True, platform=placed)
        if placed is not None:  # lanes on the units of a platform
            backend = get_backend("units")
        self.backend: Backend = (resolve_backend(backend, self.run.device) if isinstance(backend, str) else backend)
        for lane in () if placed is not None else schedule.lanes:
            if lane.backend not in (None, self.backend.name) or lane.device not in (None, str(self.run.device)):
                raise OpschedError(f"schedule of {graph.name!r} places a lane on {lane.device or 'the module device'}"
                                   f" with backend {lane.backend}: this module runs every lane on "
                                   f"{self.run.device} with {self.backend.name}")
        self._executor: Executor = self.backend.prepare(graph, self.plan, self.run)
        self.outputs = outputs or OutputStructure.flat(len(graph.outputs))
        if self.outputs.tensors != len(graph.outputs):
            raise OpschedError(f"the output structure holds {self.outputs.tensors} tensors, but graph {graph.name!r} "
                               f"has {len(graph.outputs)} outputs")
        self.outcome = outcome or OptimizeOutcome()

    @property
    def device(self) -> torch.device:
        return self.run.device

    @property
    def executor(self) -> Executor:
        """The plan bound to the backend's kernels (its ``describe()`` says how it runs)."""
        return self._executor

    def forward(self, *inputs: torch.Tensor) -> Any:
        check_inputs(self.graph, inputs)
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            raise InputMismatchError(
                f"a scheduled module of {self.graph.name!r} is for inference: it computes no gradients, and an input "
                f"requires one; call it under torch.no_grad() or torch.inference_mode(), or detach the input")
        return self.outputs.build(self._executor(inputs))

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
                              self._executor.describe(), ScheduleSummary.of(s, self.plan), self.outcome,
                              self.peak_bytes)

    @property
    def peak_bytes(self) -> int:
        """The plan's peak of live activations (inputs, outputs, intermediates) in bytes; an
        upper bound where lanes run at once (:meth:`opsched.runtime.Plan.peak_bytes`)."""
        types = self.graph.types
        return self.plan.peak_bytes([types[name].nbytes for name in self.plan.slot_names])

    def __del__(self) -> None:
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.close()

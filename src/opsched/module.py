"""ScheduledModule: a drop-in ``nn.Module`` that runs a graph by its schedule."""

from __future__ import annotations

import copy
import functools
import os
import pickle
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch._subclasses.fake_tensor import is_fake
from torch.fx.proxy import TraceError

from opsched.backends import Backend, Executor, get_backend, resolve_backend
from opsched.cost.units import platform
from opsched.errors import InputMismatchError, OpschedError
from opsched.execution import RunOptions
from opsched.ir import Graph
from opsched.report import OptimizeOutcome, OptimizeReport, ScheduleSummary
from opsched.runtime import Plan, check_inputs, lower_instances
from opsched.schedule import Schedule
from opsched.structure import InputStructure, OutputStructure
from opsched.timeline import TraceEvent

__all__ = ["ScheduledModule", "InputStructure", "OutputStructure"]


def _cores(schedule: Schedule, device: torch.device) -> int | None:
    """The CPU cores ``schedule``'s plan runs on here: as many as it says, where this machine gives
    torch as many; None for all of them (its own default, and on a GPU)."""
    return None if schedule.cores is None or device.type != "cpu" else min(schedule.cores, torch.get_num_threads())


class ScheduledModule(nn.Module):
    """Returns exactly what the original model returns, computed by the schedule's plan.

    ``schedule`` is the schedule it runs, ``plan`` its lowering, ``graph`` what the plan computes
    (for a schedule with splits, the graph with its instances), ``backend`` the backend whose
    kernels run it; ``report()`` says what it is and how it was found; ``save(path)`` writes the
    schedule as JSON, to be reapplied with :func:`opsched.load`. It is called as the model was
    with the example inputs (``inputs``: by position or by name, tensors in the same places),
    with tensors of the example inputs' shapes and dtypes (the schedule is specialised to them);
    a module made from a graph takes the graph's inputs, by position or by their names.
    """

    def __init__(self, graph: Graph, schedule: Schedule, *, backend: str | Backend = "auto",
                 device: str | torch.device = "cpu", graphs: bool = True, channels_last: bool = False,
                 inputs: InputStructure | None = None, outputs: OutputStructure | None = None,
                 outcome: OptimizeOutcome | None = None) -> None:
        super().__init__()
        plan: Plan
        graph, plan = lower_instances(graph, schedule)  # graph: what the plan's steps compute
        self.plan = plan
        self.graph = graph
        self.schedule = schedule
        placed = schedule.options.get("platform")
        self.run = RunOptions(torch.device(device), _cores(schedule, torch.device(device)), graphs, channels_last,
                              spin=True, platform=placed)
        if placed is not None:  # lanes on the units of a platform
            _on_the_host(graph, placed, self.run.device)
            backend = get_backend("units")
        elif backend == "auto" and len(named := {lane.backend or "" for lane in schedule.lanes} - {""}) == 1:
            backend = named.pop()  # the backend the schedule was kept on (optimize()'s race)
        self.backend: Backend = (resolve_backend(backend, self.run.device, graph.dtypes) if isinstance(backend, str)
                                 else backend)
        for lane in () if placed is not None else schedule.lanes:
            if lane.backend not in (None, self.backend.name) or lane.device not in (None, str(self.run.device)):
                raise OpschedError(f"schedule of {graph.name!r} places a lane on {lane.device or 'the module device'}"
                                   f" with backend {lane.backend}: this module runs every lane on "
                                   f"{self.run.device} with {self.backend.name}")
        self._executor: Executor = self.backend.prepare(graph, self.plan, self.run)
        self.inputs = inputs or InputStructure.positional([i.name for i in graph.inputs], graph.fixed_inputs)
        if len(self.inputs.names) != len(graph.inputs):
            raise OpschedError(f"the call {self.inputs.describe()} passes {len(self.inputs.names)} tensors, but graph "
                               f"{graph.name!r} has {len(graph.inputs)} inputs")
        self.outputs = outputs or OutputStructure.flat(len(graph.returns))
        if self.outputs.tensors != len(graph.returns):
            raise OpschedError(f"the output structure holds {self.outputs.tensors} tensors, but graph {graph.name!r} "
                               f"returns {len(graph.returns)}")
        self.outcome = outcome or OptimizeOutcome()

    @property
    def device(self) -> torch.device:
        return self.run.device

    @property
    def executor(self) -> Executor:
        """The plan bound to the backend's kernels (its ``describe()`` says how it runs)."""
        return self._executor

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        try:
            inputs = self.inputs.tensors(args, kwargs)
        except TraceError as e:  # torch.fx's proxies in place of the arguments
            raise self._untraceable("torch.fx") from e
        if not self._fit(inputs):
            if any(is_fake(t) for t in inputs if isinstance(t, torch.Tensor)):
                raise self._untraceable("torch.export")
            check_inputs(self.graph, inputs)  # raises, naming the input and what was expected
        if torch.jit.is_tracing():  # type: ignore[attr-defined,no-untyped-call]  # documented, untyped
            raise self._untraceable("torch.jit.trace")
        if torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
            raise InputMismatchError(
                f"a scheduled module of {self.graph.name!r} is for inference: it computes no gradients, and an input "
                f"requires one; call it under torch.no_grad() or torch.inference_mode(), or detach the input")
        results = self._executor(inputs)
        if self.graph.writes:
            results = self._write(inputs, results)
        call = self.inputs.canonical(args, kwargs) if self.outputs.returned else None
        return self.outputs.build(results, inputs, call)

    def _apply(self, fn: Any, recurse: bool = True) -> ScheduledModule:
        """What ``.to()``, ``.half()``, ``.cuda()`` and their kin do to a module: here, nothing,
        where they would change neither the device nor a type its plan runs in (``.to("cpu")`` of
        a module on the CPU); else a refusal saying how to get that module, as the plan (its
        sessions, its captured graph, its measured schedule) was made for them, and silently
        left as it is, the module would refuse every call in the new types instead."""
        floating = sorted(d for d in self.graph.dtypes if getattr(torch, d).is_floating_point) or ["float32"]
        for dtype in floating:
            probe = torch.empty(0, dtype=getattr(torch, dtype), device=self.device)
            moved = fn(probe)
            if moved.device != probe.device or moved.dtype != probe.dtype:
                target = str(moved.dtype).removeprefix("torch.")
                raise OpschedError(
                    f"this scheduled module of {self.graph.name!r} runs on {self.device} in {', '.join(floating)}, the "
                    f"device and types its plan was made for: for {moved.device} in {target}, optimize the model "
                    f"again with device={moved.device.type!r}, dtype={target!r}")
        return self

    def _write(self, inputs: Sequence[torch.Tensor], results: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copy the new values of the inputs the model changes in place into the caller's
        tensors (the trailing results, :attr:`Graph.writes`); the others are what it returns."""
        returned = len(self.graph.returns)
        with torch.no_grad():
            for k, value in zip(self._written, results[returned:]):
                inputs[k].copy_(value)
        return results[:returned]

    def _fit(self, inputs: Sequence[Any]) -> bool:
        """Whether ``inputs`` are plain tensors of the graph's inputs' shapes and dtypes, in three
        compares each (:func:`~opsched.runtime.check_inputs` spells out what is wrong where they
        are not; a subclass, a tracer's own, is looked at there)."""
        expected = self._expected
        return len(inputs) == len(expected) and all(
            type(t) is torch.Tensor and t.shape == shape and t.dtype == dtype
            for t, (shape, dtype) in zip(inputs, expected))

    def _untraceable(self, tracer: str) -> OpschedError:
        """Why ``tracer`` cannot take this module: no tracer sees into its plan's sessions or
        graphs, so a trace would hold one call's outputs as constants (torch.jit.trace's did,
        warning only of a conversion to NumPy)."""
        return OpschedError(
            f"{tracer} cannot trace this scheduled module of {self.graph.name!r}: its plan runs on "
            f"{self.backend.name}'s kernels, which no tracer sees into (a trace would hold one call's outputs as "
            f"constants); trace, export or compile the original model instead, and keep this module with "
            f"torch.save(module) or its schedule with module.save(path) (torch.compile of a model holding it "
            f"runs it between the graphs it compiles)")

    @functools.cached_property
    def _expected(self) -> tuple[tuple[torch.Size, torch.dtype], ...]:
        """Per graph input, its shape and torch dtype (found once, not per call)."""
        return tuple((torch.Size(i.type.shape), getattr(torch, i.type.dtype)) for i in self.graph.inputs)

    @functools.cached_property
    def _written(self) -> tuple[int, ...]:
        """Per write of the graph, the position of the input it writes (found once, not per call)."""
        index = {i.name: k for k, i in enumerate(self.graph.inputs)}
        return tuple(index[name] for name in self.graph.writes)

    def profile(self, *args: Any, **kwargs: Any) -> list[TraceEvent]:
        """Run once on the arguments ``forward`` takes, recording when each step ran on which lane
        (on ONNX Runtime, each kernel of each segment, by ORT's own profiler)."""
        inputs = self.inputs.tensors(args, kwargs)
        check_inputs(self.graph, inputs)
        return self._executor.trace(inputs)

    def save(self, path: str | os.PathLike[str]) -> None:
        self.schedule.save(path)

    def report(self) -> OptimizeReport:
        s = self.schedule
        fixed = ", ".join(map(str, self.graph.fixed_inputs))
        return OptimizeReport(self.graph.name, len(self.graph.nodes), s.batch, s.device, self.backend.name,
                              self._executor.describe(), ScheduleSummary.of(s, self.plan), self.outcome,
                              self.peak_bytes, fixed)

    @property
    def peak_bytes(self) -> int:
        """The plan's peak of live activations (inputs, outputs, intermediates) in bytes; an
        upper bound where lanes run at once (:meth:`opsched.runtime.Plan.peak_bytes`)."""
        types = self.graph.types
        return self.plan.peak_bytes([types[name].nbytes for name in self.plan.slot_names])

    def on_backend(self, backend: str | Backend) -> ScheduledModule:
        """This module's plan run on ``backend``'s kernels (``"torch"``, ``"ort"``, ...) instead:
        the same schedule, its lanes naming the new backend, the graph and weights shared."""
        be = resolve_backend(backend, self.run.device, self.graph.dtypes) if isinstance(backend, str) else backend
        state = {k: dict(v) if isinstance(v, dict) else v for k, v in self._state().items()}  # nn.Module's own
        state.update(backend=be, schedule=self.schedule.on_backend(be.name))
        moved = type(self).__new__(type(self))
        moved.__setstate__(state)
        return moved

    def __getstate__(self) -> dict[str, Any]:
        """Everything but the executor (ONNX Runtime sessions, threads, CUDA graphs, none of which
        pickle): a module saved whole (``torch.save``) binds its plan to the backend's kernels
        again when it is loaded. Opaque nodes' Python callables must pickle too."""
        for name, fn in self.graph.callables.items():
            try:
                pickle.dumps(fn)
            except Exception as e:
                raise OpschedError(
                    f"cannot pickle this module of {self.graph.name!r}: node {name!r} (opaque) runs a Python callable "
                    f"that does not pickle ({type(e).__name__}: {e}); save its schedule with module.save(path) and "
                    f"reapply it with opsched.load(model, path, example_inputs)") from e
        return self._state()

    def _state(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_executor"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # type: ignore[no-untyped-call]  # nn.Module fills fields of older versions
        self._executor = self.backend.prepare(self.graph, self.plan, self.run)

    def __deepcopy__(self, memo: dict[int, Any]) -> ScheduledModule:
        """A copy with its own executor (callables are shared, as ``copy.deepcopy`` shares functions)."""
        copied = type(self).__new__(type(self))
        memo[id(self)] = copied
        copied.__setstate__(copy.deepcopy(self._state(), memo))
        return copied

    def __del__(self) -> None:
        executor = getattr(self, "_executor", None)
        if executor is not None:
            executor.close()


def _on_the_host(graph: Graph, placed: str, device: torch.device) -> None:
    """A placed plan's inputs and outputs live on its platform's default unit: a module of it is
    made on that unit's device (it takes and returns tensors there, whatever units it uses)."""
    p = platform(placed)
    host = torch.device(p.unit(p.default).device or "cpu")
    if device != host:
        raise OpschedError(f"the schedule of {graph.name!r} places its lanes on the units of platform {p.name!r}, "
                           f"whose default unit {p.default!r} holds the inputs and outputs on {host}; make its module "
                           f"with device={str(host)!r} (got {str(device)!r}): the lanes still run on every unit")

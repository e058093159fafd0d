"""The user-facing entry points: :func:`optimize`, :func:`optimize_graph` and :func:`load`."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn

from opsched.backends import Backend, resolve_backend
from opsched.check import placed_inputs, verify_against
from opsched.cost import AnalyticCostModel, CostModel, MeasuredCostModel, ProfileStore, host_cpu_spec
from opsched.errors import OpschedError, ScheduleError
from opsched.execution import RunOptions
from opsched.frontends import from_torch
from opsched.ir import Graph, random_inputs
from opsched.module import ScheduledModule
from opsched.race import fastest
from opsched.report import OptimizeOutcome, RaceResult, ScheduleSummary
from opsched.schedule import Schedule
from opsched.schedulers import Progress, make_options, schedule, spec
from opsched.schedulers.registry import RENAMED
from opsched.transforms.place import place

__all__ = ["optimize", "optimize_graph", "load", "host_cpu_model", "measured_cost", "placed_inputs",
           "scheduler_options"]

log = logging.getLogger(__name__)

DEVICES = ("cpu", "cuda")


def host_cpu_model() -> AnalyticCostModel:
    """The analytic CPU preset with this machine's core count."""
    return AnalyticCostModel(host_cpu_spec())


def _inputs(example_inputs: Sequence[torch.Tensor] | torch.Tensor) -> tuple[torch.Tensor, ...]:
    return (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)


def _device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in DEVICES:
        raise OpschedError(f"device {device!r} is not supported by this opsched; supported: {', '.join(DEVICES)}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OpschedError(f"device {device!r}: CUDA is not available on this machine (torch {torch.__version__}, "
                           f"torch.cuda.is_available() is False)")
    return dev


def optimize(model: nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor, *,
             device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None, channels_last: bool = False,
             graphs: bool = True, scheduler: str | Sequence[str] = "ios", cost: str | CostModel = "measured",
             backend: str = "auto", cache_dir: str | None = None, verify: bool = True,
             progress: Progress | None = None, **options: Any) -> ScheduledModule:
    """Import ``model``, search a schedule, and return a module that runs it.

    ``scheduler`` names a scheduler, or several: ``("ios", "est")`` makes the dynamic
    program's schedule and the list scheduler's, races their plans end to end and keeps the
    faster (neither wins everywhere). Each option goes to the schedulers that take it
    (:func:`scheduler_options` lists them); on a CPU, ``max_lanes`` defaults to the number of
    cores.

    ``cost`` is ``"measured"`` (stages timed on this machine by the backend, remembered in the
    profile store under ``cache_dir``), ``"analytic"`` (the analytic model of this device:
    instant, approximate) or any :class:`~opsched.cost.CostModel`. ``backend`` runs the plan's
    kernels: on a CPU ``"ort"`` (ONNX Runtime sessions per lane segment; the fast CPU kernels),
    ``"torch"``, or ``"auto"`` (ORT when installed); on a GPU ``"cuda"``.

    ``device="cuda"`` runs the plan's lanes on CUDA streams, captured into one CUDA graph
    (``graphs=False``: eagerly on the streams). ``dtype`` (``"float16"``, ``"bfloat16"``, ...)
    and ``channels_last`` place the model's weights: the returned module then behaves like
    ``model.to(device, dtype)`` and takes inputs on that device in that precision (the schedule
    is specialised to them). ``progress(done, total, text)`` follows a long search. With
    ``verify`` the result is checked against the model once.
    """
    dev = _device(device)
    inputs = _inputs(example_inputs)
    model = model.eval()
    start = time.perf_counter()
    graph = from_torch(model, inputs)
    module = optimize_graph(graph, device=dev, dtype=dtype, channels_last=channels_last, graphs=graphs,
                            scheduler=scheduler, cost=cost, backend=backend, cache_dir=cache_dir,
                            single_output=_single_output(model, inputs), progress=progress, **options)
    module.outcome = _with_seconds(module.outcome, time.perf_counter() - start)
    if verify:
        verify_against(module, module.graph, module.device, model, inputs)
    return module


def scheduler_options(names: Sequence[str], device_type: str, values: Mapping[str, Any],
                      cores: int | None = None) -> dict[str, Any]:
    """Each scheduler's options dataclass: its device defaults, overridden by the ``values`` it
    takes. An option no scheduler of ``names`` takes is an error naming what each one takes."""
    if not names:
        raise ScheduleError("scheduler: name at least one scheduler")
    cores = cores or os.cpu_count() or 1
    takes = {name: {f.name for f in dataclasses.fields(spec(name).options)} for name in names}
    unknown = sorted(k for k in values if not any(k in t for t in takes.values()))
    if unknown:
        hints = [f"{k!r} (renamed {RENAMED[k]!r})" if k in RENAMED else repr(k) for k in unknown]
        listing = "; ".join(f"{name} takes {sorted(t) or 'none'}" for name, t in takes.items())
        raise ScheduleError(f"no scheduler of {list(names)} has option {', '.join(hints)} ({listing})")
    out = {}
    for name in names:
        chosen = {k: v for k, v in spec(name).defaults(device_type, cores).items() if k in takes[name]}
        chosen.update((k, v) for k, v in values.items() if k in takes[name])
        out[name] = make_options(name, chosen)
    return out


def measured_cost(device: str | torch.device = "cpu", *, backend: str | Backend = "auto",
                  store: ProfileStore | None = None, cores: int | None = None,
                  channels_last: bool = False) -> MeasuredCostModel:
    """The measured cost model of ``backend`` on ``device`` (its stages timed as the plans will
    run: on ``cores`` threads, in channels-last layout), its figures kept in ``store``."""
    dev = _device(device)
    be = resolve_backend(backend, dev) if isinstance(backend, str) else backend
    return MeasuredCostModel(be, RunOptions(dev, cores, channels_last=channels_last), store=store)


def _cost_model(cost: str | CostModel, backend: Backend, run: RunOptions, cache_dir: str | None,
                stack: contextlib.ExitStack) -> CostModel:
    if not isinstance(cost, str):
        return cost
    if cost == "analytic":
        return AnalyticCostModel(backend.analytic_spec(run))
    if cost == "measured":
        store = stack.enter_context(ProfileStore(cache_dir))
        return measured_cost(run.device, backend=backend, store=store, cores=run.cores,
                             channels_last=run.channels_last)
    raise OpschedError(f"cost must be 'measured', 'analytic' or a CostModel, got {cost!r}")


def optimize_graph(graph: Graph, *, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                   channels_last: bool = False, graphs: bool = True, scheduler: str | Sequence[str] = "ios",
                   cost: str | CostModel = "measured", backend: str = "auto", cache_dir: str | None = None,
                   single_output: bool = True, check: bool = True, progress: Progress | None = None,
                   **options: Any) -> ScheduledModule:
    """:func:`optimize` for an imported graph (from :func:`opsched.from_onnx`, say).

    With ``check`` and a measured cost model, the plan also races the sequential one (stage
    prices were taken in isolation) and the faster is kept; with several schedulers, their
    plans race whatever the cost model. ``module.report()`` gives every contender's median and
    which was kept."""
    start = time.perf_counter()
    dev = _device(device)
    be = resolve_backend(backend, dev)
    names = [scheduler] if isinstance(scheduler, str) else list(scheduler)
    for name in names:
        spec(name)  # an unknown name fails before any work
    per_scheduler = scheduler_options(names, dev.type, options)
    graph = place(graph, dev, dtype, channels_last)
    run = RunOptions(dev, None, graphs, channels_last, spin=True)
    with contextlib.ExitStack() as stack:
        cost_model = _cost_model(cost, be, run, cache_dir, stack)
        made = {name: schedule(graph, name, cost_model, per_scheduler[name], progress=progress) for name in names}
        measured = isinstance(cost_model, MeasuredCostModel)
        if check and measured and "sequential" not in made:
            made["sequential"] = schedule(graph, "sequential", cost_model)
        modules = {name: ScheduledModule(graph, s, backend=be, device=dev, graphs=graphs, channels_last=channels_last,
                                         single_output=single_output) for name, s in made.items()}
        race = None
        if len(modules) > 1:
            inputs = tuple(random_inputs(graph, dev))
            kept, times = fastest({name: functools.partial(m, *inputs) for name, m in modules.items()},
                                  clock=be.clock(run))
            race = RaceResult(times, kept)
        else:
            kept = names[0]
        module = modules[kept]
        searched = tuple(ScheduleSummary.of(m.schedule, m.plan) for name, m in modules.items()
                         if name != kept and name in names and m.schedule.stats)
        counts = cost_model.counts if isinstance(cost_model, MeasuredCostModel) else None
        module.outcome = OptimizeOutcome(race, searched, counts, time.perf_counter() - start)
    return module


def _with_seconds(outcome: OptimizeOutcome, seconds: float) -> OptimizeOutcome:
    return OptimizeOutcome(outcome.race, outcome.searched, outcome.measurements, seconds)


def _single_output(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> bool:
    with torch.no_grad():
        return isinstance(model(*inputs), torch.Tensor)


def load(model: nn.Module, path: str | os.PathLike[str], example_inputs: Sequence[torch.Tensor] | torch.Tensor,
         *, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None, channels_last: bool = False,
         graphs: bool = True, backend: str = "auto") -> ScheduledModule:
    """Reapply a schedule saved by :meth:`ScheduledModule.save` to ``model``.

    The model is imported again with ``example_inputs`` and placed as given; a schedule made for
    another model, batch size, input shape or precision is refused with
    :class:`~opsched.errors.ScheduleMismatchError`. One made on another device runs (schedules
    travel), with a warning: it was tuned for that device.
    """
    dev = _device(device)
    inputs = _inputs(example_inputs)
    graph = place(from_torch(model.eval(), inputs), dev, dtype, channels_last)
    sched = Schedule.load(path).validate(graph)
    module = ScheduledModule(graph, sched, backend=backend, device=dev, graphs=graphs, channels_last=channels_last,
                             single_output=_single_output(model, inputs))
    here = torch.cuda.get_device_name(dev) if dev.type == "cuda" else ""
    if here and sched.device and here not in sched.device:
        log.warning("schedule %s was made for %s; running it on %s", path, sched.device, here)
    return module

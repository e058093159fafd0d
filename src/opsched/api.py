"""The user-facing entry points: :func:`optimize` and :func:`load`."""

from __future__ import annotations

import contextlib
import copy
import logging
import os
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from opsched.cost import AnalyticCostModel, CostModel
from opsched.cost.cached import StoredCostModel
from opsched.cost.devices import host_cpu_spec
from opsched.cost.measured import MeasuredCostModel, random_inputs
from opsched.cost.store import ProfileStore
from opsched.errors import ExecutionError, OpschedError, ScheduleError
from opsched.frontends import from_torch
from opsched.ir import Graph
from opsched.runtime.module import ScheduledModule
from opsched.schedule import schedule as run_scheduler
from opsched.schedule import scheduler_options
from opsched.schedule.types import Schedule
from opsched.testing import tolerance
from opsched.timing import interleave
from opsched.transforms.place import place

__all__ = ["optimize", "optimize_graph", "load", "host_cpu_model", "race", "placed_inputs"]

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
    except RuntimeError:
        dev = None
    if dev is None or dev.type not in DEVICES:
        raise OpschedError(f"device {device!r} is not supported by this opsched; supported: {', '.join(DEVICES)}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OpschedError(f"device {device!r}: CUDA is not available on this machine (torch {torch.__version__}, "
                           f"torch.cuda.is_available() is False)")
    return dev


def placed_inputs(graph: Graph, inputs: Sequence[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, ...]:
    """``inputs`` moved to ``device`` and cast to ``graph``'s input dtypes (after :func:`place`)."""
    return tuple(t.to(device, getattr(torch, i.type.dtype)) for i, t in zip(graph.inputs, inputs))


def _verify(module: ScheduledModule, model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
    placed = placed_inputs(module.graph, inputs, module.device)
    if any(p.dtype != t.dtype or p.device != t.device for p, t in zip(placed, inputs)):  # compare like with like
        model, inputs = copy.deepcopy(model).to(module.device, placed[0].dtype), placed
    with torch.no_grad():
        expected = model(*inputs)
        actual = module(*inputs)
    exp = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    act = [actual] if isinstance(actual, torch.Tensor) else list(actual)
    for i, (a, e) in enumerate(zip(act, exp)):
        tol = tolerance(e)
        err = float((a - e).abs().max())
        if err > tol:
            raise ExecutionError(f"the scheduled module's output {i} differs from the model's by {err:.3g} "
                                 f"(tolerance {tol:.3g}); please report this with the model")


def optimize(model: nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor, *,
             device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None, channels_last: bool = False,
             graphs: bool = True, scheduler: str | Sequence[str] = "ios", cost: str | CostModel = "measured",
             backend: str = "auto", cache_dir: str | None = None, verify: bool = True,
             **options: Any) -> ScheduledModule:
    """Import ``model``, search a schedule, and return a module that runs it.

    ``scheduler`` names a scheduler, or several: ``("ios", "est")`` makes the dynamic
    program's schedule and the list scheduler's, races their plans end to end and keeps the
    faster (neither wins everywhere: on an H100, est's barrier-free lanes ran NASNet 17%
    faster than the DP's stages, the DP's stages GoogLeNet 27% faster than est's lanes).
    Each option goes to the schedulers that take it.

    ``cost`` is ``"measured"`` (stages timed on this machine, remembered in the profile store
    under ``cache_dir``), ``"analytic"`` (the analytic model of this CPU: instant, approximate)
    or any :class:`~opsched.cost.CostModel`. On a CPU, ``max_groups`` defaults to the number of
    cores. ``backend`` runs the plan's kernels on a CPU: ``"ort"``
    (ONNX Runtime sessions per lane segment; the fast CPU kernels), ``"torch"``, or ``"auto"``
    (ORT when installed).

    ``device="cuda"`` runs the plan's lanes on CUDA streams, captured into one CUDA graph
    (``graphs=False``: eagerly on the streams); stages are then measured as captured replays
    timed with CUDA events, and ``cost="analytic"`` uses the preset of that GPU. ``dtype``
    (``"float16"``, ``"bfloat16"``, ...) and ``channels_last`` place the model's weights: the
    returned module then behaves like ``model.to(device, dtype)`` and takes inputs on that
    device in that precision (the schedule is specialised to them). ``options`` go to the scheduler (for ``ios``:
    ``max_group_size``, ``max_groups``, ``max_part_size``, ``budget_s``, ``max_stage_costs``,
    ``progress``). With ``verify`` the result is checked against the model once.
    """
    dev = _device(device)
    inputs = _inputs(example_inputs)
    model = model.eval()
    start = time.perf_counter()
    graph = from_torch(model, inputs)
    module = optimize_graph(graph, device=dev, dtype=dtype, channels_last=channels_last, graphs=graphs,
                            scheduler=scheduler, cost=cost, backend=backend, cache_dir=cache_dir,
                            single_output=_single_output(model, inputs), **options)
    module.info["optimize time"] = f"{time.perf_counter() - start:.2f} s"
    if verify:
        _verify(module, model, inputs)
    return module


def _cost_model(cost: str | CostModel, graph: Graph, device: torch.device, backend: str, channels_last: bool,
                cache_dir: str | None, stack: contextlib.ExitStack) -> CostModel:
    if not isinstance(cost, str):
        return cost
    if cost == "analytic":
        if device.type == "cuda":
            from opsched.cost.gpu import gpu_preset

            return AnalyticCostModel(gpu_preset(torch.cuda.get_device_name(device)))
        return host_cpu_model()
    if cost != "measured":
        raise OpschedError(f"cost must be 'measured', 'analytic' or a CostModel, got {cost!r}")
    if device.type == "cuda":
        from opsched.cost.gpu import CudaMeasuredCostModel

        measured: MeasuredCostModel | CudaMeasuredCostModel = CudaMeasuredCostModel(device, channels_last=channels_last)
    else:
        measured = MeasuredCostModel(backend=backend)
    store = stack.enter_context(ProfileStore(cache_dir))
    return StoredCostModel(measured, store, measured.context(graph.inputs[0].type.shape[0]))


def optimize_graph(graph: Graph, *, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
                   channels_last: bool = False, graphs: bool = True, scheduler: str | Sequence[str] = "ios",
                   cost: str | CostModel = "measured", backend: str = "auto", cache_dir: str | None = None,
                   single_output: bool = True, check: bool = True, **options: Any) -> ScheduledModule:
    """:func:`optimize` for an imported graph (from :func:`opsched.from_onnx`, say).

    With ``check`` and a measured cost model, the plan also races the sequential one (stage
    prices were taken in isolation) and the faster is kept; with several schedulers, their
    plans race whatever the cost model. ``info["end-to-end check"]`` gives every contender's
    median and which was kept."""
    start = time.perf_counter()
    dev = _device(device)
    names = [scheduler] if isinstance(scheduler, str) else list(scheduler)
    graph = place(graph, dev, dtype, channels_last)
    inputs = tuple(random_inputs(graph, dev))
    if dev.type == "cpu":
        # more concurrent groups than cores only oversubscribe a CPU (a one-off probe on Inception:
        # 3 lanes on 2 cores ran 1.7-1.8x slower in the plan than measured alone)
        if "ios" in names and options.get("max_groups") is None:
            options["max_groups"] = os.cpu_count() or 1
        if "est" in names and options.get("max_lanes") is None:
            options["max_lanes"] = os.cpu_count() or 1
    per_scheduler = _options_by_scheduler(names, options)
    run = {"backend": backend, "device": dev, "graphs": graphs, "channels_last": channels_last,
           "single_output": single_output}
    with contextlib.ExitStack() as stack:
        cost_model = _cost_model(cost, graph, dev, backend, channels_last, cache_dir, stack)
        made = {name: run_scheduler(graph, name, cost_model, **per_scheduler[name]) for name in names}
        measured = isinstance(cost_model, StoredCostModel)
        if check and measured and "sequential" not in made:
            made["sequential"] = run_scheduler(graph, "sequential", cost_model)
        if len(made) == 1:
            module = ScheduledModule(graph, made[names[0]], **run)
        else:
            module = _fastest({name: ScheduledModule(graph, s, **run) for name, s in made.items()}, inputs, names)
        module.info["optimize time"] = f"{time.perf_counter() - start:.2f} s"
        if measured:
            module.info["measurements"] = f"{cost_model.measurements} new, {cost_model.hits} from the profile store"
    return module


def _options_by_scheduler(names: list[str], options: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each scheduler's share of ``options``; an option no scheduler takes is an error."""
    if not names:
        raise ScheduleError("scheduler: name at least one scheduler")
    accepted = {name: scheduler_options(name) for name in names}
    unknown = sorted(k for k in options if not any(k in a for a in accepted.values()))
    if unknown:
        takes = "; ".join(f"{name} takes {a}" for name, a in accepted.items())
        raise ScheduleError(f"no scheduler of {names} has option(s) {unknown} ({takes})")
    return {name: {k: v for k, v in options.items() if k in accepted[name]} for name in names}


def _fastest(contenders: dict[str, ScheduledModule], inputs: tuple[torch.Tensor, ...],
             searched: list[str]) -> ScheduledModule:
    """The contender whose plan runs fastest in one interleaved race, its ``info`` saying so; a
    searched schedule that lost is summarised there."""
    times = dict(zip(contenders, race(*contenders.values(), inputs=inputs)))
    best = min(times, key=times.__getitem__)
    module = contenders[best]
    module.info["end-to-end check"] = (", ".join(f"{name} {ms:.2f} ms" for name, ms in times.items())
                                       + f": kept {best}")
    for name in searched:
        sched, st = contenders[name].schedule, contenders[name].schedule.stats
        if name == best or "states" not in st:  # only a search's work is worth a line
            continue
        module.info[f"searched schedule ({name})"] = (
            f"{len(sched.stages)} stages, estimated {sched.estimated_ms or 0.0:.2f} ms; search {st['states']} "
            f"states, {st.get('distinct_stages', 0)} stages priced, {st.get('seconds', 0.0):.1f} s")
    return module


def race(*modules: ScheduledModule | nn.Module, inputs: tuple[torch.Tensor, ...], rounds: int = 7,
         warmup: int = 1, settle_s: float = 0.05, block: int = 3) -> list[float]:
    """Median latencies (ms) of modules run interleaved, in one process, in a fresh order each
    round (:func:`opsched.timing.interleave`): in its turn a module sleeps ``settle_s`` (an ONNX
    Runtime session's spinning threads kept a core busy for about 40 ms after its run here),
    runs once untimed, then ``block`` timed calls (on a GPU, each timed to its completion)."""
    on_gpu = any(t.is_cuda for t in inputs)

    def clock(call: Callable[[], object]) -> float:
        if on_gpu:
            torch.cuda.synchronize()
        start = time.perf_counter()
        call()
        if on_gpu:
            torch.cuda.synchronize()
        return (time.perf_counter() - start) * 1e3

    with torch.no_grad():
        times = interleave({k: (lambda m=m: m(*inputs)) for k, m in enumerate(modules)}, rounds, warmup, clock=clock,
                           settle_s=settle_s, block=block)
    return [statistics.median(times[k]) for k in range(len(modules))]


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

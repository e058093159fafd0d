"""The user-facing entry points: :func:`optimize` and :func:`load` for modules,
:func:`optimize_graph` and :func:`load_graph` for imported graphs (ONNX files)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from opsched._text import first_line
from opsched.backends import resolve_backend
from opsched.check import verify_against
from opsched.contenders import TORCH_KERNELS, baselines, contenders, distinct, torch_runs_it, within_budget
from opsched.cost import CostModel, MeasuredCostModel
from opsched.costing import for_scheduler, named_cost_model
from opsched.errors import ExecutionError, FrontendError, InputMismatchError, OpschedError, ScheduleError
from opsched.execution import RunOptions
from opsched.frontends import from_torch
from opsched.frontends.pytorch import Model, Tracer, as_module, in_dynamo_compile, register_dataclasses
from opsched.ir import Graph, random_inputs
from opsched.module import ScheduledModule
from opsched.progress import Phases, Progress, phases
from opsched.race import cutoff_for, race, turn_for
from opsched.report import OptimizeOutcome, RaceResult, ScheduleSummary
from opsched.request import DEVICES, Request, check_device, check_request, scheduler_names
from opsched.runtime.reference import drawn_well
from opsched.schedule import Schedule
from opsched.schedulers import schedule
from opsched.structure import ExampleInputs, InputStructure, OutputStructure, bind_example
from opsched.timing import alone
from opsched.transforms.place import dtype_name, place

__all__ = ["optimize", "optimize_graph", "load", "load_graph"]

log = logging.getLogger(__name__)

def _example_inputs(model: nn.Module, example_inputs: ExampleInputs, fixed_values: Sequence[str]
                    ) -> tuple[InputStructure, tuple[torch.Tensor, ...]]:
    """How ``model`` is called with ``example_inputs`` (``fixed_values`` named among them), and
    their tensors (the graph's inputs), each checked to hold values a model can run on."""
    structure, inputs = bind_example(model.forward, example_inputs, fixed_values)
    for name, t in zip(structure.names, inputs):
        if t.device.type not in DEVICES:
            raise InputMismatchError(f"example input {name!r} is on the {t.device.type} device: it holds no values to "
                                     f"run and check the model with; give a tensor on {' or '.join(DEVICES)}")
        if 0 in t.shape:
            raise InputMismatchError(f"example input {name!r} has shape {tuple(t.shape)}: a zero-size dimension "
                                     f"leaves nothing to schedule; give a batch of at least one")
    return structure, inputs


def _outputs(model: nn.Module, structure: InputStructure, inputs: Sequence[torch.Tensor]) -> OutputStructure:
    """The structure of what ``model`` returns when called as ``structure`` with ``inputs``."""
    copies = [t.clone() for t in inputs]  # a model may change its inputs
    args, kwargs = structure.call(copies)
    try:
        with torch.no_grad():
            out = model(*args, **kwargs)
    except Exception as e:  # the model's own failure, on the inputs it was given
        given = ", ".join(f"{name} {list(t.shape)} {str(t.dtype).removeprefix('torch.')}"
                          for name, t in zip(structure.names, inputs))
        raise InputMismatchError(f"{type(model).__name__} fails on the example inputs ({given}): "
                                 f"{type(e).__name__}: {first_line(e)}; give inputs the model takes") from e
    register_dataclasses(out)
    return OutputStructure.of(out, (args, kwargs), copies)


def home_device(model: Model | Graph, example_inputs: ExampleInputs | None = None) -> torch.device:
    """Where ``model`` (or an imported graph) runs, the device :func:`optimize`, :func:`load`,
    :func:`optimize_graph` and :func:`load_graph` place a plan on unless told: that of its weights
    (parameters and buffers), else of its example inputs' tensors, else the CPU. A model whose
    weights lie on several devices (split across GPUs) is refused: its plan runs on one, named by
    ``device``."""
    if isinstance(model, Graph):
        weights: Iterator[Any] = iter(model.params.values())
    elif isinstance(model, torch.export.ExportedProgram):
        weights = iter(model.state_dict.values())
    elif isinstance(model, nn.Module):
        weights = itertools.chain(model.parameters(), model.buffers())
    else:
        weights = iter(())
    devices = sorted({t.device for t in weights}, key=str) or [
        t.device for t in torch.utils._pytree.tree_leaves(example_inputs) if isinstance(t, torch.Tensor)][:1]
    if len(devices) > 1:
        raise OpschedError(f"{type(model).__name__}'s weights are on {len(devices)} devices "
                           f"({', '.join(map(str, devices))}); its plan runs on one: pass device=, and the "
                           f"weights go there")
    return devices[0] if devices else torch.device("cpu")


@contextlib.contextmanager
def _eval_mode(model: nn.Module) -> Iterator[None]:
    """``model`` in eval mode (inference: running statistics, no dropout) for the duration, then
    every submodule back in the mode it was in: the caller's model is left as it was."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


def optimize(model: Model, example_inputs: ExampleInputs | None = None, *,
             device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
             channels_last: bool = False, graphs: bool = True, scheduler: str | Sequence[str] = "ios",
             cost: str | CostModel = "measured", backend: str | Sequence[str] = "auto", cache_dir: str | None = None,
             verify: bool = True, leaf_modules: Sequence[type[nn.Module]] = (), tracer: Tracer = "auto",
             fixed_values: Sequence[str] = (), progress: bool | Phases | None = None,
             memory_budget: int | None = None, **options: Any) -> ScheduledModule:
    """Import ``model``, search a schedule, and return a module that computes what
    ``model.eval()`` computes (the model itself is left in the mode it was in).

    ``example_inputs`` is how the model is called: one tensor, a sequence of positional
    arguments, or a mapping of keyword arguments (``optimize(bert, tokenizer(text,
    return_tensors="pt"))``). The returned module is called the same way, by position or by
    name; arguments that are not tensors (``None``, flags) are fixed at their example values.
    ``model`` may be a torch.export program (``torch.export.load("model.pt2")``): it runs as it
    was exported (its train/eval mode fixed then), at its own example inputs where none are
    given, and one exported with dynamic sizes is scheduled for the sizes of the inputs given.

    ``scheduler`` names a scheduler, or several: ``("ios", "est")`` makes the dynamic
    program's schedule and the list scheduler's, races their plans end to end and keeps the
    faster (neither wins everywhere). Each option goes to the schedulers that take it
    (:func:`scheduler_options`); on a CPU, ``max_lanes`` defaults to the number of cores.

    ``cost`` is ``"measured"`` (stages timed on this machine by the backend, remembered in the
    profile store under ``cache_dir``), ``"analytic"`` (the analytic model of this device:
    instant, approximate) or any :class:`~opsched.cost.CostModel`. ``backend`` runs the plan's
    kernels: on a CPU ``"ort"`` (ONNX Runtime sessions per lane segment; the fast CPU kernels),
    ``"torch"``, ``"inductor"`` (each lane segment compiled by Inductor), or ``"auto"`` (ORT when
    installed); on a GPU ``"cuda"`` or ``"cuda-inductor"``. Several, ``("cuda", "cuda-inductor")``:
    the plans are made on the first, and each also runs on the others, all racing (contenders
    named ``"ios on cuda-inductor"``); the kept plan's schedule names its backend, so it loads
    onto it. Inductor's segments ran GoogLeNet's IOS plan 1.31x faster than the CUDA
    backend on an H200, and ran RandWire-small 0.90x as fast; compiling them takes about a
    minute a plan there.

    ``device`` is where the plan runs, by default where the model is (:func:`home_device`).
    ``device="cuda"`` runs the plan's lanes on CUDA streams, captured into one CUDA graph
    (``graphs=False``: eagerly on the streams). ``dtype`` (``"float16"``, ``"bfloat16"``, ...)
    and ``channels_last`` place the model's weights: the returned module then behaves like
    ``model.to(device, dtype)`` and takes inputs on that device in that precision (the schedule
    is specialised to them). ``tracer`` (``"auto"``: torch.export, else torch.fx),
    ``leaf_modules`` (submodule types to keep whole) and ``fixed_values`` (tensor arguments whose
    values the module is specialised to, as to a flag's: a vision tower's ``grid_thw``, whose
    numbers set its sizes) are :func:`opsched.from_torch`'s. The
    module returns outputs nested as the model's (tuples, lists, dicts). ``progress``: a bar per
    long phase on stderr (``None``: when stderr is a terminal), or a callable
    ``phases(name) -> progress(done, total, text)``. With ``verify`` the
    result is checked against the model on the example inputs and on fresh random ones; where
    ONNX Runtime's kernels (backend ``"auto"`` on a CPU) fail that check and torch's pass it, the
    plan is kept on torch's, with a warning.

    ``memory_budget`` (bytes of live activations) keeps only plans whose peak fits: concurrency
    keeps more values alive at once (up to 4x the single-stream peak on an H100), so the IOS
    search admits only stages that keep within it (the fastest schedule that fits, not the
    fastest one), the sequential plan joins the race as the frugal contender, plans over the
    budget are left out (the report names them, with their peaks), and where none fits the
    error gives every peak.

    With the measured cost model, the plans race end to end and the fastest is kept: the searched
    schedule's, the sequential one's, and on a CPU (backend ``"auto"``) the sequential plan on
    torch's kernels, so that the module keeps up with eager PyTorch where ONNX Runtime's kernels
    lose to torch's, and the sequential plan on one core (its ONNX Runtime session on one thread,
    :attr:`Schedule.cores`), which a small model's calls take least time on. Contenders are
    compared round by round (:class:`opsched.race.Standings`); on a CPU, one that another beat by
    more than 10% in each of its first 3 rounds is timed no more, and the race ends with one left
    (:class:`opsched.race.Cutoff`). Plans that run the
    same program (IOS's schedule, where it has no concurrency, and the sequential one: one ONNX
    Runtime session each) race once, under the first name. At a batch
    larger than 1 the ``graphturbo`` plan (sub-graphs split into batch instances that fit a core's
    cache, run depth-first) races the others too, and is kept only where it runs faster.
    """
    if isinstance(model, (str, os.PathLike)):
        way = ("opsched.optimize(torch.export.load(path))" if os.fspath(model).endswith(".pt2") else
               "for an ONNX file, opsched.optimize_graph(opsched.from_onnx(path)) (input_shapes= fixes its open "
               "sizes), or opsched.optimize_per_shape(path, inputs): a schedule per input shape met")
        raise FrontendError(f"optimize() takes a torch.nn.Module or a torch.export program, got the path "
                            f"{os.fspath(model)!r}: {way}")
    request = check_request(device=home_device(model, example_inputs) if device is None else device,
                            scheduler=scheduler, backend=backend, dtype=dtype, **options)
    model, example_inputs, name = as_module(model, example_inputs, "optimize()")
    call, inputs = _example_inputs(model, example_inputs, fixed_values)
    start = time.perf_counter()
    with _eval_mode(model):
        structure = _outputs(model, call, inputs)
        graph = from_torch(model, example_inputs, name=name, leaf_modules=leaf_modules, tracer=tracer,
                           fixed_values=fixed_values)
        if structure.tensors != len(graph.returns):
            raise FrontendError(f"{name} returns {structure.tensors} tensors, but its import "
                                f"returns {len(graph.returns)}; please report this with the model")
        module = _optimize(graph, request, channels_last=channels_last, graphs=graphs, cost=cost, cache_dir=cache_dir,
                           inputs=call, outputs=structure, progress=phases(progress), memory_budget=memory_budget)
        module.outcome = dataclasses.replace(module.outcome, seconds=time.perf_counter() - start)
        if verify:
            module = _verified(module, model, call, inputs, request.backend, request.dtype,
                               phases(progress)("checking"))
    return module


def _verified(module: ScheduledModule, model: nn.Module, call: InputStructure, inputs: tuple[torch.Tensor, ...],
              backend: str, dtype: str | None, progress: Progress | None = None) -> ScheduledModule:
    """``module``, checked against ``model`` (:func:`verify_against`); or, where the backend was
    left to choose (``"auto"``) and ONNX Runtime's kernels compute the model further from it than
    the check allows, the same plan on torch's kernels, checked in turn, with a warning: MobileViTV2
    on ONNX Runtime was 1.3e-4 from its float64 outputs, where eager's float32 was 6e-6. The first
    error is raised where torch's kernels fail the check too."""
    def check(m: ScheduledModule) -> None:
        verify_against(m, m.graph, m.device, model, call, inputs, progress, dtype)

    try:
        check(module)
        return module
    except ExecutionError as e:
        may_move = backend == "auto" and module.backend.name != TORCH_KERNELS
        if not (may_move and torch_runs_it(module.graph, module.device)):
            raise
        fallback = module.on_backend(TORCH_KERNELS)
        try:
            check(fallback)
        except ExecutionError:
            raise e from None
        log.warning("%s on %s's kernels failed the check (%s); its plan runs on torch's kernels, which pass it "
                    "(backend=%r keeps %s's and raises)", module.graph.name, module.backend.name, first_line(e),
                    module.backend.name, module.backend.name)
        return fallback


def optimize_graph(graph: Graph, *, device: str | torch.device | None = None, dtype: str | torch.dtype | None = None,
                   channels_last: bool = False, graphs: bool = True, scheduler: str | Sequence[str] = "ios",
                   cost: str | CostModel = "measured", backend: str | Sequence[str] = "auto",
                   cache_dir: str | None = None,
                   check: bool = True, race_with: Sequence[str] = (), rounds: int = 7,
                   progress: bool | Phases | None = None, memory_budget: int | None = None,
                   **options: Any) -> ScheduledModule:
    """:func:`optimize` for an imported graph (from :func:`opsched.from_onnx`, say).

    With ``check`` and a measured cost model, the plan also races the sequential one (stage
    prices were taken in isolation) and the faster is kept; with several schedulers, their
    plans race whatever the cost model. ``race_with`` adds schedulers whose plans only race (the
    command line's baselines); ``rounds`` is the race's, at most (on a CPU it ends once every
    contender but one is cut off: :class:`opsched.race.Cutoff`). ``module.report()`` gives every
    contender's median and which was kept; ``memory_budget`` and ``device`` (by default where the
    graph's weights are: the CPU for an ONNX file's) are :func:`optimize`'s."""
    request = check_request(device=home_device(graph) if device is None else device, scheduler=scheduler,
                            backend=backend, dtype=dtype, **options)
    extra = scheduler_names(race_with) if race_with else ()
    return _optimize(graph, request, channels_last=channels_last, graphs=graphs, cost=cost, cache_dir=cache_dir,
                     check=check, race_with=extra, rounds=rounds, progress=phases(progress),
                     memory_budget=memory_budget)


def _optimize(graph: Graph, request: Request, *, channels_last: bool, graphs: bool, cost: str | CostModel,
              cache_dir: str | None, progress: Phases, check: bool = True, race_with: Sequence[str] = (),
              rounds: int = 7, inputs: InputStructure | None = None, outputs: OutputStructure | None = None,
              memory_budget: int | None = None) -> ScheduledModule:
    if memory_budget is not None and (not isinstance(memory_budget, int) or memory_budget <= 0):
        raise ScheduleError(f"memory_budget: a positive number of bytes, got {memory_budget!r}")
    start = time.perf_counter()
    dev = request.device
    graph = place(graph, dev, request.dtype, channels_last)
    be = resolve_backend(request.backend, dev, graph.dtypes)  # a bfloat16 model, say
    run = RunOptions(dev, None, graphs, channels_last, spin=True)
    with contextlib.ExitStack() as stack:
        # one search of this process measures at a time; one within a Dynamo compile does not wait for another's,
        # which may wait for Dynamo's compile lock (exporting a segment)
        stack.enter_context(alone(f"optimize() of {graph.name!r}", wait=not in_dynamo_compile(),
                                  waiting=progress("waiting for another thread's search")))
        stack.enter_context(_on_drawn_inputs(graph))
        cost_model = named_cost_model(cost, be, run, cache_dir, stack)
        made = {name: schedule(graph, name, for_scheduler(cost_model, request.options[name]),
                               _within(request.options[name], memory_budget), progress=progress(f"searching {name}"))
                for name in request.schedulers}
        checked = check and isinstance(cost_model, MeasuredCostModel)
        made.update(baselines(graph, made, cost_model, dev, race_with=race_with,
                              sequential=checked or memory_budget is not None, split=checked, progress=progress))
        modules = contenders(graph, made, request, be, checked=checked, graphs=graphs, channels_last=channels_last,
                             inputs=inputs, outputs=outputs)
        peaks = {name: m.peak_bytes for name, m in modules.items()}
        modules, over = within_budget(modules, peaks, memory_budget, graph)
        modules, same = distinct(modules)
        raced = None
        kept = next(name for name in (*request.schedulers, *modules) if name in modules)
        if len(modules) > 1:
            feeds = tuple(random_inputs(graph, dev))
            standings = race({name: functools.partial(m.executor, feeds) for name, m in modules.items()},
                             clock=be.clock(run), rounds=rounds, turn=turn_for(dev.type),
                             cutoff=cutoff_for(dev.type), progress=progress("racing plans"))
            kept = standings.fastest
            raced = RaceResult(standings, kept, {name: peaks[name] for name in modules})
        module = modules[kept]
        searched = tuple(ScheduleSummary.of(m.schedule, m.plan) for name, m in modules.items()
                         if name != kept and name in request.schedulers and m.schedule.stats)
        counts = cost_model.counts if isinstance(cost_model, MeasuredCostModel) else None
        module.outcome = OptimizeOutcome(raced, searched, counts, time.perf_counter() - start, memory_budget, over,
                                         same)
    return module


@contextlib.contextmanager
def _on_drawn_inputs(graph: Graph) -> Iterator[None]:
    """A plan that fails while it is timed or raced, said to have run on drawn inputs where the
    graph takes integer or boolean ones, whose drawn values (zeros, trues) the model may refuse."""
    try:
        yield
    except ExecutionError as e:
        chosen = [i.name for i in graph.inputs if not drawn_well(i.type.dtype)]
        if not chosen or isinstance(e, InputMismatchError):
            raise
        raise type(e)(f"{e}\n(plans are timed and raced on drawn inputs, integers zero and booleans true: here "
                      f"{', '.join(map(repr, chosen))}; where an input's value selects what the model computes (a "
                      f"sample rate, a mode), fix it where the graph is made: from_onnx(path, input_values="
                      f"{{{chosen[0]!r}: ...}}), or opsched optimize FILE --input-value {chosen[0]}=...)") from e


def _within(options: Any, memory_budget: int | None) -> Any:
    """A scheduler's options with ``memory_budget`` where it takes one (the IOS search then keeps
    every stage within it) and was not given its own."""
    takes_one = any(f.name == "memory_budget" for f in dataclasses.fields(options))
    if memory_budget is None or not takes_one or options.memory_budget is not None:
        return options
    return dataclasses.replace(options, memory_budget=memory_budget)


def load(model: Model, path: str | os.PathLike[str] | Schedule, example_inputs: ExampleInputs | None = None, *,
         device: str | torch.device | None = None, dtype: str | torch.dtype | None = None, channels_last: bool = False,
         graphs: bool = True, backend: str = "auto", leaf_modules: Sequence[type[nn.Module]] = (),
         tracer: Tracer = "auto", fixed_values: Sequence[str] = (), retarget: bool = False,
         verify: bool = False) -> ScheduledModule:
    """Reapply a schedule saved by :meth:`ScheduledModule.save` (``path``, or the schedule itself)
    to ``model``.

    The model is imported again with ``example_inputs`` (as :func:`optimize` takes them) and
    placed as given; a schedule made for
    another model, batch size, input shape or precision is refused with
    :class:`~opsched.errors.ScheduleMismatchError`. One made on another device runs (schedules
    travel), with a warning: it was tuned for that device. With ``tracer="auto"``, a schedule
    saved from a torch.fx import (whose node names torch.export does not always repeat) loads too.

    ``retarget=True`` applies a schedule made for the same model at other input shapes or in
    another precision (:meth:`Schedule.retarget`: its operators are the model's, by name and
    dependency, whatever their shapes): it runs correctly, with no search, but was tuned for the
    shapes it was made at (Inception V3's batch-128 schedule ran batch 1 at 1.20x the time of
    batch 1's own on the H100 preset: ``docs/results/specialization.md``). A schedule of
    another model is still refused, naming the first operator it lacks or misorders.
    ``verify`` checks the module against the model as :func:`optimize` does (with ``backend="auto"``,
    a plan on ONNX Runtime's kernels that fails the check runs on torch's where they pass it). ``device``, by default
    where the model is, and ``fixed_values`` (as the schedule was made with) are :func:`optimize`'s.
    """
    dev = check_device(home_device(model, example_inputs) if device is None else device)
    model, example_inputs, name = as_module(model, example_inputs, "load()")
    call, inputs = _example_inputs(model, example_inputs, fixed_values)
    saved = path if isinstance(path, Schedule) else Schedule.load(path)
    with _eval_mode(model):
        structure = _outputs(model, call, inputs)
        graph = place(from_torch(model, example_inputs, name=name, leaf_modules=leaf_modules, tracer=tracer,
                                 fixed_values=fixed_values), dev, dtype, channels_last)
        fit = saved.retarget if retarget else saved.validate
        try:
            sched = fit(graph)
        except OpschedError:
            if tracer != "auto" or not (retarget or graph.structural_hash() == saved.graph_hash):
                raise
            graph = place(from_torch(model, example_inputs, name=name, leaf_modules=leaf_modules, tracer="fx"), dev,
                          dtype, channels_last)
            sched = fit(graph)
        module = ScheduledModule(graph, sched, backend=backend, device=dev, graphs=graphs, channels_last=channels_last,
                                 inputs=call, outputs=structure)
        if verify:
            module = _verified(module, model, call, inputs, backend, None if dtype is None else dtype_name(dtype))
    _warn_if_moved(sched, dev, path)
    return module


def load_graph(graph: Graph, path: str | os.PathLike[str] | Schedule, *, device: str | torch.device | None = None,
               dtype: str | torch.dtype | None = None, channels_last: bool = False, graphs: bool = True,
               backend: str = "auto", retarget: bool = False) -> ScheduledModule:
    """:func:`load` for an imported graph: reapply a schedule that :func:`optimize_graph` (its
    module's ``save``) or ``opsched optimize model.onnx`` wrote (``path``, or the schedule itself),
    with no search.

    ``opsched.load_graph(opsched.from_onnx("model.onnx"), "opsched-out/schedule.json")`` runs it
    on the file's declared shapes (give ``from_onnx`` the ``input_shapes`` the schedule was made
    at, the command line's ``--batch`` and ``--input-shape``). The module takes the graph's inputs
    by position or by name. A schedule made for another graph, batch size, input shape or
    precision is refused as :func:`load` refuses it; ``retarget=True`` applies it as
    :func:`load` does (an ONNX file imported at other ``input_shapes``)."""
    if not isinstance(graph, Graph):
        hint = (f"opsched.load_graph(opsched.from_onnx({os.fspath(graph)!r}), ...)"
                if isinstance(graph, (str, os.PathLike))
                else "opsched.load(model, path, example_inputs) for an nn.Module")
        raise FrontendError(f"load_graph() takes an imported Graph, got {type(graph).__name__}: {hint}")
    dev = check_device(home_device(graph) if device is None else device)
    graph = place(graph, dev, dtype, channels_last)
    saved = path if isinstance(path, Schedule) else Schedule.load(path)
    sched = saved.retarget(graph) if retarget else saved.validate(graph)
    module = ScheduledModule(graph, sched, backend=backend, device=dev, graphs=graphs, channels_last=channels_last)
    _warn_if_moved(sched, dev, path)
    return module


def _warn_if_moved(sched: Schedule, dev: torch.device, path: str | os.PathLike[str] | Schedule) -> None:
    """Schedules travel between devices, but were tuned for the one they were made on."""
    here = torch.cuda.get_device_name(dev) if dev.type == "cuda" else ""
    if here and sched.device and here not in sched.device:
        where = f"of {sched.graph_name!r}" if isinstance(path, Schedule) else os.fspath(path)
        log.warning("schedule %s was made for %s; running it on %s", where, sched.device, here)

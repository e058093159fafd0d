"""The plans :func:`opsched.optimize` races: the schedules asked for, the baselines that keep each
one honest, the same plans on other kernels or fewer cores, and which of them are worth timing.

:func:`baselines` adds the schedules a race needs beside those searched (the sequential plan,
what ``race_with`` names, the cache-fitting split at a batch); :func:`contenders` binds every
schedule to its module, on the backend asked for, on each further one, and as the two CPU
baselines (:data:`TORCH_KERNELS`, :data:`ONE_CORE`); :func:`within_budget` leaves out those whose
activations peak over a memory budget, and :func:`distinct` those that run another's plan.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch

from opsched._text import size
from opsched.backends import Backend, resolve_backend
from opsched.cost import CostModel
from opsched.errors import ScheduleError
from opsched.ir import Graph
from opsched.module import ScheduledModule
from opsched.progress import Phases
from opsched.request import Request, scheduler_options
from opsched.runtime.plan import plan_work
from opsched.schedule import Schedule, graph_batch
from opsched.schedulers import schedule
from opsched.structure import InputStructure, OutputStructure

__all__ = ["TORCH_KERNELS", "ONE_CORE", "baselines", "contenders", "within_budget", "distinct", "torch_runs_it"]

#: The backend whose plan races the others on a CPU: eager PyTorch's kernels, op by op.
TORCH_KERNELS = "torch"
#: The contender that runs the sequential plan on one CPU core (:attr:`Schedule.cores`).
ONE_CORE = "sequential on 1 core"


def baselines(graph: Graph, made: Mapping[str, Schedule], cost_model: CostModel, device: torch.device, *,
              race_with: Sequence[str], sequential: bool, split: bool, progress: Phases) -> dict[str, Schedule]:
    """The schedules a race needs beside those ``made``: ``race_with``'s, the sequential one where
    asked, and with ``split`` at a batch, the cache-fitting split plan (every sub-graph whose
    instances fit split, the paper's rule, since the estimate misses what smaller kernels lose
    and gain: kept only where it runs faster)."""
    out: dict[str, Schedule] = {}
    for name in [*race_with, *(["sequential"] if sequential else [])]:
        if name not in made and name not in out:
            out[name] = schedule(graph, name, cost_model, scheduler_options([name], device.type, {})[name])
    if split and graph_batch(graph) > 1 and "graphturbo" not in made and "graphturbo" not in out:
        defaults = scheduler_options(["graphturbo"], device.type, {"split_when": "fits"})["graphturbo"]
        fitted = schedule(graph, "graphturbo", cost_model, defaults, progress=progress("searching graphturbo"))
        if fitted.splits:
            out["graphturbo"] = fitted
    return out


def contenders(graph: Graph, made: Mapping[str, Schedule], request: Request, backend: Backend, *, checked: bool,
               graphs: bool, channels_last: bool, inputs: InputStructure | None,
               outputs: OutputStructure | None) -> dict[str, ScheduledModule]:
    """Each schedule ``made`` as a module on ``backend``, and on each further backend the request
    names (``"ios on cuda-inductor"``); where the race is measured (``checked``), also the
    sequential plan on torch's kernels and on one core, where they could win."""
    dev = request.device

    def module(sched: Schedule, on: Backend | str, captured: bool = True) -> ScheduledModule:
        return ScheduledModule(graph, sched, backend=on, device=dev, graphs=captured, channels_last=channels_last,
                               inputs=inputs, outputs=outputs)

    modules = {name: module(s, backend, graphs) for name, s in made.items()}
    for named in request.also_on:
        other = resolve_backend(named, dev, graph.dtypes)
        modules.update((f"{name} on {other.name}", module(s.on_backend(other.name), other, graphs))
                       for name, s in made.items())
    if checked and request.backend == "auto" and backend.name != TORCH_KERNELS and torch_runs_it(graph, dev):
        # where ONNX Runtime's kernels lose to torch's (FNet's ONNX file, its FFTs on torch, runs at
        # 0.76-0.87x of eager at BERT's width: docs/results/fourier.md), the sequential plan on torch's
        # kernels keeps up with eager
        modules[f"sequential on {TORCH_KERNELS}"] = module(made["sequential"].on_backend(TORCH_KERNELS), TORCH_KERNELS)
    if checked and backend.threads_by_cores and torch.get_num_threads() > 1:
        # a small model's one session runs fastest on one core, with no intra-op thread to wake for each
        # kernel (on two cores, benchmarks/call_overhead.py: the corpus's BERT, GPT-2, ViT and ResNet kept so,
        # 1.2-1.6x faster than the two-thread plan's module), a larger one's not (benchmarks/onnx_files.py:
        # PP-LCNet's race keeps two): the sequential plan on one core races the others
        modules[ONE_CORE] = module(dataclasses.replace(made["sequential"], cores=1), backend)
    return modules


def within_budget(modules: Mapping[str, ScheduledModule], peaks: Mapping[str, int], memory_budget: int | None,
                  graph: Graph) -> tuple[dict[str, ScheduledModule], dict[str, int]]:
    """The ``modules`` whose activations peak (``peaks``) within ``memory_budget``, and the peak of
    each one left out; refused where none fits."""
    if memory_budget is None:
        return dict(modules), {}
    over = {name: peak for name, peak in peaks.items() if peak > memory_budget}
    if len(over) == len(modules):
        listing = ", ".join(f"{name}'s at {size(peak)}" for name, peak in over.items())
        raise ScheduleError(f"no plan of {graph.name!r} fits memory_budget={memory_budget} bytes "
                            f"({size(memory_budget)}): their activations peak {listing}")
    return {name: m for name, m in modules.items() if name not in over}, over


def distinct(modules: Mapping[str, ScheduledModule]) -> tuple[dict[str, ScheduledModule], dict[str, str]]:
    """The contenders whose plans differ (of plans with the same work on the same backend, the
    first named: the scheduler asked for before the baselines), and each one left out with the
    contender that runs its plan. Racing one program against itself measures only noise: on two
    cores, Inception V3's IOS schedule and the sequential one are both one ONNX Runtime session,
    and the race kept either by turns."""
    first: dict[object, str] = {}
    same: dict[str, str] = {}
    for name, m in modules.items():
        key = (m.backend.name, m.run.cores, plan_work(m.plan))
        if key in first:
            same[name] = first[key]
        else:
            first[key] = name
    return {name: m for name, m in modules.items() if name not in same}, same


def torch_runs_it(graph: Graph, device: torch.device) -> bool:
    """Whether torch's kernels run ``graph`` as eager PyTorch would: on a CPU, a graph of torch's
    operators (it runs an ONNX file's generic nodes as one-node ONNX Runtime sessions)."""
    return device.type == "cpu" and not any(n.op.startswith("onnx.") for n in graph.nodes)

"""The cost model a search prices its stages with, made for this machine: the analytic preset of
its CPU (:func:`host_cpu_model`), the measured model of a backend on a device
(:func:`measured_cost`), a platform's units each measured where they exist here
(:func:`measured_platform`), and the one :func:`opsched.optimize` names by ``cost=``
(:func:`named_cost_model`) and hands each scheduler (:func:`for_scheduler`)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from opsched.backends import Backend, resolve_backend
from opsched.cost import AnalyticCostModel, CostModel, MeasuredCostModel, ProfileStore, host_cpu_spec
from opsched.cost.unit_costs import PlatformCost, resolve_platform
from opsched.errors import OpschedError
from opsched.execution import RunOptions
from opsched.request import check_device
from opsched.schedulers.placement import PlacementOptions

__all__ = ["host_cpu_model", "measured_cost", "measured_platform", "named_cost_model", "for_scheduler"]


def host_cpu_model() -> AnalyticCostModel:
    """The analytic CPU preset with this machine's core count."""
    return AnalyticCostModel(host_cpu_spec())


def measured_cost(device: str | torch.device = "cpu", *, backend: str | Backend = "auto",
                  store: ProfileStore | None = None, cores: int | None = None,
                  channels_last: bool = False) -> MeasuredCostModel:
    """The measured cost model of ``backend`` on ``device`` (its stages timed as the plans will
    run: on ``cores`` threads, in channels-last layout), its figures kept in ``store``."""
    dev = check_device(device)
    be = resolve_backend(backend, dev) if isinstance(backend, str) else backend
    return MeasuredCostModel(be, RunOptions(dev, cores, channels_last=channels_last), store=store)


def measured_platform(base: MeasuredCostModel, name: str | None = None) -> PlatformCost:
    """The platform ``name`` (None: ``cpu+cuda`` where a GPU is present, else ``cpu-pools``) with
    each unit that exists here priced by a measured model: stages timed on the unit's backend,
    device and cores, into ``base``'s profile store with its timing policy. A unit that exists
    only in the simulator (or a GPU this machine lacks) keeps its analytic preset."""
    plat = resolve_platform(name)
    models: dict[str, CostModel] = {}
    for unit in plat.units:
        if unit.device is None or (unit.device.startswith("cuda") and not torch.cuda.is_available()):
            continue
        device = torch.device(unit.device)
        models[unit.name] = MeasuredCostModel(resolve_backend(unit.backend, device), RunOptions(device, unit.cores),
                                              base.policy, store=base.store)
    return PlatformCost(plat, models)


def named_cost_model(cost: str | CostModel, backend: Backend, run: RunOptions, cache_dir: str | None,
                     stack: contextlib.ExitStack) -> CostModel:
    """``cost`` as :func:`opsched.optimize` takes it: ``"analytic"`` (the backend's preset for
    ``run``), ``"measured"`` (its profile store under ``cache_dir``, open until ``stack`` closes)
    or a cost model itself."""
    if not isinstance(cost, str):
        return cost
    if cost == "analytic":
        return AnalyticCostModel(backend.analytic_spec(run))
    if cost == "measured":
        store = stack.enter_context(ProfileStore(cache_dir))
        stack.enter_context(store.measuring())
        return measured_cost(run.device, backend=backend, store=store, cores=run.cores,
                             channels_last=run.channels_last)
    raise OpschedError(f"cost must be 'measured', 'analytic' or a CostModel, got {cost!r}")


def for_scheduler(cost: CostModel, options: Any) -> CostModel:
    """The cost model a scheduler gets: for a placement scheduler given a measured model, the
    platform's units measured (:func:`measured_platform`); otherwise ``cost`` itself."""
    if isinstance(options, PlacementOptions) and isinstance(cost, MeasuredCostModel):
        return measured_platform(cost, options.platform)
    return cost

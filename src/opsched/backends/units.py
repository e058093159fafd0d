"""The units backend: a placed plan (lanes on the units of a platform) run as one program.

Each lane runs on the thread of its unit with torch kernels bound to the unit's device: the
CPU for core pools, ``cuda:k`` for a GPU (its weights placed there once, its kernels on a
stream of its own). Where a step reads a value made on a unit whose memory it cannot read, a
copy item runs first on the reader's lane, after the producer (the producer's event), into a
slot of its own that later readers on that unit share; a value is copied once per unit. A
copy to a GPU is non-blocking; a GPU step whose value another lane reads, and the last step
of a GPU lane in a phase, synchronise its stream before the lane signals them. The module's
inputs and outputs live on the platform's default unit (the host): a model output made on a
unit of its own memory is copied back by the lane that made it, as the placement simulator
prices it, so a placed module returns what the model returns, where it returns it. Pools of one
CPU share its memory: nothing is copied, and each lane of a phase gets its share of the cores
(torch's intra-op threads are process-wide, so a pool is a share, not a pinned set).

A unit that exists only in the simulator (``Unit.device is None``, the NPU of ``cpu+npu``)
runs here on the host CPU as if it had memory of its own (its copies are real copies): the
plan's results are exact, its timings are not the unit's.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch

from opsched.backends.base import CpuBackend, Executor, register_backend
from opsched.backends.lanes import Item, LaneExecutor, Program, step_category
from opsched.cost.units import Platform, platform
from opsched.errors import OpschedError
from opsched.execution import RunOptions
from opsched.ir import Graph
from opsched.runtime import Plan
from opsched.runtime.kernels import bind_step
from opsched.transforms.place import place

__all__ = ["UnitsBackend", "units_program"]

log = logging.getLogger(__name__)

COPY_OP = "copy"


def _unit_device(p: Platform, unit: str) -> torch.device:
    device = p.unit(unit).device
    return torch.device(device or "cpu")


class _Builder:
    """One plan's program: the plan's steps bound on their units' devices, copies inserted."""

    def __init__(self, graph: Graph, plan: Plan, p: Platform) -> None:
        self.graph, self.plan, self.p = graph, plan, p
        self.unit_of_place = [d or p.default for d, _ in plan.placements]
        for u in self.unit_of_place:
            p.unit(u)  # a unit of this platform, or a named error
        self.graphs: dict[str, Graph] = {}
        self.streams: dict[str, Any] = {}
        self.home = {slot: p.default for slot in plan.input_slots}  # slot -> unit that made it
        self.shadow: dict[tuple[int, str], int] = {}  # (slot, unit) -> its copy's slot
        self.returned: dict[int, int] = {}  # an output slot made off the host -> its copy's slot there
        self.last_read: dict[int, int] = {}  # a copy's slot -> the last phase that reads it
        self.n_slots = len(plan.slot_names)
        self.n_items = len(plan.steps)
        self.readers_lane: dict[int, set[tuple[int, int]]] = {}
        for k, phase in enumerate(plan.phases):
            for li, lane in enumerate(phase.lanes):
                for s in lane:
                    for slot in plan.steps[s].inputs:
                        self.readers_lane.setdefault(slot, set()).add((k, li))
                    for slot in plan.steps[s].outputs:
                        self.home[slot] = self.unit_of_place[phase.placement(li)]

    def graph_on(self, unit: str) -> Graph:
        if unit not in self.graphs:
            self.graphs[unit] = place(self.graph, _unit_device(self.p, unit))
        return self.graphs[unit]

    def stream(self, unit: str) -> Any:
        if _unit_device(self.p, unit).type != "cuda":
            return None
        if unit not in self.streams:
            self.streams[unit] = torch.cuda.Stream(_unit_device(self.p, unit))
        return self.streams[unit]

    def program(self) -> Program:
        phases = []
        for k, phase in enumerate(self.plan.phases):
            lanes = []
            for li, lane in enumerate(phase.lanes):
                unit = self.unit_of_place[phase.placement(li)]
                items: list[Item] = []
                for pos, s in enumerate(lane):
                    items += self._items(k, li, s, unit, last=pos == len(lane) - 1)
                lanes.append(tuple(items))
            phases.append(tuple(lanes))
        frees = [list(phase.frees) for phase in self.plan.phases]
        for copy, k in self.last_read.items():  # a copy lives until its unit's last reader's phase ends
            frees[k].append(copy)
        outputs = tuple(self.returned.get(slot, slot) for slot in self.plan.output_slots)
        return Program(tuple(phases), tuple(tuple(f) for f in frees), self.n_items, self.n_slots,
                       self.plan.input_slots, outputs)

    def _items(self, k: int, li: int, s: int, unit: str, last: bool) -> Iterator[Item]:
        step = self.plan.steps[s]
        inputs = []
        for slot in step.inputs:
            src = self.home[slot]
            if self.p.shares_memory(src, unit):
                inputs.append(slot)
                continue
            if (slot, unit) not in self.shadow:
                self.shadow[(slot, unit)] = target = self._new_slot()
                yield self._copy_item(slot, target, src, unit, step.waits)
            inputs.append(self.shadow[(slot, unit)])
            self.last_read[self.shadow[(slot, unit)]] = k
        bound = dataclasses.replace(step, inputs=tuple(inputs))
        kernel = bind_step(self.graph_on(unit), bound)
        stream = self.stream(unit)
        shared = last or any(slot in self.plan.output_slots or
                             any(where != (k, li) for where in self.readers_lane.get(slot, ()))
                             for slot in step.outputs)
        yield Item(s, step.label, step.op, _run_on(kernel, stream, shared), step.waits, step_category(step))
        host = self.p.default
        for slot in step.outputs:
            if slot in self.plan.output_slots and slot not in self.returned and not self.p.shares_memory(unit, host):
                self.returned[slot] = target = self._new_slot()
                yield self._copy_item(slot, target, unit, host, ())  # after the step, on its lane

    def _copy_item(self, slot: int, target: int, src: str, dst: str, waits: tuple[int, ...]) -> Item:
        """Copies ``slot`` (made on ``src``) into ``target`` on ``dst``; an emulated unit's side
        of the copy is the host's memory, so its copies are clones."""
        emulate = self.p.unit(dst).device is None or self.p.unit(src).device is None
        return Item(self._new_item(), f"copy {self.plan.slot_names[slot]} {src}->{dst}", COPY_OP,
                    _copy(slot, target, _unit_device(self.p, dst), emulate), waits, "data")

    def _new_item(self) -> int:
        self.n_items += 1
        return self.n_items - 1

    def _new_slot(self) -> int:
        self.n_slots += 1
        return self.n_slots - 1


def _copy(src: int, dst: int, device: torch.device, emulate: bool) -> Callable[[list[Any]], None]:
    if emulate:  # a unit that is only a model: its memory is this CPU's, copied all the same
        def run(slots: list[Any]) -> None:
            slots[dst] = slots[src].clone()
    else:
        non_blocking = device.type == "cuda"

        def run(slots: list[Any]) -> None:
            slots[dst] = slots[src].to(device, non_blocking=non_blocking)
    return run


def _run_on(kernel: Callable[[list[Any]], None], stream: Any, synchronize: bool) -> Callable[[list[Any]], None]:
    if stream is None:
        return kernel

    def run(slots: list[Any]) -> None:
        with torch.cuda.stream(stream):
            kernel(slots)
        if synchronize:
            stream.synchronize()
    return run


def units_program(graph: Graph, plan: Plan, p: Platform) -> Program:
    """``plan``'s program on the units of ``p`` (see the module docstring)."""
    return _Builder(graph, plan, p).program()


class UnitsBackend(CpuBackend):
    """Runs placed plans; the host CPU coordinates (the module's inputs and outputs live there)."""

    name = "units"

    def prepare(self, graph: Graph, plan: Plan, run: RunOptions) -> Executor:
        if run.platform is None:
            raise OpschedError(f"backend 'units' runs placed schedules; the plan of {graph.name!r} names no platform")
        p = platform(run.platform)
        used = {d or p.default for d, _ in plan.placements}
        for u in p.units:
            gpu = u.device is not None and u.device.startswith("cuda")
            if u.name in used and gpu and not torch.cuda.is_available():
                raise OpschedError(f"unit {u.name!r} of platform {p.name!r} is {u.device}, and this machine has no GPU")
        emulated = [u.name for u in p.units if u.name in used and u.device is None]
        if emulated:
            log.warning("units %s of platform %r exist only in the simulator; their lanes run on this CPU (results "
                        "exact, timings not the units')", ", ".join(emulated), p.name)
        return LaneExecutor(units_program(graph, plan, p), run.cores, f"units[{p.name}]")


register_backend(UnitsBackend())

"""Lane segments: a plan's lanes cut into maximal runs of steps that one compiled unit runs.

Backends whose kernels are whole sub-graphs (an ONNX Runtime session, an Inductor-compiled
function) share this cut. Each lane of each phase is cut into segments of steps the backend can
compile; a step that waits on another lane starts a new segment, and a step another lane waits
for ends one (its event must be set when it is done). Steps the backend cannot compile run alone
in between. A subclass says which steps fit, how a segment and a lone step become
:class:`~opsched.backends.lanes.Item`\\ s, and how values are held (:attr:`encode`/:attr:`decode`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from opsched._toposort import topological_order
from opsched.backends.lanes import Item, Program
from opsched.errors import ExecutionError
from opsched.ir import Graph
from opsched.runtime import Plan

__all__ = ["Segment", "SegmentBuilder"]


@dataclass(frozen=True)
class Segment:
    """Consecutive steps of one lane, compiled as one: the slots it reads from outside, the slots
    read after it (or graph outputs), the slots dead once it has run."""

    steps: tuple[int, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    frees: tuple[int, ...]
    label: str


class SegmentBuilder:
    """Cuts a plan into segments and lone steps, and assembles the :class:`Program`."""

    encode: Callable[[torch.Tensor], Any] = staticmethod(lambda t: t)
    decode: Callable[[Any], torch.Tensor] = staticmethod(lambda v: v)

    def __init__(self, graph: Graph, plan: Plan, cores: int) -> None:
        self.graph, self.plan, self.cores = graph, plan, cores
        steps = plan.steps
        self.readers: dict[int, set[int]] = {}
        for s, step in enumerate(steps):
            for slot in step.inputs:
                self.readers.setdefault(slot, set()).add(s)
        self.waited = {w for step in steps for w in step.waits}
        self.items: list[Item] = []
        self.members: list[list[int]] = []   # per item, the steps it runs
        self.sessions: list[Any] = []        # per item, the compiled unit that runs it (None: a lone step)
        self.item_of: dict[int, int] = {}

    # --- what a subclass says -------------------------------------------------------------------
    def fits(self, s: int) -> bool:
        """Whether step ``s`` can be part of a segment."""
        raise NotImplementedError

    def segment_item(self, segment: Segment, threads: int) -> tuple[Item, Any]:
        """``segment`` compiled, as an item (its id: ``len(self.items)``) and the compiled unit."""
        raise NotImplementedError

    def step_item(self, s: int) -> Item:
        """Step ``s``, which fits no segment, as an item of its own."""
        raise NotImplementedError

    # --- the cut ---------------------------------------------------------------------------------
    def build(self) -> Program:
        """Every lane cut (:meth:`_cut`), its units made into items in an order where each unit
        comes after those whose values it reads (:meth:`_made_in_order`: a subclass may run what
        it compiles and compile the next unit on those values), then set out by phase and lane."""
        units: list[tuple[tuple[int, ...], bool, int]] = []  # (steps, whether a segment, threads)
        layout: list[list[list[int]]] = []                   # per phase, per lane, its units
        for phase in self.plan.phases:
            threads = max(1, self.cores // len(phase.lanes))
            lanes = []
            for lane in phase.lanes:
                cut = self._cut(lane)
                lanes.append(list(range(len(units), len(units) + len(cut))))
                units.extend((run, fits, threads) for run, fits in cut)
            layout.append(lanes)
        item_of_unit: dict[int, int] = {}
        for u in self._made_in_order([run for run, _, _ in units]):
            run, fits, threads = units[u]
            if fits:
                item, session = self.segment_item(self.segment(run), threads)
                item_of_unit[u] = self._emit(item, list(run), session)
            else:
                item_of_unit[u] = self._emit(self.step_item(run[0]), list(run), None)
        steps = self.plan.steps

        def with_waits(i: int) -> Item:
            item = self.items[i]
            waits = {self.item_of[w] for m in self.members[i] for w in steps[m].waits} - {item.id}
            return dataclasses.replace(item, waits=tuple(sorted(waits)))

        program_phases = tuple(tuple(tuple(with_waits(item_of_unit[u]) for u in lane) for lane in lanes)
                               for lanes in layout)
        return Program(program_phases, tuple(p.frees for p in self.plan.phases), len(self.items),
                       len(self.plan.slot_names), self.plan.input_slots, self.plan.output_slots, encode=self.encode,
                       decode=self.decode, sessions=tuple(self.sessions))

    def _cut(self, lane: Sequence[int]) -> list[tuple[tuple[int, ...], bool]]:
        """``lane`` cut into runs of steps: segments (True) and lone steps that fit none (False)."""
        cut: list[tuple[tuple[int, ...], bool]] = []
        run: list[int] = []

        def close() -> None:
            if run:
                cut.append((tuple(run), True))
                run.clear()

        for s in lane:
            if self.plan.steps[s].waits:
                close()  # a step that waits on another lane starts a new segment
            if self.fits(s):
                run.append(s)
                if s in self.waited:
                    close()  # another lane waits for this step: end its segment here
            else:
                close()
                cut.append(((s,), False))
        close()
        return cut

    def _made_in_order(self, units: Sequence[tuple[int, ...]]) -> list[int]:
        """The ``units`` (runs of steps) in the order they are cut, except that a unit reading a
        value another unit makes comes after it (a lane that waits on a later lane's step)."""
        steps = self.plan.steps
        maker = {slot: u for u, run in enumerate(units) for s in run for slot in steps[s].outputs}
        makers = {u: {maker[slot] for s in run for slot in steps[s].inputs if slot in maker} - {u}
                  for u, run in enumerate(units)}
        order, stuck = topological_order(makers, rank=lambda u: u)
        if stuck:  # a plan whose lanes wait on each other in a circle: a bug of ours
            raise ExecutionError(f"plan of {self.graph.name!r}: the lane segments of steps "
                                 f"{[units[u] for u in stuck][:3]} wait on each other")
        return order

    def _emit(self, item: Item, members: list[int], session: Any) -> int:
        self.items.append(item)
        self.members.append(members)
        self.sessions.append(session)
        for m in members:
            self.item_of[m] = item.id
        return item.id

    def segment(self, run: Sequence[int]) -> Segment:
        """The steps ``run`` as a :class:`Segment`: what they read from outside, what is read after."""
        steps = self.plan.steps
        inside = set(run)
        produced: set[int] = set()
        ins: list[int] = []
        for s in run:
            for slot in steps[s].inputs:
                if slot not in produced and slot not in ins:
                    ins.append(slot)
            produced.update(steps[s].outputs)
        outputs = set(self.plan.output_slots)
        outs = [slot for s in run for slot in steps[s].outputs
                if slot in outputs or self.readers.get(slot, set()) - inside]
        if not outs:  # a segment nothing reads (a graph built with dead nodes): keep its last value
            outs = [steps[run[-1]].outputs[0]]
        first, last = steps[run[0]].label, steps[run[-1]].label
        return Segment(tuple(run), tuple(ins), tuple(outs), tuple(f for s in run for f in steps[s].frees),
                       first if len(run) == 1 else f"{first}..{last}")

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

from opsched.backends.lanes import Item, Program
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

    # --- the cut --------------------------------------------------------------------------------
    def build(self) -> Program:
        phases = []
        for phase in self.plan.phases:
            threads = max(1, self.cores // len(phase.lanes))
            phases.append([self._lane(lane, threads) for lane in phase.lanes])
        steps = self.plan.steps

        def with_waits(i: int) -> Item:
            item = self.items[i]
            waits = {self.item_of[w] for m in self.members[i] for w in steps[m].waits} - {item.id}
            return dataclasses.replace(item, waits=tuple(sorted(waits)))

        program_phases = tuple(tuple(tuple(with_waits(i) for i in lane) for lane in lanes) for lanes in phases)
        return Program(program_phases, tuple(p.frees for p in self.plan.phases), len(self.items),
                       len(self.plan.slot_names), self.plan.input_slots, self.plan.output_slots, encode=self.encode,
                       decode=self.decode, sessions=tuple(self.sessions))

    def _lane(self, lane: Sequence[int], threads: int) -> list[int]:
        built: list[int] = []
        run: list[int] = []

        def close() -> None:
            if run:
                item, session = self.segment_item(self.segment(run), threads)
                built.append(self._emit(item, list(run), session))
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
                built.append(self._emit(self.step_item(s), [s], None))
        close()
        return built

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

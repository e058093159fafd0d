"""Plans: what an executor runs, lowered once from a schedule.

A :class:`Plan` is a list of *phases*; a phase is a list of *lanes* that run at once; a lane is
an ordered list of :class:`Step` s. A step calls one bound kernel on value slots and writes its
output slot(s). Everything the per-call loop would otherwise decide is decided here, once:

* a stage of one group joins the phase before it when that phase also has one lane (IOS does
  not synchronise consecutive single-group stages); a stage of several groups is a phase of
  several lanes, with a barrier at its end;
* a merge stage (or a lane-based schedule's merge) is one step: the merged convolution
  (weights concatenated at plan time) whose output is split, as views, into its members'
  slots;
* a lane-based schedule runs its lanes at once; a step waits on the steps of other lanes it
  reads, or that the schedule's ``waits`` name (``Step.waits``). Where the lanes' order has a
  *cut*, a step that every other step either precedes or follows, the lanes are split into
  phases there, which changes no order: the single-lane stretches between cuts become
  one-lane phases (a CPU gives them every core, and ONNX Runtime runs them as one session);
* a slot whose readers all sit in one lane of one phase is freed right after its last reader
  there (``Step.frees``); a slot read across lanes or phases at the end of the phase of its
  last reader (``Phase.frees``); graph outputs never.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from opsched._toposort import topological_order
from opsched.ir import Graph
from opsched.runtime.kernels import ACTIVATION_FNS, Kernel, make_kernel
from opsched.schedule.merge import merged_conv, merged_parameters
from opsched.schedule.types import Schedule

__all__ = ["Step", "Phase", "Plan", "lower", "bind_step", "cut_segments", "step_label"]


@dataclass(frozen=True, slots=True)
class Step:
    label: str                  # node name, or "merge(a,b,...)"
    op: str
    nodes: tuple[str, ...]      # the graph nodes it computes (several for a merged convolution)
    kernel: Kernel
    inputs: tuple[int, ...]     # slots read
    outputs: tuple[int, ...]    # slots written (several for a merged convolution)
    waits: tuple[int, ...] = ()  # steps on other lanes that must have run (lane-based plans)
    frees: tuple[int, ...] = ()  # slots dead right after this step


@dataclass(frozen=True, slots=True)
class Phase:
    lanes: tuple[tuple[int, ...], ...]  # step indices per lane, in order
    frees: tuple[int, ...]              # slots dead once the phase is over


@dataclass(frozen=True)
class Plan:
    graph_hash: str
    steps: tuple[Step, ...]
    phases: tuple[Phase, ...]
    input_slots: tuple[int, ...]
    output_slots: tuple[int, ...]
    slot_names: tuple[str, ...]

    @property
    def max_lanes(self) -> int:
        return max((len(p.lanes) for p in self.phases), default=1)

    def peak_bytes(self, slot_bytes: list[int]) -> int:
        """Peak bytes of live values (inputs, outputs, intermediates). A one-lane phase is walked
        step by step; for a phase of several lanes, everything it writes counts as live at once
        (the lanes' relative timing is unknown here), which is an upper bound."""
        live = sum(slot_bytes[s] for s in self.input_slots)
        peak = live
        for phase in self.phases:
            if len(phase.lanes) == 1:
                for s in phase.lanes[0]:
                    live += sum(slot_bytes[o] for o in self.steps[s].outputs)
                    peak = max(peak, live)
                    live -= sum(slot_bytes[f] for f in self.steps[s].frees)
            else:
                steps = [s for lane in phase.lanes for s in lane]
                live += sum(slot_bytes[o] for s in steps for o in self.steps[s].outputs)
                peak = max(peak, live)
                live -= sum(slot_bytes[f] for s in steps for f in self.steps[s].frees)
            live -= sum(slot_bytes[s] for s in phase.frees)
        return peak


def step_label(nodes: Sequence[str]) -> str:
    """A step's name: its node's, or ``merge(a,b,...)`` for a merged convolution."""
    return nodes[0] if len(nodes) == 1 else f"merge({','.join(nodes)})"


def cut_segments(plan: Plan, positions: Sequence[int]) -> Plan:
    """A plan of one one-lane phase, cut into consecutive one-lane phases before each of the step
    positions ``positions``: the same steps in the same order, run as separate segments. (What a
    cut costs is measured with it.) A step's own frees stay right: each is at its slot's last reader."""
    if len(plan.phases) != 1 or len(plan.phases[0].lanes) != 1:
        raise ValueError(f"only a plan of one one-lane phase can be cut into segments; this one has "
                        f"{len(plan.phases)} phases of up to {plan.max_lanes} lanes")
    (lane,) = plan.phases[0].lanes
    bounds = [0, *sorted({p for p in positions if 0 < p < len(lane)}), len(lane)]
    phases = [Phase((lane[a:b],), ()) for a, b in zip(bounds, bounds[1:])]
    phases[-1] = Phase(phases[-1].lanes, plan.phases[0].frees)
    return dataclasses.replace(plan, phases=tuple(phases))


def bind_step(step: Step, release: bool = True) -> Callable[[list[Any]], None]:
    """``step`` as a call on a run's slot list: read its inputs, write its outputs and, with
    ``release``, drop the slots that die right after it (an executor that releases slots itself,
    as the CUDA one does, passes ``False``)."""
    kernel, ins, outs = step.kernel, step.inputs, step.outputs
    frees = step.frees if release else ()
    if len(outs) == 1:
        (o,) = outs

        def run(slots: list[Any]) -> None:
            slots[o] = kernel(*[slots[i] for i in ins])
            for f in frees:
                slots[f] = None
    else:
        def run(slots: list[Any]) -> None:
            for slot, value in zip(outs, kernel(*[slots[i] for i in ins])):
                slots[slot] = value
            for f in frees:
                slots[f] = None
    return run


def _merged_kernel(graph: Graph, names: tuple[str, ...]) -> Kernel:
    spec = merged_conv(graph, names)
    weight, bias = merged_parameters(graph, spec)
    act: Callable[[torch.Tensor], torch.Tensor] | None = ACTIVATION_FNS.get(spec.act)
    bounds = [c1 for _, c1 in spec.channels[:-1]]
    sizes = [c1 - c0 for c0, c1 in spec.channels]

    def merged(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = F.conv2d(x, weight, bias, spec.stride, spec.padding, spec.dilation)
        if act is not None:
            y = act(y)
        return tuple(torch.split(y, sizes, dim=1)) if bounds else (y,)
    return merged


def _split_at_cuts(steps: list[Step], lanes: list[list[int]]) -> list[list[list[int]]]:
    """Phases of a lane-based plan, cut at the steps that every other step precedes or follows
    (in the order that data, lane order and waits impose). Waits on earlier phases are dropped:
    the phase boundary keeps them."""
    lane_of = {s: li for li, lane in enumerate(lanes) for s in lane}
    pos = {s: p for lane in lanes for p, s in enumerate(lane)}
    before: dict[int, set[int]] = {s: set(steps[s].waits) for s in lane_of}
    for lane in lanes:
        for p in range(1, len(lane)):
            before[lane[p]].add(lane[p - 1])
    after: dict[int, list[int]] = {s: [] for s in lane_of}
    for s, bs in before.items():
        for b in bs:
            after[b].append(s)
    topo, _ = topological_order(before)  # the schedule validated: nothing is stuck
    k_of = {s: k for k, s in enumerate(topo)}
    up = [0] * len(topo)    # ancestors, as bits of topological positions
    down = [0] * len(topo)  # descendants
    for k, s in enumerate(topo):
        for b in before[s]:
            up[k] |= up[k_of[b]] | 1 << k_of[b]
    for k in range(len(topo) - 1, -1, -1):
        for t in after[topo[k]]:
            down[k] |= down[k_of[t]] | 1 << k_of[t]
    everything = (1 << len(topo)) - 1
    cuts = [k for k in range(len(topo)) if up[k] | down[k] | 1 << k == everything]
    blocks: list[list[int]] = []
    start = 0
    for k in cuts:
        if k > start:
            blocks.append(topo[start:k])
        blocks.append([topo[k]])
        start = k + 1
    if start < len(topo):
        blocks.append(topo[start:])
    phases: list[list[list[int]]] = []
    phase_of: dict[int, int] = {}
    for block in blocks:
        by_lane: dict[int, list[int]] = {}
        for s in sorted(block, key=lambda s: (lane_of[s], pos[s])):
            by_lane.setdefault(lane_of[s], []).append(s)
        phase = list(by_lane.values())
        if len(phase) == 1 and phases and len(phases[-1]) == 1:
            phases[-1][0].extend(phase[0])  # no barrier between one-lane stretches
        else:
            phases.append(phase)
        for s in block:
            phase_of[s] = len(phases) - 1
    for s in lane_of:
        kept = tuple(w for w in steps[s].waits if phase_of[w] == phase_of[s])
        if kept != steps[s].waits:
            steps[s] = dataclasses.replace(steps[s], waits=kept)
    return phases


def lower(graph: Graph, schedule: Schedule) -> Plan:
    """Lower a validated ``schedule`` of ``graph`` to a plan."""
    schedule.validate(graph)
    slot_of: dict[str, int] = {}
    for name in [i.name for i in graph.inputs] + [n.name for n in graph.nodes]:
        slot_of[name] = len(slot_of)
    steps: list[Step] = []
    step_of_node: dict[str, int] = {}

    def add_step(names: tuple[str, ...], merge: bool) -> int:
        nodes = [graph.node(v) for v in names]
        if merge:
            kernel = _merged_kernel(graph, names)
            step = Step(step_label(names), "conv2d(merged)", names, kernel,
                        (slot_of[nodes[0].inputs[0]],), tuple(slot_of[v] for v in names))
        else:
            (node,) = nodes
            step = Step(node.name, node.op, names, make_kernel(graph, node),
                        tuple(slot_of[v] for v in node.inputs), (slot_of[node.name],))
        steps.append(step)
        for v in names:
            step_of_node[v] = len(steps) - 1
        return len(steps) - 1

    raw_phases: list[list[list[int]]] = []
    if schedule.lanes is not None:
        merge_of = {m[0]: m for m in schedule.merges}
        inside = {v for m in schedule.merges for v in m[1:]}
        lanes = [[add_step(merge_of[v], True) if v in merge_of else add_step((v,), False)
                  for v in lane if v not in inside] for lane in schedule.lanes]
        lane_of = {s: li for li, lane in enumerate(lanes) for s in lane}
        ordered: dict[str, set[str]] = {}
        for a, b in schedule.waits:
            ordered.setdefault(a, set()).add(b)
        for li, lane in enumerate(lanes):
            for s in lane:
                before = {u for v in steps[s].nodes for u in graph.node(v).inputs if u in graph.index}
                before |= {u for v in steps[s].nodes for u in ordered.get(v, ())}
                producers = {step_of_node[v] for v in before} - {s}
                waits = tuple(sorted(p for p in producers if lane_of[p] != li))
                steps[s] = dataclasses.replace(steps[s], waits=waits)
        raw_phases.extend(_split_at_cuts(steps, lanes))
    else:
        for stage in schedule.stages:
            if stage.strategy == "merge":
                lanes = [[add_step(stage.nodes, True)]]
            else:
                lanes = [[add_step((v,), False) for v in group] for group in stage.groups]
            if len(lanes) == 1 and raw_phases and len(raw_phases[-1]) == 1:
                raw_phases[-1][0].extend(lanes[0])  # no barrier between single-lane stages
            else:
                raw_phases.append(lanes)
    # Free each slot as early as the plan allows.
    where = {s: (k, li, pos) for k, lanes in enumerate(raw_phases) for li, lane in enumerate(lanes)
             for pos, s in enumerate(lane)}
    readers: dict[int, list[int]] = {}
    for s, step in enumerate(steps):
        for slot in step.inputs:
            readers.setdefault(slot, []).append(s)
    keep = {slot_of[v] for v in graph.outputs}
    frees: list[list[int]] = [[] for _ in raw_phases]
    step_frees: dict[int, list[int]] = {}
    for slot, rs in readers.items():
        if slot in keep:
            continue
        places = {where[s][:2] for s in rs}
        if len(places) == 1:  # one lane of one phase: free after its last reader there
            last = max(rs, key=lambda s: where[s][2])
            step_frees.setdefault(last, []).append(slot)
        else:
            frees[max(where[s][0] for s in rs)].append(slot)
    for s, slots in step_frees.items():
        steps[s] = dataclasses.replace(steps[s], frees=tuple(sorted(slots)))
    phases = tuple(Phase(tuple(tuple(lane) for lane in lanes), tuple(sorted(f))) for lanes, f in zip(raw_phases, frees))
    return Plan(schedule.graph_hash, tuple(steps), phases, tuple(slot_of[i.name] for i in graph.inputs),
                tuple(slot_of[v] for v in graph.outputs), tuple(slot_of))

"""Plans: what an executor runs, lowered once from a schedule. Plain data: indices and names.

A :class:`Plan` is a list of *phases*; a phase is a list of *lanes* that run at once; a lane is
an ordered list of :class:`Step` s. A step computes one node (or the members of a merged
convolution) from value slots into value slots. Each backend binds its own kernels, sessions or
CUDA graphs to the steps when it prepares an executor, never in the per-call loop. Everything
else the per-call loop would otherwise decide is decided here, once:

* the parts of the schedule between barriers run one after another; a part's lanes run at
  once, a step waiting on the steps of other lanes it reads, or that the schedule's ``waits``
  name (``Step.waits``);
* where a part's order has a *cut*, a step that every other step of the part either precedes
  or follows, the part is split into phases there, which changes no order: the single-lane
  stretches between cuts become one-lane phases (a CPU gives them every core, and ONNX Runtime
  runs them as one session); consecutive one-lane phases are one phase (IOS does not
  synchronise consecutive single-group stages);
* a merge is one step: the merged convolution, whose output is split, as views, into its
  members' slots;
* a slot whose readers all sit in one lane of one phase is freed right after its last reader
  there (``Step.frees``); a slot read across lanes or phases at the end of the phase of its
  last reader (``Phase.frees``); graph outputs never.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from opsched._toposort import topological_order
from opsched.ir import Graph
from opsched.schedule import Schedule, Stage
from opsched.schedule.validate import check_schedule

__all__ = ["Step", "Phase", "Plan", "lower", "lower_instances", "lower_stage",
           "cut_segments", "step_label", "plan_work", "MERGED_OP"]

#: The op of a step that runs a merged convolution.
MERGED_OP = "conv2d(merged)"


@dataclass(frozen=True, slots=True)
class Step:
    label: str                   # node name, or "merge(a,b,...)"
    op: str                      # the node's op, or MERGED_OP
    nodes: tuple[str, ...]       # the graph nodes it computes (several for a merged convolution)
    inputs: tuple[int, ...]      # slots read
    outputs: tuple[int, ...]     # slots written (one per node)
    waits: tuple[int, ...] = ()  # steps on other lanes of its phase that must have run
    frees: tuple[int, ...] = ()  # slots dead right after this step

    @property
    def merged(self) -> bool:
        return len(self.nodes) > 1


@dataclass(frozen=True, slots=True)
class Phase:
    lanes: tuple[tuple[int, ...], ...]  # step indices per lane, in order
    frees: tuple[int, ...]              # slots dead once the phase is over
    placements: tuple[int, ...] = ()    # per lane, its entry of Plan.placements (empty: all 0)

    def placement(self, lane: int) -> int:
        return self.placements[lane] if self.placements else 0


@dataclass(frozen=True)
class Plan:
    """Phases of lanes of steps over value slots; ``placements`` are the distinct (device,
    backend) pairs of the schedule's lanes (``None``: the executor's own)."""

    graph_hash: str
    steps: tuple[Step, ...]
    phases: tuple[Phase, ...]
    input_slots: tuple[int, ...]
    output_slots: tuple[int, ...]
    slot_names: tuple[str, ...]
    placements: tuple[tuple[str | None, str | None], ...] = ((None, None),)

    @property
    def max_lanes(self) -> int:
        return max((len(p.lanes) for p in self.phases), default=1)

    def peak_bytes(self, slot_bytes: Sequence[int]) -> int:
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        def ints(v: Sequence[int]) -> tuple[int, ...]:
            return tuple(int(x) for x in v)

        steps = tuple(Step(s["label"], s["op"], tuple(s["nodes"]), ints(s["inputs"]), ints(s["outputs"]),
                           ints(s["waits"]), ints(s["frees"])) for s in data["steps"])
        phases = tuple(Phase(tuple(ints(lane) for lane in p["lanes"]), ints(p["frees"]), ints(p["placements"]))
                       for p in data["phases"])
        return cls(data["graph_hash"], steps, phases, ints(data["input_slots"]), ints(data["output_slots"]),
                   tuple(data["slot_names"]), tuple((d, b) for d, b in data["placements"]))


def plan_work(plan: Plan) -> tuple[frozenset[object], ...]:
    """What ``plan`` runs, in which phase, on which lanes and placements, and what waits on what:
    two plans with the same work run the same kernels the same way, and racing them measures only
    noise. The order of steps in a one-lane phase is left out (ONNX Runtime orders a session's
    nodes itself; on torch's kernels it is the same kernels in another order); the order of a
    lane among several, which decides where a wait falls, is not."""
    def step(i: int) -> tuple[object, ...]:
        s = plan.steps[i]
        return s.op, s.nodes, tuple(plan.steps[w].label for w in s.waits)

    def lane(phase: Phase, k: int) -> tuple[object, object]:
        steps = (step(i) for i in phase.lanes[k])
        return plan.placements[phase.placement(k)], frozenset(steps) if len(phase.lanes) == 1 else tuple(steps)
    return tuple(frozenset(lane(phase, k) for k in range(len(phase.lanes))) for phase in plan.phases)


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


def lower(graph: Graph, schedule: Schedule) -> Plan:
    """Lower ``schedule`` (validated against ``graph`` first) to a plan."""
    return lower_instances(graph, schedule)[1]


def lower_instances(graph: Graph, schedule: Schedule) -> tuple[Graph, Plan]:
    """:func:`lower`, with the graph the plan's steps compute: ``graph`` itself, or for a
    schedule with splits its instance graph (:meth:`Schedule.instance_graph`), which is what an
    executor of the plan is prepared with."""
    target = check_schedule(schedule, graph)
    return target, _Lowering(target, schedule).plan()


def lower_stage(graph: Graph, stage: Stage) -> tuple[Graph, Plan]:
    """``stage`` cut out of ``graph`` as a graph of its own (its external inputs become graph
    inputs, its every node an output, so nothing is dead), lowered as a schedule of that one
    stage: what a cost model times."""
    sub = graph.subgraph(stage.nodes, name=f"{graph.name}.stage").replace(outputs=tuple(stage.nodes))
    return sub, lower(sub, Schedule.from_stages(sub.structural_hash(), [stage], graph_name=sub.name))


class _Lowering:
    """One schedule's lowering: slots, steps part by part, phases, frees."""

    def __init__(self, graph: Graph, schedule: Schedule) -> None:
        self.graph, self.schedule = graph, schedule
        names = [i.name for i in graph.inputs] + [n.name for n in graph.nodes]
        self.slot_of = {name: k for k, name in enumerate(names)}
        self.steps: list[Step] = []
        self.step_of_node: dict[str, int] = {}
        places = [(lane.device, lane.backend) for lane in schedule.lanes]
        self.placements = tuple(dict.fromkeys([(None, None), *places]))
        self.placement_of_lane = [self.placements.index(p) for p in places]
        self.phases: list[list[list[int]]] = []   # per phase, per lane, step indices
        self.phase_places: list[list[int]] = []   # per phase, per lane, its placement

    def plan(self) -> Plan:
        merge_of = {m[0]: m for m in self.schedule.merges}
        inside = {v for m in self.schedule.merges for v in m[1:]}
        ordered: dict[str, set[str]] = {}
        for a, b in self.schedule.waits:
            ordered.setdefault(a, set()).add(b)
        for part in self.schedule.regions():
            lanes = [[self._add_step(merge_of.get(v, (v,))) for v in nodes if v not in inside] for nodes in part]
            self._set_waits(lanes, ordered)
            self._split_at_cuts(lanes)
        frees = self._set_frees()
        g = self.graph
        phases = tuple(Phase(tuple(tuple(lane) for lane in lanes), tuple(sorted(f)), tuple(places))
                       for lanes, f, places in zip(self.phases, frees, self.phase_places))
        return Plan(self.schedule.graph_hash, tuple(self.steps), phases,
                    tuple(self.slot_of[i.name] for i in g.inputs), tuple(self.slot_of[v] for v in g.outputs),
                    tuple(self.slot_of), self.placements)

    def _add_step(self, names: tuple[str, ...]) -> int:
        nodes = [self.graph.node(v) for v in names]
        slot = self.slot_of
        if len(names) > 1:
            step = Step(step_label(names), MERGED_OP, names, (slot[nodes[0].inputs[0]],), tuple(slot[v] for v in names))
        else:
            (node,) = nodes
            step = Step(node.name, node.op, names, tuple(slot[v] for v in node.inputs), (slot[node.name],))
        self.steps.append(step)
        for v in names:
            self.step_of_node[v] = len(self.steps) - 1
        return len(self.steps) - 1

    def _set_waits(self, lanes: list[list[int]], ordered: dict[str, set[str]]) -> None:
        """Each step of a part waits for the steps of the part's other lanes it reads or is told
        to wait for (earlier parts are done: a barrier stands between)."""
        steps, graph = self.steps, self.graph
        lane_of = {s: li for li, lane in enumerate(lanes) for s in lane}
        for li, lane in enumerate(lanes):
            for s in lane:
                before = {u for v in steps[s].nodes for u in graph.node(v).inputs if u in graph.index}
                before |= {u for v in steps[s].nodes for u in ordered.get(v, ())}
                producers = {self.step_of_node[v] for v in before} - {s}
                waits = tuple(sorted(p for p in producers if p in lane_of and lane_of[p] != li))
                steps[s] = dataclasses.replace(steps[s], waits=waits)

    def _split_at_cuts(self, lanes: list[list[int]]) -> None:
        """A part's phases, cut at the steps that every other step precedes or follows (in the
        order that data, lane order and waits impose). Waits on earlier phases are dropped: the
        phase boundary keeps them."""
        steps = self.steps
        lane_of = {s: li for li, lane in enumerate(lanes) for s in lane}
        pos = {s: p for lane in lanes for p, s in enumerate(lane)}
        before: dict[int, set[int]] = {s: set(steps[s].waits) for s in lane_of}
        for lane in lanes:
            for p in range(1, len(lane)):
                before[lane[p]].add(lane[p - 1])
        phase_of: dict[int, int] = {}
        for block in _cut_blocks(before):
            by_lane: dict[int, list[int]] = {}
            for s in sorted(block, key=lambda s: (lane_of[s], pos[s])):
                by_lane.setdefault(lane_of[s], []).append(s)
            phase = list(by_lane.values())
            places = [self.placement_of_lane[li] for li in by_lane]
            if len(phase) == 1 and self.phases and len(self.phases[-1]) == 1 and self.phase_places[-1] == places:
                self.phases[-1][0].extend(phase[0])  # no barrier between one-lane stretches
            else:
                self.phases.append(phase)
                self.phase_places.append(places)
            for s in block:
                phase_of[s] = len(self.phases) - 1
        for s in lane_of:
            kept = tuple(w for w in steps[s].waits if phase_of[w] == phase_of[s])
            if kept != steps[s].waits:
                steps[s] = dataclasses.replace(steps[s], waits=kept)

    def _set_frees(self) -> list[list[int]]:
        """Free each slot as early as the plan allows; returns each phase's own frees."""
        steps = self.steps
        where = {s: (k, li, p) for k, lanes in enumerate(self.phases) for li, lane in enumerate(lanes)
                 for p, s in enumerate(lane)}
        readers: dict[int, list[int]] = {}
        for s, step in enumerate(steps):
            for slot in step.inputs:
                readers.setdefault(slot, []).append(s)
        keep = {self.slot_of[v] for v in self.graph.outputs}
        frees: list[list[int]] = [[] for _ in self.phases]
        step_frees: dict[int, list[int]] = {}
        for slot, rs in readers.items():
            if slot in keep:
                continue
            final = max(where[s][0] for s in rs)
            last_readers = [s for s in rs if where[s][0] == final]
            if len({where[s][1] for s in last_readers}) == 1:
                # the last phase that reads it reads it on one lane (earlier phases are over by
                # then): free after its last reader there
                last = max(last_readers, key=lambda s: where[s][2])
                step_frees.setdefault(last, []).append(slot)
            else:
                frees[final].append(slot)
        for s, slots in step_frees.items():
            steps[s] = dataclasses.replace(steps[s], frees=tuple(sorted(slots)))
        return frees


def _cut_blocks(before: dict[int, set[int]]) -> list[list[int]]:
    """Steps (``before``: each step's predecessors, every step a key) in a topological order,
    grouped into blocks: each *cut* (a step every other step precedes or follows) a block of its
    own, the steps between consecutive cuts one block."""
    after: dict[int, list[int]] = {s: [] for s in before}
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
    blocks: list[list[int]] = []
    start = 0
    for k in range(len(topo)):
        if up[k] | down[k] | 1 << k == everything:  # a cut
            if k > start:
                blocks.append(topo[start:k])
            blocks.append([topo[k]])
            start = k + 1
    if start < len(topo):
        blocks.append(topo[start:])
    return blocks

"""A peak-memory budget inside the IOS dynamic program: which stages a state may end with.

Concurrency costs memory: a stage of several groups holds every value its groups write at once
(on the H100, IOS plans peaked at up to 4x the single-stream graph's activations). With a
budget, the DP (:mod:`.ios_part`) admits an ending only if the stage's peak fits, so it finds
the fastest schedule whose every stage fits, not the fastest one, later filtered.

A stage's peak is bounded above the way :meth:`opsched.runtime.Plan.peak_bytes` counts a plan,
so a schedule the DP accepts lowers to a plan within the budget:

* *before* it: the values live once the units of the state it starts from have run: graph
  inputs and values made earlier that a unit still to run reads, and graph outputs;
* a stage of several groups, or a merge, is one phase of several lanes (or one step): everything
  its units write is live at once, on top of *before*;
* a stage of one group is one lane, walked unit by unit: a unit's first node runs beside what
  is live before it (what it reads included); the rest of its chain, once what nothing still to
  run reads is freed, beside the output of the node before each; then its value (what its last
  node writes) stays while anything still to run reads it. A node the unit absorbed because it
  reads nothing (a constant) runs right before its reader and counts with it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from opsched._toposort import bits
from opsched.ir import Graph
from opsched.schedulers.units import UnitGraph

__all__ = ["PartMemory", "chain_bytes"]


def chain_bytes(graph: Graph, unit: Sequence[str]) -> list[int]:
    """The bytes each node of ``unit``'s chain writes, each with those of the nodes that read
    nothing and that the unit runs right before it (:mod:`.units`): they are live together."""
    sizes, pending = [], 0
    for k, v in enumerate(unit):
        node = graph.node(v)
        if not node.inputs and k < len(unit) - 1:  # absorbed: held until its reader, next, has run
            pending += node.out.nbytes
        else:
            sizes.append(pending + node.out.nbytes)
            pending = 0
    return sizes


@dataclass(frozen=True)
class PartMemory:
    """Bytes live around one part's states (units local to the part, as bitmasks). Equal
    records admit the same stages, so a part's solution is reused only with an equal one."""

    budget: int
    always: int                              # values read after the part, earlier outputs, unread inputs
    outside: tuple[tuple[int, int], ...]     # (local readers, bytes) of inputs and earlier values read only in it
    inside: tuple[tuple[bool, int], ...]     # per local unit: (live after the part, its value's bytes)
    first: tuple[int, ...]                   # per local unit: its first node's value
    tail: tuple[int, ...]                    # per local unit: the most two consecutive values of its chain hold
    writes: tuple[int, ...]                  # per local unit: the bytes all its nodes write
    succ: tuple[int, ...]                    # per local unit: its successors in the part

    @classmethod
    def build(cls, ug: UnitGraph, part: Sequence[int], budget: int) -> PartMemory:
        g = ug.graph
        local = {u: i for i, u in enumerate(part)}
        first, last = part[0], part[-1]
        outputs = set(g.outputs)
        readers: dict[str, set[int]] = {}  # graph inputs and values made before the part -> units that read them
        for u in range(first, len(ug)):
            for v in ug.units[u]:
                for x in g.node(v).inputs:
                    if x not in g.index or ug.unit_of[x] < first:
                        readers.setdefault(x, set()).add(u)
        read = {x for n in g.nodes for x in n.inputs}
        input_bytes = {i.name: i.type.nbytes for i in g.inputs}
        always = sum(n for x, n in input_bytes.items() if x not in read)  # an input nothing reads is never freed
        always += sum(g.node(v).out.nbytes for v in outputs if v in g.index and ug.unit_of[v] < first
                      and v not in readers)
        outside = []
        for x, us in readers.items():
            nbytes = input_bytes[x] if x in input_bytes else g.node(x).out.nbytes
            if x in outputs or any(u > last for u in us):
                always += nbytes
            else:
                outside.append((sum(1 << local[u] for u in us), nbytes))
        inside, firsts, tails, writes = [], [], [], []
        for u in part:
            sizes = chain_bytes(g, ug.units[u])
            later = ug.units[u][-1] in outputs or any(s > last for s in ug.succs[u])
            inside.append((later, g.node(ug.units[u][-1]).out.nbytes))
            firsts.append(sizes[0])
            tails.append(max((a + b for a, b in zip(sizes, sizes[1:])), default=0))
            writes.append(sum(g.node(v).out.nbytes for v in ug.units[u]))
        succ = tuple(sum(1 << local[s] for s in ug.succs[u] if s in local) for u in part)
        return cls(budget, always, tuple(sorted(outside)), tuple(inside), tuple(firsts), tuple(tails),
                   tuple(writes), succ)

    def live(self, state: int) -> int:
        """Bytes live once the local units ``state`` have run."""
        succ = self.succ
        total = self.always
        for readers, nbytes in self.outside:
            if readers & ~state:
                total += nbytes
        for i, (later, nbytes) in enumerate(self.inside):
            if (state >> i) & 1 and (later or succ[i] & ~state):
                total += nbytes
        return total

    def stage_peak(self, rest: int, comps: Sequence[int], lanes: bool,
                   live: Callable[[int], int] | None = None) -> int:
        """The peak of a stage of groups ``comps`` (local masks) run once the units ``rest`` have:
        ``lanes`` where its groups run at once (or merged), else one group walked in order, what
        each unit reads freed once it has run. ``live``: :meth:`live`, or a cache of it."""
        live = live or self.live
        if lanes:
            return live(rest) + sum(self.writes[i] for c in comps for i in bits(c))
        state, peak = rest, 0
        for i in bits(comps[0]):  # in topological order, as the lane runs them
            # its first node runs beside all it reads; its other nodes, once what it read is
            # freed, beside the value before them (its own value, if it stays, counted once)
            peak = max(peak, live(state) + self.first[i])
            state |= 1 << i
            if self.tail[i]:
                later, value = self.inside[i]
                stays = later or self.succ[i] & ~state
                peak = max(peak, live(state) - (value if stays else 0) + self.tail[i])
        return peak

    def admits(self, stages: Sequence[Sequence[int]]) -> bool:
        """Whether every stage of a schedule of the part, each a list of local units run at once
        (one group each), keeps within the budget."""
        state = 0
        for stage in stages:
            comps = [1 << i for i in stage]
            if self.stage_peak(state, comps, len(comps) > 1) > self.budget:
                return False
            state |= sum(comps)
        return True

"""The traffic simulator: bytes moved per memory level, and latency, of an instance schedule
under a memory hierarchy.

The units run in the given order, each on its core (a unit on every core uses core 0's private
caches and every core's compute). Each node reads its inputs and weights and writes its output;
every cache level that persists data (per core where private, one where shared) is a fully
associative LRU of whole values. A read is served by the fastest level holding the value (the
DRAM where none does) and brings it into the faster levels; a write goes to the fastest level
that can hold the value. A value evicted from the last cache while someone will still read it is
written back to DRAM; a value no one will read again is dropped (its buffer is free). A view (a
slice of the batch) reads its source. A value larger than a level passes it by.

A node takes its compute time (its FLOPs at the device preset's efficiency for its category, on
its core or on all of them) plus, per level, its bytes over the level's bandwidth (a shared
level's split among the cores that share it), over the fraction of those cores' slots it
keeps busy (the analytic model's occupancy: an instance of a fraction of the batch may leave
most of a GPU's SMs idle). A unit starts when its core is free and the units
it reads are done. This is a model for comparing orders and groupings (tests, the ablation, the
picture), not a prediction of milliseconds.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from opsched.cost.analytic import parallel_work
from opsched.cost.hierarchy import Hierarchy, MemoryLevel
from opsched.ir import Graph, Node
from opsched.ir.schema import node_flops, op_schema
from opsched.schedulers.memory.binding import ALL, Binding
from opsched.schedulers.memory.instances import InstanceDag

__all__ = ["Traffic", "simulate"]


@dataclass(frozen=True)
class Traffic:
    """What a simulated run moved: bytes per level, per level per group (``-1``: pieces), and
    the run's latency."""

    bytes: Mapping[str, int]
    by_group: Mapping[int, Mapping[str, int]]
    latency_ms: float

    def __str__(self) -> str:
        moved = ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in self.bytes.items())
        return f"{self.latency_ms:.3f} ms simulated; moved {moved}"


class _Lru:
    """One cache: values by name with their sizes, least recently used first."""

    def __init__(self, level: MemoryLevel) -> None:
        self.level = level
        self.capacity = level.capacity or 0
        self.held: OrderedDict[str, int] = OrderedDict()
        self.used = 0

    def touch(self, key: str) -> bool:
        if key in self.held:
            self.held.move_to_end(key)
            return True
        return False

    def insert(self, key: str, size: int) -> list[tuple[str, int]]:
        """Hold ``key``; return what was evicted (nothing held if it is larger than the cache)."""
        if key in self.held or size > self.capacity:
            self.touch(key)
            return []
        out = []
        while self.used + size > self.capacity:
            old, old_size = self.held.popitem(last=False)
            self.used -= old_size
            out.append((old, old_size))
        self.held[key] = size
        self.used += size
        return out

    def drop(self, key: str) -> None:
        size = self.held.pop(key, None)
        if size is not None:
            self.used -= size


def simulate(dag: InstanceDag, order: Sequence[int], binding: Binding, hierarchy: Hierarchy) -> Traffic:
    """Run the units of ``dag`` in ``order`` on ``binding``'s cores under ``hierarchy``."""
    return _Simulation(dag, binding, hierarchy).run(order)


class _Simulation:
    def __init__(self, dag: InstanceDag, binding: Binding, hierarchy: Hierarchy) -> None:
        self.dag, self.binding, self.h = dag, binding, hierarchy
        self.g: Graph = dag.graph
        cached = [lv for lv in hierarchy.levels[:-1] if lv.persists]
        self.private = [lv for lv in cached if lv.shared_by == 1]
        shared = [_Lru(lv) for lv in cached if lv.shared_by > 1]
        self.caches = [[_Lru(lv) for lv in self.private] + shared for _ in range(hierarchy.cores)]
        self.bytes = {lv.name: 0 for lv in hierarchy.levels}
        self.by_group: dict[int, dict[str, int]] = {}
        self.readers: dict[str, int] = {}
        self.keep: set[str] = set()
        self.source: dict[str, str] = {}  # a view -> the value whose memory it reads

    def run(self, order: Sequence[int]) -> Traffic:
        self._count_readers(order)
        free = [0.0] * self.h.cores
        done = [0.0] * len(self.dag.units)
        for u in order:
            core = self.binding.cores[u]
            on = range(self.h.cores) if core == ALL else (core,)
            t = max([done[p] for p in self.dag.preds[u]] + [free[c] for c in on])
            group = self.by_group.setdefault(self.dag.units[u].group, {lv.name: 0 for lv in self.h.levels})
            for v in self.dag.units[u].nodes:
                if v in self.source:  # a view: its readers read its source
                    continue
                moved = self._node(self.g.node(v), self.caches[max(core, 0)])
                t += self._seconds(self.g.node(v), moved, core)
                for k, b in moved.items():
                    self.bytes[k] += b
                    group[k] += b
            done[u] = t
            for c in on:
                free[c] = t
        return Traffic(dict(self.bytes), {k: dict(v) for k, v in self.by_group.items()}, max(done, default=0.0) * 1e3)

    def _count_readers(self, order: Sequence[int]) -> None:
        """Views resolved to their sources; how many reads each value will have; what stays."""
        for n in self.g.nodes:
            if op_schema(n.op).is_view and n.inputs:  # (a view of nothing, e.g. a parameter's, reads nothing)
                self.source[n.name] = self.source.get(n.inputs[0], n.inputs[0])
        for u in order:
            for v in self.dag.units[u].nodes:
                if v not in self.source:
                    for x in self.g.node(v).inputs:
                        key = self.source.get(x, x)
                        self.readers[key] = self.readers.get(key, 0) + 1
        self.keep = {self.source.get(v, v) for v in self.g.outputs}

    def _node(self, node: Node, caches: list[_Lru]) -> dict[str, int]:
        """One node's reads and write through ``caches``: the bytes it moved per level."""
        moved = {lv.name: 0 for lv in self.h.levels}
        for x in node.inputs:
            key = self.source.get(x, x)
            self._read(caches, key, self.g.types[x].nbytes, moved)
            self.readers[key] -= 1
            if not self._live(key):
                for cs in self.caches:
                    for c in cs:
                        c.drop(key)
        for p in node.params:
            self._read(caches, f"param:{p}", self.g.param_types[p].nbytes, moved)
        self._write(caches, node.name, node.out.nbytes, moved, self._live(node.name))
        return moved

    def _live(self, key: str) -> bool:
        return not key.startswith("param:") and (self.readers.get(key, 0) > 0 or key in self.keep)

    def _read(self, caches: list[_Lru], key: str, size: int, moved: dict[str, int]) -> None:
        hit = next((k for k, c in enumerate(caches) if c.touch(key)), None)
        moved[(caches[hit].level if hit is not None else self.h.dram).name] += size
        for c in caches[: len(caches) if hit is None else hit]:
            self._evict(caches, c.insert(key, size), moved)

    def _write(self, caches: list[_Lru], key: str, size: int, moved: dict[str, int], live: bool) -> None:
        home = next((c for c in caches if size <= c.capacity), None)
        moved[(home.level if home is not None else self.h.dram).name] += size
        if live:
            for c in caches:
                self._evict(caches, c.insert(key, size), moved)

    def _evict(self, caches: list[_Lru], evicted: list[tuple[str, int]], moved: dict[str, int]) -> None:
        for key, size in evicted:
            if self._live(key) and not any(key in c.held for c in caches):
                moved[self.h.dram.name] += size  # a live value leaves the caches: written back

    def _seconds(self, node: Node, moved: Mapping[str, int], core: int) -> float:
        ins = [self.g.types[x] for x in node.inputs]
        params = [self.g.param_types[p] for p in node.params]
        w = parallel_work(self.g, node)
        cores = self.h.cores if core == ALL else 1
        compute = self.h.compute_s(node_flops(node, ins, params), w.category, cores)
        memory = sum(moved[lv.name] / (self.h.share_gbps(lv, cores) * 1e9) for lv in self.h.levels)
        return (compute + memory) / self.h.device.occupancy(w.elems, w.category, w.channels, self.h.slots(cores))

"""Task graphs on heterogeneous processors: what HEFT and PEFT schedule.

A :class:`TaskGraph` is the textbook form (Topcuoglu et al., 2002): tasks in topological order,
``w[i][p]`` the time of task ``i`` on processor ``p`` (infinite where ``p`` cannot run it), and
edges ``(i, k, data)`` whose communication time between processors ``p`` and ``q`` is
``comm(data, p, q)`` (0 when ``p == q``). :func:`task_graph` builds one from a graph and its
per-unit profiles, with the model's inputs and outputs as zero-time tasks pinned to the default
unit (the data starts and ends there). :class:`Timeline` places tasks with the insertion policy
both list schedulers share: a task starts in the earliest idle gap of the processor long enough
for it, after its inputs have arrived.
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from opsched.cost.unit_costs import UnitCosts
from opsched.ir import Graph

__all__ = ["TaskGraph", "TaskSchedule", "Timeline", "GraphTasks", "task_graph", "graph_tasks"]

Comm = Callable[[float, int, int], float]


def _uniform(data: float, p: int, q: int) -> float:
    return 0.0 if p == q else data


@dataclass(frozen=True)
class TaskGraph:
    w: tuple[tuple[float, ...], ...]
    edges: tuple[tuple[int, int, float], ...]
    comm: Comm = _uniform
    names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "w", tuple(tuple(float(x) for x in row) for row in self.w))
        widths = {len(row) for row in self.w}
        if len(widths) > 1:
            raise ValueError(f"every task needs a time per processor; rows have {sorted(widths)} entries")
        for i, k, _ in self.edges:
            if not 0 <= i < k < len(self.w):
                raise ValueError(f"edge {i}->{k}: tasks are numbered in topological order")
        for i, row in enumerate(self.w):
            if not any(math.isfinite(x) for x in row):
                raise ValueError(f"task {self.name(i)} runs on no processor")

    @property
    def n(self) -> int:
        return len(self.w)

    @property
    def processors(self) -> int:
        return len(self.w[0]) if self.w else 0

    def name(self, i: int) -> str:
        return self.names[i] if self.names else f"t{i + 1}"

    @cached_property
    def preds(self) -> tuple[tuple[tuple[int, float], ...], ...]:
        out: list[list[tuple[int, float]]] = [[] for _ in self.w]
        for i, k, d in self.edges:
            out[k].append((i, d))
        return tuple(tuple(x) for x in out)

    @cached_property
    def succs(self) -> tuple[tuple[tuple[int, float], ...], ...]:
        out: list[list[tuple[int, float]]] = [[] for _ in self.w]
        for i, k, d in self.edges:
            out[i].append((k, d))
        return tuple(tuple(x) for x in out)

    def mean_w(self, i: int) -> float:
        """Task ``i``'s time averaged over the processors that can run it."""
        return statistics.fmean(x for x in self.w[i] if math.isfinite(x))

    def mean_comm(self, data: float) -> float:
        """An edge's communication averaged over ordered pairs of distinct processors."""
        p = self.processors
        pairs = [(a, b) for a in range(p) for b in range(p) if a != b]
        return statistics.fmean(self.comm(data, a, b) for a, b in pairs) if pairs else 0.0


@dataclass(frozen=True)
class TaskSchedule:
    proc: tuple[int, ...]
    start: tuple[float, ...]
    finish: tuple[float, ...]

    @property
    def makespan(self) -> float:
        return max(self.finish, default=0.0)

    def order(self, p: int) -> list[int]:
        """Processor ``p``'s tasks by start time."""
        return sorted((i for i, q in enumerate(self.proc) if q == p), key=lambda i: (self.start[i], self.finish[i], i))


@dataclass
class Timeline:
    """Tasks placed so far: per processor, its busy intervals in order."""

    tasks: TaskGraph
    proc: dict[int, int] = field(default_factory=dict)
    start: dict[int, float] = field(default_factory=dict)
    finish: dict[int, float] = field(default_factory=dict)
    busy: list[list[tuple[float, float]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.busy = [[] for _ in range(self.tasks.processors)]

    def ready(self, i: int, p: int) -> float:
        """When task ``i``'s inputs are all on processor ``p`` (its predecessors placed)."""
        t = self.tasks
        return max((self.finish[m] + t.comm(d, self.proc[m], p) for m, d in t.preds[i]), default=0.0)

    def eft(self, i: int, p: int) -> tuple[float, float]:
        """(start, finish) of task ``i`` on ``p`` under the insertion policy."""
        w = self.tasks.w[i][p]
        if not math.isfinite(w):
            return math.inf, math.inf
        t = self.ready(i, p)
        for a, b in self.busy[p]:
            if t + w <= a:  # fits in the gap before this interval
                break
            t = max(t, b)
        return t, t + w

    def place_best(self, i: int, lookahead: Sequence[float] | None = None) -> None:
        """Place task ``i`` where it finishes earliest (plus ``lookahead[p]``, PEFT's optimistic
        cost, where given), in the earliest gap there; ties go to the lower-numbered processor."""
        options = [self.eft(i, p) for p in range(self.tasks.processors)]
        p = min(range(len(options)), key=lambda p: (options[p][1] + (lookahead[p] if lookahead else 0.0), p))
        s, f = options[p]
        self.proc[i], self.start[i], self.finish[i] = p, s, f
        if f > s:  # a zero-time task holds no interval
            bisect.insort(self.busy[p], (s, f))

    def result(self) -> TaskSchedule:
        n = self.tasks.n
        return TaskSchedule(tuple(self.proc[i] for i in range(n)), tuple(self.start[i] for i in range(n)),
                            tuple(self.finish[i] for i in range(n)))


@dataclass(frozen=True)
class GraphTasks:
    """A graph's task graph: task ``i`` is ``names[i]``, a node, or a pinned input/output task."""

    tasks: TaskGraph
    nodes: tuple[str | None, ...]  # per task, the node it is (None: an input or output task)


def graph_tasks(graph: Graph, costs: UnitCosts) -> GraphTasks:
    """The task graph of ``graph`` under ``costs``: one task per node, one zero-time task per
    model input (its source) and one sink reading every output, both pinned to the default unit;
    an edge per value a node reads, whose data is the value's number (``comm`` prices that
    value's copy over the link between the two units)."""
    platform = costs.platform
    home = platform.names.index(platform.default)
    pinned = tuple(0.0 if p == home else math.inf for p in range(len(platform.units)))
    names: list[str] = [f"input:{i.name}" for i in graph.inputs] + [n.name for n in graph.nodes] + ["outputs"]
    task_of = {v: k for k, v in enumerate(names[:-1])}
    task_of.update({i.name: k for k, i in enumerate(graph.inputs)})
    values: list[str] = []
    edges: list[tuple[int, int, float]] = []
    for node in graph.nodes:
        for v in dict.fromkeys(node.inputs):
            edges.append((task_of[v], task_of[node.name], float(len(values))))
            values.append(v)
    for v in dict.fromkeys(graph.outputs):
        edges.append((task_of[v], len(names) - 1, float(len(values))))
        values.append(v)
    units = platform.names

    def comm(data: float, p: int, q: int) -> float:
        return costs.copy_ms(values[int(data)], units[p], units[q])

    w = [pinned] * len(graph.inputs) + [costs.row(n.name) for n in graph.nodes] + [pinned]
    tasks = TaskGraph(tuple(w), tuple(edges), comm, tuple(names))
    return GraphTasks(tasks, (None,) * len(graph.inputs) + tuple(n.name for n in graph.nodes) + (None,))


def task_graph(w: Sequence[Sequence[float]], edges: Sequence[tuple[int, int, float]]) -> TaskGraph:
    """A textbook task graph: communication ``data`` between distinct processors, 0 on one."""
    return TaskGraph(tuple(tuple(r) for r in w), tuple(edges))

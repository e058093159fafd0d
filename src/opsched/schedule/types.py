"""Schedules as data: lanes of nodes, the waits between lanes, merged convolutions, barriers.

A :class:`Schedule` is one form for every scheduler:

* ``lanes``: ordered node lists, each run in order on its own lane (a CUDA stream, a CPU
  thread), each with an optional device and backend. A node waits for its producers (an event
  where a producer sits on another lane);
* ``waits``: ordering edges that carry no data, ``(node, node it waits for)``: a resource-aware
  list scheduler adds them so that a node starts only once another has freed the device;
* ``merges``: convolutions that read one tensor and run as one wider convolution; the members
  of a merge stand next to each other, in order, in one lane;
* ``barriers``: points where every lane waits for every other. Barrier ``k`` is a tuple with one
  entry per lane, the number of that lane's nodes before it; everything before a barrier
  finishes before anything after it starts;
* ``splits``: groups of nodes computed as instances, each on its slice of the batch or band of rows
  (:mod:`opsched.transforms.split_instances`). The lanes then name the nodes of the graph so
  rewritten (:meth:`Schedule.instance_graph`): ``conv@0``, ``conv@1``, ...; ``graph_hash`` stays
  the model's own;
* ``cores``: on a CPU, how many cores the plan runs on (None: all); its lanes share them.

IOS's stages are a schedule with a barrier after each stage (:meth:`Schedule.from_stages`):
group ``i`` of every stage on lane ``i``, a merge stage on lane 0. Such a schedule prints in
IOS's nested ``Sequential(...)``/``Parallel(...)`` form and gives its stages back
(:attr:`Schedule.stages`). A :class:`Stage` is also what cost models price.

A schedule is plain data: it records the structural hash of the graph it was made for and
refuses to be applied to another (:meth:`Schedule.validate`); its JSON form is versioned and
reads every earlier version.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

from opsched._text import count
from opsched.errors import InvalidScheduleError
from opsched.ir import Graph
from opsched.schedule.validate import check_schedule, input_types
from opsched.transforms.split_instances import Split, split_instances

__all__ = ["Stage", "Lane", "Schedule", "Strategy", "FORMAT", "FORMAT_VERSION", "graph_batch", "read_json",
           "write_json"]

Strategy = Literal["parallel", "merge"]
FORMAT = "opsched.schedule"
#: 2: lanes, waits, merges and barriers (1: stages, or lanes with waits and merges).
FORMAT_VERSION = 2


@dataclass(frozen=True, slots=True)
class Stage:
    """Groups that run at once, each a chain run in order on its own lane (``parallel``), or
    convolutions that read one tensor run as one (``merge``; one node per group)."""

    groups: tuple[tuple[str, ...], ...]
    strategy: Strategy = "parallel"

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(tuple(g) for g in self.groups))
        if self.strategy not in ("parallel", "merge"):
            raise InvalidScheduleError(f"unknown stage strategy {self.strategy!r}; expected 'parallel' or 'merge'")
        if not self.groups or any(not g for g in self.groups):
            raise InvalidScheduleError(f"a stage needs non-empty groups, got {self.groups}")
        if self.strategy == "merge" and any(len(g) != 1 for g in self.groups):
            raise InvalidScheduleError(f"a merge stage has one convolution per group, got {self.groups}")

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(v for g in self.groups for v in g)

    @property
    def is_merge(self) -> bool:
        """Two or more convolutions run as one (a one-node merge stage runs like a parallel one)."""
        return self.strategy == "merge" and len(self.groups) > 1

    def __str__(self) -> str:
        if self.strategy == "merge":
            return "Merge(" + ", ".join(self.nodes) + ")"
        if len(self.groups) == 1:
            return "[" + ", ".join(self.groups[0]) + "]"
        return "Parallel(" + ", ".join("[" + ", ".join(g) + "]" for g in self.groups) + ")"


@dataclass(frozen=True, slots=True)
class Lane:
    """Nodes run in order on one lane; ``device`` (``"cuda:0"``) and ``backend`` (a registered
    backend's name) where it runs, ``None`` for the module's own."""

    nodes: tuple[str, ...]
    device: str | None = None
    backend: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "nodes", tuple(self.nodes))

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[str]:
        return iter(self.nodes)


def write_json(path: str | os.PathLike[str], data: Any) -> None:
    """``data`` as indented JSON at ``path``, written whole or not at all."""
    tmp = f"{os.fspath(path)}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)  # never leave a half-written file behind


def read_json(path: str | os.PathLike[str], what: str) -> Any:
    """The JSON at ``path``, which should hold ``what`` ("a schedule"); raises
    :class:`InvalidScheduleError` naming the file where it cannot be read or parsed."""
    source = os.fspath(path)
    try:
        with open(source, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise InvalidScheduleError(f"cannot read {what} from {source!r}: {e.strerror}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InvalidScheduleError(f"{source}: not JSON, so not {what} ({e})") from None


def graph_batch(graph: Graph) -> int:
    """The batch size a graph was imported with: its first input's leading dimension."""
    return graph.inputs[0].type.shape[0] if graph.inputs and graph.inputs[0].type.shape else 1


def _lane(value: Lane | Sequence[str]) -> Lane:
    return value if isinstance(value, Lane) else Lane(tuple(value))


@dataclass(frozen=True)
class Schedule:
    """What to run where and when, plus what it was made for (``graph_hash``, ``batch``, ...)."""

    graph_hash: str
    lanes: tuple[Lane, ...]
    waits: tuple[tuple[str, str], ...] = ()
    merges: tuple[tuple[str, ...], ...] = ()
    barriers: tuple[tuple[int, ...], ...] = ()
    graph_name: str = ""
    batch: int = 1
    device: str = ""
    scheduler: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    estimated_ms: float | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)
    splits: tuple[Split, ...] = ()
    #: The inputs of the graph it was made for (name: type, as ``f32[1,3,224,224]``), in order; what
    #: a mismatch names. Empty in schedules written before schedules recorded them.
    inputs: Mapping[str, str] = field(default_factory=dict)
    #: The CPU cores its plan runs on (a phase's lanes share them as intra-op threads), at most as
    #: many as the machine it runs on gives torch; None: all of those. A small model's one-session
    #: plan runs fastest on one (no thread to wake for each kernel), where optimize()'s race keeps it.
    cores: int | None = None

    def __post_init__(self) -> None:
        if self.cores is not None and (isinstance(self.cores, bool) or not isinstance(self.cores, int)
                                       or self.cores < 1):
            raise InvalidScheduleError(f"a schedule's cores is a positive number of CPU cores or None (all of "
                                       f"them), got {self.cores!r}")
        object.__setattr__(self, "lanes", tuple(_lane(lane) for lane in self.lanes))
        object.__setattr__(self, "splits", tuple(self.splits))
        object.__setattr__(self, "waits", tuple((str(a), str(b)) for a, b in self.waits))
        object.__setattr__(self, "merges", tuple(tuple(m) for m in self.merges))
        object.__setattr__(self, "barriers", tuple(tuple(int(p) for p in b) for b in self.barriers))

    @classmethod
    def from_stages(cls, graph_hash: str, stages: Iterable[Stage], **meta: Any) -> Schedule:
        """IOS's stages: group ``i`` of each stage on lane ``i`` (a merge stage on lane 0), and a
        barrier after every stage."""
        stages = list(stages)
        width = max((1 if s.is_merge else len(s.groups) for s in stages), default=1)
        lanes: list[list[str]] = [[] for _ in range(width)]
        merges, barriers = [], []
        for stage in stages:
            if stage.is_merge:
                lanes[0].extend(stage.nodes)
                merges.append(stage.nodes)
            else:
                for lane, group in zip(lanes, stage.groups):
                    lane.extend(group)
            barriers.append(tuple(len(lane) for lane in lanes))
        return cls(graph_hash, tuple(Lane(tuple(lane)) for lane in lanes), merges=tuple(merges),
                   barriers=tuple(barriers), **meta)

    # --- derived views ----------------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        return [v for lane in self.lanes for v in lane.nodes]

    def regions(self) -> list[tuple[tuple[str, ...], ...]]:
        """The parts between barriers (empty ones dropped): per part, each lane's nodes in it."""
        cuts = [tuple(0 for _ in self.lanes), *self.barriers, tuple(len(lane) for lane in self.lanes)]
        out = []
        for before, after in zip(cuts, cuts[1:]):
            part = tuple(lane.nodes[a:b] for lane, a, b in zip(self.lanes, before, after))
            if any(part):
                out.append(part)
        return out

    @cached_property
    def stages(self) -> tuple[Stage, ...] | None:
        """The stages, where this schedule has IOS's shape (barriers, no waits): each part between
        barriers is a stage whose groups are its lanes' nodes; a part that is one merge is a merge
        stage. ``None`` for a schedule of free-running lanes."""
        if not self.barriers or self.waits:
            return None
        merges = {m: m for m in self.merges}
        out = []
        for part in self.regions():
            groups = tuple(g for g in part if g)
            if len(groups) == 1 and groups[0] in merges:
                out.append(Stage(tuple((v,) for v in groups[0]), "merge"))
            else:
                out.append(Stage(groups))
        return tuple(out)

    def instance_graph(self, graph: Graph) -> Graph:
        """The graph this schedule's lanes name: ``graph`` with the splits applied (``graph``
        itself where there are none)."""
        return split_instances(graph, self.splits)

    def lane_items(self, lane: Lane | Sequence[str]) -> list[str]:
        """A lane's entries with each merge shown once, as ``merge(a,b,...)``."""
        first = {m[0]: m for m in self.merges}
        inside = {v for m in self.merges for v in m[1:]}
        nodes = lane.nodes if isinstance(lane, Lane) else lane
        return [f"merge({','.join(first[v])})" if v in first else v for v in nodes if v not in inside]

    def retarget(self, graph: Graph) -> Schedule:
        """This schedule applied to ``graph``: the same model at another batch size, input
        resolution or precision (same node names and wiring, other types). The result is
        validated against ``graph`` (every node once, dependencies, merges); it runs correctly
        but was tuned for the graph it was made for (see ``benchmarks/specialization.py``)."""
        moved = dataclasses.replace(self, graph_hash=graph.structural_hash(), graph_name=graph.name,
                                    batch=graph_batch(graph), inputs=input_types(graph), estimated_ms=None)
        return moved.validate(graph)

    def on_backend(self, backend: str) -> Schedule:
        """This schedule with every lane on ``backend``'s kernels: what a module of it, saved and
        loaded, runs on (a module of a schedule whose lanes name a backend runs there)."""
        return dataclasses.replace(self, lanes=tuple(dataclasses.replace(lane, backend=backend) for lane in self.lanes))

    def validate(self, graph: Graph) -> Schedule:
        """Check that this schedule fits ``graph`` and is executable; return ``self``.

        Raises :class:`~opsched.errors.ScheduleMismatchError` for a schedule made for another
        graph and :class:`~opsched.errors.InvalidScheduleError` (or
        :class:`~opsched.errors.IllegalMergeError`) naming the first offence: a node scheduled
        twice or never, a dependency that runs backwards, a merge of incompatible operators.
        """
        check_schedule(self, graph)
        return self

    # --- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        def lane(ln: Lane) -> list[str] | dict[str, Any]:
            if ln.device is None and ln.backend is None:
                return list(ln.nodes)
            return {"nodes": list(ln.nodes), "device": ln.device, "backend": ln.backend}

        return {
            "format": FORMAT, "version": FORMAT_VERSION,
            "graph": self.graph_name, "graph_hash": self.graph_hash, "batch": self.batch,
            **({"inputs": dict(self.inputs)} if self.inputs else {}),
            "device": self.device, "scheduler": self.scheduler, "options": dict(self.options),
            "estimated_ms": self.estimated_ms, "stats": dict(self.stats),
            "lanes": [lane(ln) for ln in self.lanes],
            "waits": [list(w) for w in self.waits],
            "merges": [list(m) for m in self.merges],
            "barriers": [list(b) for b in self.barriers],
            **({"splits": [s.to_dict() for s in self.splits]} if self.splits else {}),
            **({"cores": self.cores} if self.cores is not None else {}),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> Schedule:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise InvalidScheduleError(f"{source}: not an opsched schedule (no \"format\": \"{FORMAT}\")")
        version = data.get("version")
        if version not in (1, FORMAT_VERSION):
            raise InvalidScheduleError(f"{source}: schedule format version {version!r}; this opsched reads "
                                       f"versions 1 to {FORMAT_VERSION}")
        try:
            meta = dict(graph_name=data.get("graph", ""), batch=int(data.get("batch", 1)),
                        device=data.get("device", ""), scheduler=data.get("scheduler", ""),
                        options=dict(data.get("options") or {}), estimated_ms=data.get("estimated_ms"),
                        stats=dict(data.get("stats") or {}),
                        inputs={str(k): str(v) for k, v in (data.get("inputs") or {}).items()},
                        cores=data.get("cores"))
            if version == 1 and data.get("lanes") is None:  # version 1's stage-based form
                stages = [Stage(tuple(tuple(g) for g in s["groups"]), s.get("strategy", "parallel"))
                          for s in data.get("stages") or ()]
                return cls.from_stages(data["graph_hash"], stages, **meta)
            return cls(data["graph_hash"], tuple(_lane_from(ln) for ln in data["lanes"]),
                       waits=tuple((a, b) for a, b in data.get("waits") or ()),
                       merges=tuple(tuple(m) for m in data.get("merges") or ()),
                       barriers=tuple(tuple(b) for b in data.get("barriers") or ()),
                       splits=tuple(Split(tuple(s["nodes"]), int(s["factor"]), int(s.get("axis", 0)))
                                    for s in data.get("splits") or ()),
                       **meta)
        except (KeyError, TypeError, ValueError, InvalidScheduleError) as e:
            raise InvalidScheduleError(f"{source}: malformed schedule: {type(e).__name__}: {e}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        write_json(path, self.to_dict())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Schedule:
        return cls.from_dict(read_json(path, "a schedule"), os.fspath(path))

    # --- printing ---------------------------------------------------------------------------
    def __str__(self) -> str:
        est = f", estimated {self.estimated_ms:.3f} ms" if self.estimated_ms is not None else ""
        cores = f", on {count(self.cores, 'core')}" if self.cores is not None else ""
        head = (f"Schedule of {self.graph_name or '?'} by {self.scheduler or '?'} "
                f"(batch {self.batch}{', ' + self.device if self.device else ''}{cores}{est})")
        stages = self.stages
        if stages is not None:
            body = ["  " + str(s) + ("," if i < len(stages) - 1 else "") for i, s in enumerate(stages)]
            return "\n".join([head + f": {len(stages)} stages", "Sequential(", *body, ")"])
        lines = []
        for i, lane in enumerate(self.lanes):
            where = ", ".join(f"{k}={v}" for k, v in (("device", lane.device), ("backend", lane.backend)) if v)
            lines.append(f"  Lane {i}{f' ({where})' if where else ''}: [" + ", ".join(self.lane_items(lane)) + "]")
        lines += [f"  {a} waits for {b}" for a, b in self.waits]
        lines += [f"  barrier after {list(b)} nodes of each lane" for b in self.barriers]
        lines += [f"  split {s.factor} ways along {s.along}: {', '.join(s.nodes)}" for s in self.splits]
        return "\n".join([head + f": {len(self.lanes)} lanes", *lines])


def _lane_from(value: Any) -> Lane:
    if isinstance(value, Mapping):
        return Lane(tuple(value["nodes"]), value.get("device"), value.get("backend"))
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return Lane(tuple(value))
    raise TypeError(f"a lane is a list of node names or an object with \"nodes\", got {value!r}")

"""Schedules as data: stages of concurrent groups (IOS) or barrier-free lanes (list scheduling).

A :class:`Schedule` is either

* **stage-based**: ``stages`` run one after another; within a ``parallel`` stage each group is
  a chain run in order on its own lane and the groups run at once; a ``merge`` stage's
  convolutions (which read one tensor) run as one wider convolution; or
* **lane-based**: ``lanes`` are ordered node lists, one per lane, with no barriers; a node waits
  for its producers (an event where a producer sits on another lane) and for the nodes that
  ``waits`` names for it: ordering edges that carry no data, which a resource-aware list
  scheduler adds so that a node starts only once another has freed the device for it; the
  convolutions of each of ``merges`` stand next to each other in one lane and run as one
  merged convolution.

Both lower to the same execution plan. A schedule is plain data: it records the structural
hash of the graph it was made for and refuses to be applied to another.
"""

from __future__ import annotations

import dataclasses

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from opsched._toposort import kahn
from opsched.errors import IllegalMergeError, InvalidScheduleError, ScheduleMismatchError
from opsched.ir import Graph
from opsched.schedule.merge import check_merge

__all__ = ["Stage", "Schedule", "Strategy", "FORMAT", "FORMAT_VERSION", "graph_batch"]

Strategy = Literal["parallel", "merge"]
FORMAT = "opsched.schedule"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Stage:
    groups: tuple[tuple[str, ...], ...]
    strategy: Strategy = "parallel"

    def __post_init__(self) -> None:
        object.__setattr__(self, "groups", tuple(tuple(g) for g in self.groups))
        if self.strategy not in ("parallel", "merge"):
            raise InvalidScheduleError(f"unknown stage strategy {self.strategy!r}; expected 'parallel' or 'merge'")
        if not self.groups or any(not g for g in self.groups):
            raise InvalidScheduleError(f"a stage needs non-empty groups, got {self.groups}")

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(v for g in self.groups for v in g)

    def __str__(self) -> str:
        if self.strategy == "merge":
            return "Merge(" + ", ".join(v for g in self.groups for v in g) + ")"
        if len(self.groups) == 1:
            return "[" + ", ".join(self.groups[0]) + "]"
        return "Parallel(" + ", ".join("[" + ", ".join(g) + "]" for g in self.groups) + ")"


def graph_batch(graph: Graph) -> int:
    """The batch size a graph was imported with: its first input's leading dimension."""
    return graph.inputs[0].type.shape[0] if graph.inputs and graph.inputs[0].type.shape else 1


@dataclass(frozen=True)
class Schedule:
    """What to run when, plus what it was made for (``graph_hash``, ``batch``, ``device``...)."""

    graph_hash: str
    stages: tuple[Stage, ...] = ()
    lanes: tuple[tuple[str, ...], ...] | None = None
    waits: tuple[tuple[str, str], ...] = ()  # (node, node it must wait for), lane-based only
    merges: tuple[tuple[str, ...], ...] = ()  # convolutions run as one, lane-based only
    graph_name: str = ""
    batch: int = 1
    device: str = ""
    scheduler: str = ""
    options: Mapping[str, Any] = field(default_factory=dict)
    estimated_ms: float | None = None
    stats: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "stages", tuple(self.stages))
        if self.lanes is not None:
            object.__setattr__(self, "lanes", tuple(tuple(lane) for lane in self.lanes))
            if self.stages:
                raise InvalidScheduleError("a schedule has stages or lanes, not both")
        object.__setattr__(self, "waits", tuple((str(a), str(b)) for a, b in self.waits))
        object.__setattr__(self, "merges", tuple(tuple(m) for m in self.merges))
        if (self.waits or self.merges) and self.lanes is None:
            raise InvalidScheduleError("only a lane-based schedule has waits and merges; a stage-based one has "
                                       "barriers and merge stages")

    @property
    def is_lane_based(self) -> bool:
        return self.lanes is not None

    @property
    def nodes(self) -> list[str]:
        if self.lanes is not None:
            return [v for lane in self.lanes for v in lane]
        return [v for s in self.stages for v in s.nodes]

    @property
    def merged(self) -> tuple[tuple[str, ...], ...]:
        """Every merged convolution's members: the lane-based merges and the merge stages."""
        return self.merges + tuple(s.nodes for s in self.stages if s.strategy == "merge" and len(s.nodes) > 1)

    def lane_items(self, lane: tuple[str, ...]) -> list[str]:
        """A lane's entries with each merge shown once, as ``merge(a,b,...)``."""
        first = {m[0]: m for m in self.merges}
        inside = {v for m in self.merges for v in m[1:]}
        return [f"merge({','.join(first[v])})" if v in first else v for v in lane if v not in inside]

    def retarget(self, graph: Graph) -> Schedule:
        """This schedule applied to ``graph``: the same model at another batch size, input
        resolution or precision (same node names and wiring, other types). The result is
        validated against ``graph`` (every node once, dependencies, merges); it runs correctly
        but was tuned for the graph it was made for (see ``benchmarks/specialization.py``)."""
        moved = dataclasses.replace(self, graph_hash=graph.structural_hash(), graph_name=graph.name,
                                    batch=graph_batch(graph), estimated_ms=None)
        return moved.validate(graph)

    # --- the checker ------------------------------------------------------------------------
    def validate(self, graph: Graph) -> Schedule:
        """Check that this schedule fits ``graph`` and is executable; return ``self``.

        Raises :class:`ScheduleMismatchError` for a schedule made for another graph and
        :class:`InvalidScheduleError` (or :class:`IllegalMergeError`) naming the first offence:
        a node scheduled twice or never, a dependency that runs backwards, groups of one
        parallel stage that depend on each other, a merge of incompatible operators.
        """
        ghash = graph.structural_hash()
        if self.graph_hash != ghash:
            raise ScheduleMismatchError(
                f"this schedule was made for graph {self.graph_name or '?'} (structural hash "
                f"{self.graph_hash[:12]}), not for {graph.name!r} ({ghash[:12]}): re-run the scheduler "
                f"for this model, batch size, input shape and precision (or, for the same model at another "
                f"batch size, Schedule.retarget(graph) runs it untuned)")
        seen: dict[str, int] = {}
        for v in self.nodes:
            if v not in graph.index:
                raise InvalidScheduleError(f"schedule names {v!r}, which is not a node of graph {graph.name!r}")
            if v in seen:
                raise InvalidScheduleError(f"node {v!r} is scheduled twice")
            seen[v] = 1
        missing = [n.name for n in graph.nodes if n.name not in seen]
        if missing:
            raise InvalidScheduleError(f"{len(missing)} node(s) of {graph.name!r} are never scheduled, "
                                       f"e.g. {missing[:5]}")
        if self.lanes is not None:
            _check_lanes(graph, self.lanes, self.waits)
            _check_lane_merges(graph, self.lanes, self.merges)
        else:
            _check_stages(graph, self.stages)
        return self

    # --- JSON -------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {
            "format": FORMAT, "version": FORMAT_VERSION,
            "graph": self.graph_name, "graph_hash": self.graph_hash, "batch": self.batch,
            "device": self.device, "scheduler": self.scheduler, "options": dict(self.options),
            "estimated_ms": self.estimated_ms, "stats": dict(self.stats),
            "stages": [{"strategy": s.strategy, "groups": [list(g) for g in s.groups]} for s in self.stages],
            "lanes": None if self.lanes is None else [list(lane) for lane in self.lanes],
            "waits": [list(w) for w in self.waits],
            "merges": [list(m) for m in self.merges],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "<dict>") -> Schedule:
        if not isinstance(data, Mapping) or data.get("format") != FORMAT:
            raise InvalidScheduleError(f"{source}: not an opsched schedule (no \"format\": \"{FORMAT}\")")
        if data.get("version") != FORMAT_VERSION:
            raise InvalidScheduleError(f"{source}: schedule format version {data.get('version')!r}; this opsched "
                                       f"reads version {FORMAT_VERSION}")
        try:
            stages = tuple(Stage(tuple(tuple(g) for g in s["groups"]), s.get("strategy", "parallel"))
                           for s in data.get("stages") or ())
            lanes = data.get("lanes")
            return cls(graph_hash=data["graph_hash"], stages=stages,
                       lanes=None if lanes is None else tuple(tuple(lane) for lane in lanes),
                       waits=tuple((a, b) for a, b in data.get("waits") or ()),
                       merges=tuple(tuple(m) for m in data.get("merges") or ()),
                       graph_name=data.get("graph", ""), batch=int(data.get("batch", 1)),
                       device=data.get("device", ""), scheduler=data.get("scheduler", ""),
                       options=dict(data.get("options") or {}), estimated_ms=data.get("estimated_ms"),
                       stats=dict(data.get("stats") or {}))
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidScheduleError(f"{source}: malformed schedule: {type(e).__name__}: {e}") from None

    def save(self, path: str | os.PathLike[str]) -> None:
        tmp = f"{os.fspath(path)}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.to_dict(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)  # never leave a half-written schedule behind

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Schedule:
        source = os.fspath(path)
        try:
            with open(source) as f:
                data = json.load(f)
        except OSError as e:
            raise InvalidScheduleError(f"cannot read schedule {source!r}: {e.strerror}") from None
        except json.JSONDecodeError as e:
            raise InvalidScheduleError(f"{source}: not JSON (line {e.lineno}): {e.msg}") from None
        return cls.from_dict(data, source)

    # --- printing ---------------------------------------------------------------------------
    def __str__(self) -> str:
        est = f", estimated {self.estimated_ms:.3f} ms" if self.estimated_ms is not None else ""
        head = (f"Schedule of {self.graph_name or '?'} by {self.scheduler or '?'} "
                f"(batch {self.batch}{', ' + self.device if self.device else ''}{est})")
        if self.lanes is not None:
            body = [f"  Lane {i}: [" + ", ".join(self.lane_items(lane)) + "]" for i, lane in enumerate(self.lanes)]
            body += [f"  {a} waits for {b}" for a, b in self.waits]
            return "\n".join([head + f": {len(self.lanes)} lanes", *body])
        body = ["  " + str(s) + ("," if i < len(self.stages) - 1 else "") for i, s in enumerate(self.stages)]
        return "\n".join([head + f": {len(self.stages)} stages", "Sequential(", *body, ")"])


def _check_stages(graph: Graph, stages: Iterable[Stage]) -> None:
    done: set[str] = set()
    for k, stage in enumerate(stages):
        here = set(stage.nodes)
        group_of = {v: gi for gi, g in enumerate(stage.groups) for v in g}
        for gi, group in enumerate(stage.groups):
            earlier_in_group: set[str] = set()
            for v in group:
                for u in graph.node(v).inputs:
                    if u not in graph.index or u in done or u in earlier_in_group:
                        continue
                    if u in here:
                        if group_of[u] != gi:
                            raise InvalidScheduleError(
                                f"stage {k}: node {v!r} (group {gi}) reads {u!r} from group {group_of[u]} "
                                f"of the same parallel stage; groups of a stage must be independent")
                        raise InvalidScheduleError(f"stage {k}: node {v!r} runs before {u!r}, which it reads")
                    raise InvalidScheduleError(f"stage {k}: node {v!r} reads {u!r}, which is scheduled later")
                earlier_in_group.add(v)
        if stage.strategy == "merge":
            try:
                check_merge(graph, stage.nodes)
            except IllegalMergeError as e:
                raise IllegalMergeError(f"stage {k}: {e}") from None
            if any(len(g) != 1 for g in stage.groups):
                raise IllegalMergeError(f"stage {k}: a merge stage has one operator per group")
        done |= here


def _check_lanes(graph: Graph, lanes: tuple[tuple[str, ...], ...], extra: tuple[tuple[str, str], ...]) -> None:
    """Deadlock-free iff data edges, per-lane order and the waits can be ordered together."""
    waits: dict[str, set[str]] = {}
    for lane in lanes:
        for i, v in enumerate(lane):
            waits[v] = {u for u in graph.node(v).inputs if u in graph.index} | ({lane[i - 1]} if i else set())
    for a, b in extra:
        for v in (a, b):
            if v not in graph.index:
                raise InvalidScheduleError(f"a wait names {v!r}, which is not a node of graph {graph.name!r}")
        waits[a].add(b)
    stuck = kahn(waits)
    if stuck:
        raise InvalidScheduleError(f"lane order and waits contradict data dependencies (it would deadlock) at "
                                   f"{sorted(stuck)[:5]}")


def _check_lane_merges(graph: Graph, lanes: tuple[tuple[str, ...], ...], merges: tuple[tuple[str, ...], ...]) -> None:
    where = {v: (li, pos) for li, lane in enumerate(lanes) for pos, v in enumerate(lane)}
    merged: set[str] = set()
    for k, members in enumerate(merges):
        if len(members) < 2:
            raise IllegalMergeError(f"merge {k}: a merge needs two or more convolutions, got {list(members)}")
        for v in members:
            if v not in graph.index:
                raise InvalidScheduleError(f"merge {k} names {v!r}, which is not a node of graph {graph.name!r}")
            if v in merged:
                raise IllegalMergeError(f"merge {k}: node {v!r} is already in another merge")
            merged.add(v)
        lane, pos = where[members[0]]
        if any(where[v] != (lane, pos + j) for j, v in enumerate(members)):
            raise IllegalMergeError(f"merge {k}: its convolutions {list(members)} must stand next to each other, "
                                    f"in this order, in one lane")
        try:
            check_merge(graph, members)
        except IllegalMergeError as e:
            raise IllegalMergeError(f"merge {k}: {e}") from None

"""``torch.compile(model, backend="opsched")``: opsched as a backend of TorchDynamo.

The backend is registered through PyTorch's ``torch_dynamo_backends`` entry point (see
``pyproject.toml``), so after ``pip install opsched`` the name works with no import. Dynamo hands
over each graph it captures (a model with graph breaks hands over several); each becomes an
:class:`OpschedGraph`, which imports the graph, schedules it with :func:`opsched.optimize` and
runs the scheduled module in its place.

What Dynamo hands over and how it is met:

- **Weights arrive as graph inputs** (Dynamo lifts the parameters and buffers of the modules it
  inlines). They are frozen into the scheduled graph as constants, as inference compilers do, so
  that batch norms fold and convolutions merge. Dynamo does not guard on them, so every call
  checks that they are the very tensors, unchanged (``Tensor._version``), that the schedule was
  made with; another instance of the same class, or weights loaded in place, get a schedule of
  their own (counted as a recompile, with that reason). A new tensor in a weight's place with
  the values the plan was made with keeps the plan: torchvision's detectors assign their anchors
  anew at every call (a comparison of their values, a device sync on a GPU, instead of a plan
  rebuilt per call).
- **Shapes.** A plan is specialised to its input shapes: each concrete shape a graph is called
  with gets a plan of its own, a *bucket*. A graph that Dynamo made dynamic (after it saw a
  second shape) searches a schedule at its first shape and reapplies it at every later one
  (:meth:`~opsched.schedule.Schedule.retarget`: no search, no race; the import and the plan's
  build alone), as Dynamo itself compiles such a graph once for all its shapes: a decoding loop
  whose cache grows a token a step would otherwise pay a search every step.
  ``options={"specialize": "shape"}`` searches each shape anew (a batch-128 schedule ran batch
  1 at 1.20x the time of batch 1's own: ``docs/results/specialization.md``). New weights at a
  shape already searched reuse its schedule, whichever the setting: the search would price the
  same stages. Past ``max_shapes`` buckets (16) a graph runs further shapes as Dynamo captured
  them, eagerly, with a warning, keeping no bucket for them (:class:`AsCaptured` counts those
  calls): each plan holds its own sessions and constants. So, for good,
  does a dynamic graph whose shape was new at ``max_new_in_a_row`` (4) calls in a row: a plan
  pays off where its shape recurs, and a graph whose sizes follow the data (a detector's boxes)
  or grow a step at a time (a decoding loop's cache without padding) would build one per call.
  The shapes that hold a plan keep it, and a new shape gets one when it is met again. A static graph
  is called at the shapes it was captured for (Dynamo's guards send others to a new graph); where
  those guards were skipped (a ``guard_filter_fn``), another shape is refused, since the graph's
  sizes are constants in it. :func:`compiled_graphs` lists every graph, its buckets and its
  recompiles.
- **Graphs handed over again.** Dynamo captures a graph anew where only its guards differ (a
  call under ``inference_mode`` after ``no_grad``, the model compiled again after
  ``torch._dynamo.reset()``). Such a graph reapplies the schedule another graph of this process
  searched at the same inputs with the same options, where the two imports are the same to the
  last type (the schedule's own check), with no search: GoogLeNet's second graph took 1.2 s on
  this repository's CPU, against 5.0 s searched again.
- **Across processes** every schedule searched is kept in the schedule cache
  (:mod:`opsched.schedule_cache`, beside the profile store; the 1000 used last), and a graph that finds its key
  there loads it (an exact structural check, as a twin's) instead of searching:
  ``options={"schedule_cache": False}`` searches every time.
- **Each call** pays Dynamo's guards and its gathering of the lifted weights before the plan runs:
  0.3-4.2 ms on the zoo's CPU models right after a run, in two runs (``benchmarks/dynamo_overhead.py``).
- **Options** are :func:`opsched.optimize`'s keyword arguments, given as
  ``torch.compile(model, backend="opsched", options={"scheduler": "ios", "cost": "analytic"})``;
  the device is the inputs'. The profile store is the one :func:`opsched.optimize` uses (its
  ``cache_dir``). ``mode`` ``"max-autotune"`` races more schedulers (:data:`MODES`). What the
  backend takes, and its check at compile time, is :mod:`opsched.dynamo_options`.
- **What cannot be scheduled** (a graph opsched cannot import, a graph with nothing to compute)
  runs as Dynamo captured it, eagerly, with a warning that says why; ``options={"fallback": False}``
  raises instead.

The backend is for inference: call the compiled model under ``torch.no_grad()`` or
``torch.inference_mode()`` (a scheduled module computes no gradients, and says so).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import torch
from torch import fx

from opsched._text import count
from opsched.buckets import Shapes, describe, reapplied, shapes_of
from opsched.dynamo_admission import Admission
from opsched.dynamo_options import MODES, OPTIONS, OWN_OPTIONS, PLAN_NEUTRAL, REFUSED, OwnOption, checked_settings
from opsched.dynamo_report import AsCaptured, Bucket, CompiledGraphInfo, shapes_text
from opsched.errors import OpschedError
from opsched.frontends.dynamo_graph import frozen_module, is_lifted_weight, weights_written
from opsched.module import ScheduledModule
from opsched.schedule import Schedule
from opsched.schedule_cache import CacheKey, ScheduleCache

__all__ = ["backend", "OpschedGraph", "AsCaptured", "Bucket", "CompiledGraphInfo", "compiled_graphs", "report", "reset",
           "MODES", "OPTIONS", "OWN_OPTIONS", "OwnOption", "REFUSED"]

log = logging.getLogger(__name__)


class _Origin(NamedTuple):
    """Where a bucket's schedule came from, as :class:`Bucket` records it (all None: searched)."""

    schedule_of: int | None = None
    graph_of: int | None = None
    cached: str | None = None


class _Source(NamedTuple):
    """A searched bucket whose schedule a new bucket reapplies: that schedule and the backend it
    ran on, its place in its graph's buckets, and that graph's number where it is another graph
    (None: the same one)."""

    schedule: Schedule
    backend: str
    bucket: int
    graph: int | None = None


class _Searched(NamedTuple):
    """A bucket whose schedule is its own (searched for it, or loaded from the schedule cache)."""

    place: int                # in its graph's buckets
    shapes: tuple[Any, ...]   # its key but the weights: what its schedule was made for
    schedule: Schedule
    backend: str


@dataclasses.dataclass
class _Ledger:
    """What this process keeps of a graph Dynamo handed over: its report, and the schedules
    searched for it, which a twin graph reapplies (:meth:`OpschedGraph._twin`). It holds no
    module, weight or session, so a graph Dynamo lets go of (its model deleted, or
    ``torch._dynamo.reset()``) is freed with all its plans hold: kept whole, every graph had
    stayed for the life of the process (BERT compiled and dropped six times held six)."""

    index: int
    operators: int
    settings: dict[str, Any]
    admission: Admission
    buckets: list[Bucket] = dataclasses.field(default_factory=list)
    searched: list[_Searched] = dataclasses.field(default_factory=list)

    def info(self) -> CompiledGraphInfo:
        return CompiledGraphInfo(self.index, self.operators, tuple(self.buckets), self.settings["max_shapes"],
                                 tuple(self.admission.as_captured.values()))


_GRAPHS: list[_Ledger] = []
_LOCK = threading.Lock()


def compiled_graphs() -> tuple[CompiledGraphInfo, ...]:
    """Every graph the backend was handed in this process (since :func:`reset`), in order,
    whether or not Dynamo still holds it."""
    with _LOCK:
        return tuple(ledger.info() for ledger in _GRAPHS)


def report() -> str:
    """:func:`compiled_graphs` as text: per graph its buckets, schedules and recompiles."""
    graphs = compiled_graphs()
    if not graphs:
        return "opsched backend: no graph compiled"
    total = sum(g.recompiles for g in graphs)
    head = f"opsched backend: {count(len(graphs), 'graph')}, {count(total, 'recompile')}"
    return "\n".join([head, *map(str, graphs)])


def reset() -> None:
    """Forget the graphs compiled so far (``torch._dynamo.reset()`` forgets Dynamo's side; the
    schedule cache on disk stays: ``opsched cache clear`` empties it)."""
    with _LOCK:
        _GRAPHS.clear()


def backend(gm: fx.GraphModule, example_inputs: Sequence[Any], *, mode: str | None = None,
            options: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """The ``torch.compile`` backend: ``gm`` as an :class:`OpschedGraph`. Options are checked now,
    so a misspelt one fails at compile time, naming what is accepted."""
    settings = checked_settings(mode, dict(options or {}))
    graph = OpschedGraph(gm, example_inputs, settings)
    with _LOCK:
        graph.ledger.index = len(_GRAPHS)
        _GRAPHS.append(graph.ledger)
    return graph


_VERSION = operator.attrgetter("_version")
def _same_value(new: torch.Tensor, was: torch.Tensor, version: int) -> bool:
    """Whether the weight ``new`` holds what ``was`` held when a bucket was made from it at
    ``version``: the very tensor unchanged, or another of equal metadata and values."""
    if new is was:
        return new._version == version
    return (was._version == version and new.shape == was.shape and new.dtype == was.dtype
            and new.device == was.device and bool(torch.equal(new, was)))


def _signature(tensors: Sequence[torch.Tensor]) -> tuple[Shapes, tuple[str, ...]]:
    """Tensors' sizes and dtypes (a size may be a symbol, in a dynamic graph), and devices."""
    return shapes_of(tensors), tuple(str(t.device) for t in tensors)


def _described(signature: tuple[Shapes, tuple[str, ...]]) -> str:
    shapes, devices = signature
    return f"[{describe(shapes)}] on {', '.join(dict.fromkeys(devices))}"


class OpschedGraph:
    """One captured graph, run by scheduled modules, one per bucket (see the module docstring)."""

    def __init__(self, gm: fx.GraphModule, example_inputs: Sequence[Any], settings: Mapping[str, Any]) -> None:
        self.gm = gm
        self.settings = dict(settings)
        self.operators = sum(1 for n in gm.graph.nodes if n.op in ("call_function", "call_method", "call_module"))
        self.weights = tuple(i for i, a in enumerate(example_inputs) if is_lifted_weight(a))
        self.tensors = tuple(i for i, a in enumerate(example_inputs)
                             if isinstance(a, torch.Tensor) and i not in self.weights)
        self.ints = tuple(i for i, a in enumerate(example_inputs) if isinstance(a, (int, torch.SymInt))
                          and not isinstance(a, bool))
        self.writes_weights = weights_written(gm, self.weights)
        # Dynamo made the graph dynamic: it passes sizes as symbols (a SymInt, or a tensor sized by one)
        self.dynamic = any(isinstance(a, torch.SymInt) or isinstance(a, torch.Tensor)
                           and any(isinstance(d, torch.SymInt) for d in a.shape) for a in example_inputs)
        #: What a static graph was captured for: its sizes are constants in it.
        self.captured = _signature([example_inputs[i] for i in self.tensors])
        self._buckets: dict[tuple[Any, ...], tuple[Callable[..., Any], Bucket]] = {}
        self.cache = ScheduleCache(self.settings.get("cache_dir")) if self.settings["schedule_cache"] else None
        self._weights_seen: tuple[tuple[int, ...], tuple[int, ...]] | None = None
        self._admission = Admission(self.settings["max_shapes"], self.settings["max_new_in_a_row"], self.dynamic)
        #: The weights each bucket was made with, by its key (a new tensor in a weight's place is compared with them).
        self._made_with: dict[tuple[Any, ...], tuple[torch.Tensor, ...]] = {}
        self._lock = threading.Lock()
        #: What the process keeps of it (:func:`backend` numbers and registers it).
        self.ledger = _Ledger(-1, self.operators, self.settings, self._admission)

    @property
    def index(self) -> int:
        """Its number in this process."""
        return self.ledger.index

    def info(self) -> CompiledGraphInfo:
        return self.ledger.info()

    def __call__(self, *args: Any) -> Any:
        if self.writes_weights:  # new versions at every call: the graph as captured, one bucket saying why
            if not self._buckets:
                with self._lock:
                    if not self._buckets:
                        self._specialize(args, self._key(args))
            return self.gm(*args)
        key = self._key(args)
        found = self._buckets.get(key)
        if found is None:
            with self._lock:
                found = self._buckets.get(key) or self._same_values(args, key) or self._specialize(args, key)
            if found is None:  # a shape it keeps no plan for
                return self.gm(*args)
        else:
            self._admission.new_in_a_row = 0
        run, _ = found
        return run(*(args[i] for i in self.tensors))

    def _key(self, args: Sequence[Any]) -> tuple[Any, ...]:
        """What a bucket is made for: every weight's identity and version (in C loops: a model of a
        thousand weights pays tens of µs), the tensors' shapes, dtypes and devices, the integers."""
        weights = [args[i] for i in self.weights]
        return ((tuple(map(id, weights)), tuple(map(_VERSION, weights))),
                tuple((tuple(args[i].shape), args[i].dtype, args[i].device) for i in self.tensors),
                tuple(int(args[i]) for i in self.ints))

    def _same_values(self, args: Sequence[Any], key: tuple[Any, ...]) -> tuple[Callable[..., Any], Bucket] | None:
        """The bucket made at these inputs' shapes whose weights hold the values these do, where
        only tensors' identities changed, now under ``key``; None if there is none. A model that
        assigns a tensor attribute anew at each call, from the same values (torchvision's anchor
        generator moves its anchors with ``.to()`` on every call, which under Dynamo gives new
        tensors), would otherwise rebuild its plan at every call. A tensor changed in place (a
        new version of the very tensor a bucket holds) is never compared: its old values are gone."""
        weights = tuple(args[i] for i in self.weights)
        for old, held in self._made_with.items():
            if old[1:] == key[1:] and all(_same_value(new, was, version)
                                          for new, was, version in zip(weights, held, old[0][1], strict=True)):
                # re-keyed, not added: a bucket per call would pile up
                self._buckets = {key if k == old else k: v for k, v in self._buckets.items()}
                del self._made_with[old]
                self._made_with[key] = weights
                self._weights_seen = key[0]
                return self._buckets[key]
        return None

    def _specialize(self, args: Sequence[Any], key: tuple[Any, ...]) -> tuple[Callable[..., Any], Bucket] | None:
        """A new bucket for ``key``, or None where the graph keeps none for it and the call runs as
        captured (past ``max_shapes``, or after ``max_new_in_a_row``)."""
        inputs = tuple(args[i] for i in self.tensors)
        self._check_captured(inputs)
        reason = "first call" if not self._buckets else (
            "new weights" if key[0] != self._weights_seen else "new input shapes")
        new_shape = not any(k[1:] == key[1:] for k in self._buckets)
        if not self._admission.admits(len(self._buckets), new_shape, key[1:], tuple(tuple(t.shape) for t in inputs),
                                      self.index):
            return None
        self._weights_seen = key[0]
        weights = tuple(args[i] for i in self.weights)
        start = time.perf_counter()
        module = frozen_module(self.gm, [int(a) if i in self.ints else a for i, a in enumerate(args)], self.tensors,
                         f"CompiledGraph{self.index}")
        shapes, ints = tuple(tuple(t.shape) for t in inputs), key[2]
        why = self._unschedulable(inputs)
        if why is None:
            try:
                scheduled, origin = self._schedule(module, args, inputs, key)
            except OpschedError as e:
                if not self.settings["fallback"]:
                    raise
                why = str(e)
            else:
                return self._keep(key, weights, scheduled, Bucket(
                    shapes, ints, time.perf_counter() - start, scheduled.report().schedule, scheduled.backend.name,
                    reason=reason, **origin._asdict()))
        log.warning("opsched backend: graph %d with inputs %s runs eagerly: %s", self.index, list(shapes), why)
        return self._keep(key, weights, module, Bucket(shapes, ints, time.perf_counter() - start, None, None,
                                                       fallback=why, reason=reason))

    def _keep(self, key: tuple[Any, ...], weights: tuple[torch.Tensor, ...], run: Callable[..., Any],
              bucket: Bucket) -> tuple[Callable[..., Any], Bucket]:
        """Hold a new bucket, and the weights it was made with (:meth:`_same_values` compares them)."""
        self._made_with[key] = weights
        if isinstance(run, ScheduledModule) and bucket.schedule_of is None:
            self.ledger.searched.append(_Searched(len(self._buckets), key[1:], run.schedule, run.backend.name))
        self.ledger.buckets.append(bucket)
        self._buckets[key] = (run, bucket)
        return self._buckets[key]

    def _schedule(self, module: fx.GraphModule, args: Sequence[Any], inputs: tuple[torch.Tensor, ...],
                  key: tuple[Any, ...]) -> tuple[ScheduledModule, _Origin]:
        """The bucket's scheduled module, and where its schedule came from: a bucket's of this
        process reapplied (:meth:`_template`), else the schedule cache's, else searched now (and
        then cached)."""
        template = self._template(key)
        if template is not None:
            scheduled = self._load(module, inputs, template.schedule, template.backend, template.graph is None)
            if scheduled is not None:
                return scheduled, _Origin(template.bucket, template.graph)
        cache, cache_key = self.cache, self._cache_key(args, inputs[0].device)
        cached = None if cache is None or cache_key is None else cache.get(cache_key)
        if cached is not None:
            scheduled = self._load(module, inputs, cached.schedule, cached.backend, False,
                                   f" from the schedule cache ({cached.path})")
            if scheduled is not None:
                return scheduled, _Origin(cached=str(cached.path))
        start = time.perf_counter()
        scheduled = self._optimize(module, inputs)
        if cache is not None and cache_key is not None:
            about = {"operators": self.operators, "inputs": [list(t.shape) for t in inputs]}
            cache.put(cache_key, scheduled.schedule, scheduled.backend.name, time.perf_counter() - start, about)
        return scheduled, _Origin()

    def _cache_key(self, args: Sequence[Any], device: torch.device) -> CacheKey | None:
        """The schedule cache's key of a bucket: this graph's code, every tensor it is handed
        (weights included: the code does not hold their sizes), its integers, the settings."""
        if self.cache is None:
            return None
        tensors = tuple((tuple(a.shape), str(a.dtype)) for a in args if isinstance(a, torch.Tensor))
        ints = tuple(int(args[i]) for i in self.ints)
        settings = {k: v for k, v in self.settings.items() if k not in PLAN_NEUTRAL}
        return CacheKey.of(self.gm.code, tensors, ints, settings, device)

    def _template(self, key: tuple[Any, ...]) -> _Source | None:
        """The searched bucket whose schedule a new one reapplies: one of the same shapes (new
        weights), else, for a dynamic graph under ``specialize="graph"``, the first, else a twin's
        (:meth:`_twin`)."""
        searched = tuple(self.ledger.searched)  # one C call: another graph's thread may read it as this one adds
        same = [_Source(b.schedule, b.backend, b.place) for b in searched if b.shapes == key[1:]]
        if same:
            return same[0]
        if self.dynamic and self.settings["specialize"] == "graph" and searched:
            first = searched[0]
            return _Source(first.schedule, first.backend, first.place)
        return self._twin(key)

    def _twin(self, key: tuple[Any, ...]) -> _Source | None:
        """A bucket searched by another graph of this process at the same inputs, with as many
        operators and the same options, the latest first: Dynamo hands over a graph anew where
        only its guards differ (a call under ``inference_mode`` after ``no_grad``, the same model
        compiled again after ``torch._dynamo.reset()``), and its schedule is that graph's.
        It is reapplied only to a graph whose import is the same to the last type (the schedule's
        own check); any other is searched."""
        with _LOCK:
            twins = [g for g in reversed(_GRAPHS) if g is not self.ledger and g.operators == self.operators
                     and g.settings == self.settings]
        for ledger in twins:
            for b in tuple(ledger.searched):
                if b.shapes == key[1:]:
                    return _Source(b.schedule, b.backend, b.place, ledger.index)
        return None

    def _load(self, module: fx.GraphModule, inputs: tuple[torch.Tensor, ...], schedule: Schedule, backend: str,
              retarget: bool, source: str = "") -> ScheduledModule | None:
        """``schedule`` on ``module`` at these inputs, with no search; None where it does not fit
        (the import differs: at these shapes where ``retarget``, else at all), its plan exceeds
        the memory budget, or (from the schedule cache) it cannot run here any more."""
        from opsched.api import load

        s = self.settings
        where = f"graph {self.index} of the opsched backend at {shapes_text([t.shape for t in inputs])}{source}"
        try:
            return reapplied(lambda: load(module, schedule, inputs, device=inputs[0].device, backend=backend,
                                          graphs=s.get("graphs", True), tracer=s.get("tracer", "auto"),
                                          retarget=retarget, verify=s.get("verify", True)),
                             s.get("memory_budget"), where)
        except OpschedError as e:
            if not source:
                raise
            log.warning("opsched backend: %s is searched: the cached schedule cannot run here (%s)", where, e)
            return None

    def _check_captured(self, inputs: Sequence[torch.Tensor]) -> None:
        """Refuse inputs a static graph was not captured for. Dynamo's guards send such inputs
        to another graph; they reach this one only where those guards were skipped
        (``guard_filter_fn``), and the sizes in the graph are then wrong for them."""
        called = _signature(inputs)
        if self.dynamic or called == self.captured:
            return
        raise OpschedError(
            f"graph {self.index} of the opsched backend was captured by Dynamo for inputs {_described(self.captured)} "
            f"and is called with {_described(called)}: its sizes are constants in it, and Dynamo's guards, which "
            f"would have captured a graph for these inputs, were skipped (torch.compile's guard_filter_fn); keep "
            f"its tensor guards (torch.compiler.keep_tensor_guards_unsafe) or call it with the inputs it was "
            f"captured for")

    def _unschedulable(self, inputs: Sequence[torch.Tensor]) -> str | None:
        if not inputs:
            return "the graph reads no input tensor: it computes from its weights alone"
        if self.operators == 0:
            return "the graph computes nothing"
        if empty := [k for k, t in enumerate(inputs) if t.numel() == 0]:
            # optimize() refuses these as example inputs; the user gave none, so say what the graph met
            return (f"its input tensor {empty[0]} has shape {tuple(inputs[empty[0]].shape)}, with no elements (a "
                    f"batch with none of this kind, say): nothing to schedule")
        devices = {t.device.type for t in inputs}
        if len(devices) > 1:
            return f"its inputs are on several devices ({', '.join(sorted(devices))})"
        if self.writes_weights:  # a schedule's weights are constants, and optimize() runs the graph to check it
            return (f"it changes {', '.join(self.writes_weights)} in place (the model's state), which runs as "
                    f"without torch.compile")
        return None

    def _optimize(self, module: fx.GraphModule, inputs: tuple[torch.Tensor, ...]) -> ScheduledModule:
        from opsched.api import optimize

        options = {k: v for k, v in self.settings.items() if k not in OWN_OPTIONS}
        return optimize(module, inputs, device=inputs[0].device, **options)


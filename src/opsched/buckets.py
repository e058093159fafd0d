"""A model scheduled for each input shape it meets: :func:`optimize_per_shape`.

A schedule is specialised to its input shapes (the graph is imported at them, stages are priced
at them), so the module :func:`opsched.optimize` returns refuses a call of another shape. Models
served with inputs of a few shapes (sequence lengths padded up to a multiple of 64, a handful of
batch sizes) instead get a :class:`ShapeBuckets`: a drop-in module holding a scheduled module
per input shape, a *bucket*, each made on the first call of its shape, by :func:`opsched.optimize`
with the options given (its measurements go to the profile store, so a shape met again in a
later process costs a search, not a measurement), and reused after. ``save(path)`` writes every
bucket's schedule to one JSON file; :func:`load_per_shape` reapplies them, importing the model
at each saved shape on its first call, with no search.

A model with ``fixed_values`` (a vision tower's ``grid_thw``) is specialised to those inputs'
values too, so a bucket is made per shape and per fixed value: each image grid its own bucket.

Shapes are not unbounded: a bucket holds its own import and plan (and, on ONNX Runtime, its
sessions), so past ``max_shapes`` a call of a new shape is refused, naming the shapes held.

``specialize="graph"`` searches the first shape alone and reapplies its schedule at every later
one (:meth:`~opsched.schedule.Schedule.retarget`: an import and a plan's build, no search and no
race), where a search per shape costs more than the shapes' own schedules would save; a shape
whose import differs (an operator that only some sizes need) is searched.

An ONNX file whose sizes are open (a dynamic batch, a sequence length) is served the same way:
each bucket imports the file at its shapes (:func:`opsched.from_onnx`) and optimizes that graph
(:func:`opsched.optimize_graph`); the module is called as ONNX Runtime's session is fed, by the
file's input names (or in their order).
"""

from __future__ import annotations

import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from opsched._text import count
from opsched.errors import FrontendError, InputMismatchError, InvalidScheduleError, ScheduleMismatchError
from opsched.frontends.pytorch import Model, as_module
from opsched.ir import Graph
from opsched.module import ScheduledModule
from opsched.report import OptimizeReport
from opsched.schedule import Schedule, read_json, write_json
from opsched.structure import ExampleInputs, InputStructure, bind_example, holds_value

__all__ = ["InputForm", "OnnxSource", "ShapeBuckets", "ShapeBucketsReport", "Shapes", "optimize_per_shape",
           "load_per_shape", "shapes_of"]

log = logging.getLogger(__name__)

#: A graph input's shape and dtype, and its values (flattened) where it is one of ``fixed_values``.
InputForm = tuple[tuple[int, ...], str] | tuple[tuple[int, ...], str, tuple[Any, ...]]
#: Per graph input, its form: what a bucket is specialised to.
Shapes = tuple[InputForm, ...]

#: How many shapes a model's buckets hold by default.
MAX_SHAPES = 16
#: What ``specialize`` takes: a search per shape, or one, reapplied at every shape.
SPECIALIZE = ("shape", "graph")

#: What a file of buckets says it is.
FORMAT = "opsched-shape-buckets"
FORMAT_VERSION = 1

#: :func:`opsched.load`'s options among :func:`opsched.optimize`'s: what a saved bucket is loaded with.
LOAD_OPTIONS = ("device", "dtype", "channels_last", "graphs", "backend", "leaf_modules", "tracer",
                "fixed_values")
#: :func:`opsched.load_graph`'s, for an ONNX file's buckets.
LOAD_GRAPH_OPTIONS = ("device", "dtype", "channels_last", "graphs", "backend")


@dataclass(frozen=True)
class OnnxSource:
    """An ONNX file that buckets are imported from: its path, the inputs a call passes in the
    file's order (an initializer listed as an input, or one ``input_values`` fixes, is not one),
    and the values fixed."""

    path: str
    inputs: tuple[str, ...]
    input_values: Mapping[str, Any]

    @classmethod
    def of(cls, path: str | os.PathLike[str], input_values: Mapping[str, Any] | None) -> OnnxSource:
        from opsched.frontends.onnx_file import onnx_input_dims

        fixed = dict(input_values or {})
        return cls(os.fspath(path), tuple(n for n in onnx_input_dims(path) if n not in fixed), fixed)

    def tensors(self, example: ExampleInputs | None) -> tuple[torch.Tensor, ...]:
        """The example's tensors in the file's order: given by input name (the inputs
        ``input_values`` fixes too, at those values: ONNX Runtime's feeds), or in that order."""
        names = ", ".join(map(repr, self.inputs))
        if isinstance(example, Mapping):
            example = {name: value for name, value in example.items() if not self._holds(name, value)}
            if set(example) != set(self.inputs):
                raise InputMismatchError(f"{self.path} takes the inputs {names}, the example gives "
                                         f"{', '.join(map(repr, example)) or 'none'}")
            example = tuple(example[n] for n in self.inputs)
        elif isinstance(example, torch.Tensor):
            example = (example,)
        if not isinstance(example, Sequence) or len(example) != len(self.inputs) or \
                not all(isinstance(t, torch.Tensor) for t in example):
            raise InputMismatchError(f"optimize_per_shape() needs example inputs of {self.path}: a tensor per input "
                                     f"({names}), by name or in that order")
        return tuple(example)

    def _holds(self, name: str, value: Any) -> bool:
        """Whether ``value`` is given for input ``name`` as ``input_values`` fixes it; raises
        where it is given another."""
        if name not in self.input_values:
            return False
        fixed = np.asarray(self.input_values[name])
        if not holds_value(value, fixed.shape, fixed.tolist()):
            given = value.tolist() if hasattr(value, "tolist") else value
            raise InputMismatchError(f"{self.path}: the example gives input {name!r} the value {given!r}, "
                                     f"but input_values fixes it at {fixed.tolist()}")
        return True

    def graph(self, shapes: Shapes) -> Graph:
        """The file imported at ``shapes`` (one per input, in order)."""
        from opsched.frontends import from_onnx

        return from_onnx(self.path, input_shapes={n: form[0] for n, form in zip(self.inputs, shapes)},
                         input_values=self.input_values)



def input_form(shape: Sequence[int], dtype: str, values: Sequence[Any] | None = None) -> InputForm:
    if values is None:
        return tuple(int(n) for n in shape), dtype
    return tuple(int(n) for n in shape), dtype, tuple(values)


def shapes_of(tensors: Sequence[torch.Tensor], valued: Collection[int] = ()) -> Shapes:
    """Each tensor's shape and dtype, and the values of those numbered in ``valued``."""
    return tuple(input_form(t.shape, str(t.dtype).removeprefix("torch."), t.flatten().tolist() if k in valued else None)
                 for k, t in enumerate(tensors))


def describe(shapes: Shapes) -> str:
    """``1x16 int64, 1x16 int64``; a fixed input with its values, ``1x3 int64 = [1, 8, 8]``."""
    def one(shape: tuple[int, ...], dtype: str, *values: tuple[Any, ...]) -> str:
        text = f"{'x'.join(map(str, shape)) or 'scalar'} {dtype}"
        for v in values:
            text += f" = [{', '.join(map(str, v[:8]))}{', ...' if len(v) > 8 else ''}]"
        return text
    return ", ".join(one(*entry) for entry in shapes)


@dataclass(frozen=True)
class ShapeBucketsReport:
    """Every bucket's shapes and its module's report, in the order they were made."""

    model: str
    max_shapes: int
    buckets: tuple[tuple[Shapes, OptimizeReport], ...]

    def __str__(self) -> str:
        lines = [f"{self.model}: {count(len(self.buckets), 'input shape')} scheduled (at most {self.max_shapes})"]
        for shapes, report in self.buckets:
            lines.append(f"[{describe(shapes)}]")
            lines += [f"  {line}" for line in str(report).splitlines()]
        return "\n".join(lines)


class ShapeBuckets(nn.Module):
    """Returns what the model returns, by a scheduled module per input shape (see the module
    docstring). It is called as the model was with the example inputs; ``buckets`` maps each
    shape met to its :class:`~opsched.module.ScheduledModule`."""

    model: Model

    def __init__(self, model: Model | str | os.PathLike[str], example_inputs: ExampleInputs | None,
                 options: Mapping[str, Any], *, max_shapes: int = MAX_SHAPES, specialize: str = "shape",
                 saved: Mapping[Shapes, Schedule] | None = None) -> None:
        super().__init__()
        if not isinstance(max_shapes, int) or max_shapes < 1:
            raise InputMismatchError(f"max_shapes: a positive number of input shapes, got {max_shapes!r}")
        if specialize not in SPECIALIZE:
            raise InputMismatchError(f"specialize: one of {', '.join(map(repr, SPECIALIZE))}, got {specialize!r}")
        self.options = dict(options)
        self.max_shapes = max_shapes
        self.specialize = specialize
        self.saved: dict[Shapes, Schedule] = dict(saved or {})
        self._buckets: dict[Shapes, ScheduledModule] = {}
        self._lock = threading.Lock()
        self.source: OnnxSource | None = None  # the file, for an ONNX file's buckets
        if isinstance(model, (str, os.PathLike)):
            if not os.fspath(model).endswith(".onnx"):
                raise FrontendError(f"optimize_per_shape() takes a torch.nn.Module, a torch.export program or the path "
                                    f"of an .onnx file, got the path {os.fspath(model)!r}")
            self.source = OnnxSource.of(model, self.options.pop("input_values", None))
            object.__setattr__(self, "model", self.source.path)
            self.name = os.path.basename(self.source.path)
            tensors = self.source.tensors(example_inputs)
            self.inputs: InputStructure = self._make(tensors, shapes_of(tensors)).inputs
            return
        module, example_inputs, self.name = as_module(model, example_inputs, "optimize_per_shape()")
        object.__setattr__(self, "model", model)  # not a submodule: its parameters stay its own
        structure, tensors = bind_example(module.forward, example_inputs)
        self.inputs = structure  # how the model is called, whatever the shapes (and fixed values)
        self._make(tensors, self._key(tensors))

    @property
    def buckets(self) -> dict[Shapes, ScheduledModule]:
        return dict(self._buckets)

    def _apply(self, fn: Any, recurse: bool = True) -> ShapeBuckets:
        """``.to()``, ``.half()`` and their kin, as each bucket takes them
        (:meth:`ScheduledModule._apply`): nothing where they change neither device nor types,
        else refused, as the buckets made later would be made on and in what the options say."""
        for module in self._buckets.values():
            module._apply(fn, recurse)
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        tensors = self.inputs.tensors(args, kwargs)
        shapes = self._key(tensors)
        module = self._buckets.get(shapes)
        if module is None:
            with self._lock:  # two threads meeting a new shape at once make one bucket
                module = self._buckets.get(shapes)
                if module is None:
                    module = self._make(tensors, shapes)
        return module(*args, **kwargs)

    @functools.cached_property
    def _valued(self) -> tuple[int, ...]:
        """The graph inputs ``fixed_values`` names, by number: found once, not per call."""
        return self.inputs.inputs_within(self.options.get("fixed_values", ()))

    def _key(self, tensors: Sequence[torch.Tensor]) -> Shapes:
        """The bucket of a call whose graph inputs are ``tensors``: their shapes, and the values
        of those ``fixed_values`` names."""
        return shapes_of(tensors, self._valued)

    def _example(self, tensors: Sequence[torch.Tensor]) -> ExampleInputs:
        """The call whose graph inputs are ``tensors``, as :func:`opsched.optimize` takes example
        inputs: positional arguments, or keyword arguments where the call passes any."""
        args, kwargs = self.inputs.call(tensors)
        if not kwargs:
            return args
        signature = self.inputs.signature
        named = [] if signature is None else [p.name for p in signature.parameters.values()
                                               if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        return {**dict(zip(named, args)), **kwargs}

    def _make(self, tensors: Sequence[torch.Tensor], shapes: Shapes) -> ScheduledModule:
        """The bucket for ``shapes``, of a call whose graph inputs are ``tensors``: its saved
        schedule, the first bucket's reapplied (``specialize="graph"``), or optimized."""
        from opsched.api import optimize, optimize_graph

        model = self.model
        if len(self._buckets) >= self.max_shapes:
            held = "; ".join(f"[{describe(s)}]" for s in self._buckets)
            raise InputMismatchError(
                f"{self.name} called with inputs of shapes [{describe(shapes)}], a new bucket past "
                f"max_shapes={self.max_shapes} (held: {held}): pad inputs to a few shapes (sequence lengths rounded "
                f"up to a multiple of 64, say), or allow more shapes")
        start = time.perf_counter()
        saved, how = self.saved.get(shapes), "saved schedule"
        graph = None if self.source is None else self.source.graph(shapes)
        module = None if saved is None else self._load(graph, tensors, saved, retarget=False)
        if module is None and self.specialize == "graph" and self._buckets:
            first = next(iter(self._buckets.values()))
            how = f"the schedule of [{describe(next(iter(self._buckets)))}]"
            module = reapplied(lambda: self._load(graph, tensors, first.schedule, retarget=True,
                                                  backend=first.backend.name),
                               self.options.get("memory_budget"), f"{self.name} at [{describe(shapes)}]")
        if module is None:
            how = "searched"
            module = (optimize_graph(graph, **self.options) if graph is not None
                      else optimize(model, self._example(tensors), **self.options))
        log.info("opsched: %s scheduled for inputs [%s] (%s, %.1f s)", self.name, describe(shapes), how,
                 time.perf_counter() - start)
        self._buckets[shapes] = module
        return module

    def _load(self, graph: Graph | None, tensors: Sequence[torch.Tensor], sched: Schedule, *, retarget: bool,
              **overrides: Any) -> ScheduledModule:
        """``sched`` applied to the bucket's import (``graph`` for an ONNX file), with no search."""
        from opsched.api import load, load_graph

        if graph is not None:
            options = {k: v for k, v in self.options.items() if k in LOAD_GRAPH_OPTIONS} | overrides
            return load_graph(graph, sched, retarget=retarget, **options)
        options = {k: v for k, v in self.options.items() if k in LOAD_OPTIONS} | overrides
        return load(self.model, sched, self._example(tensors), retarget=retarget,
                    verify=retarget and self.options.get("verify", True), **options)

    def report(self) -> ShapeBucketsReport:
        return ShapeBucketsReport(self.name, self.max_shapes,
                                  tuple((shapes, m.report()) for shapes, m in self._buckets.items()))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Every bucket's schedule (and any loaded but not yet met), in one JSON file."""
        schedules = {**self.saved, **{shapes: m.schedule for shapes, m in self._buckets.items()}}
        data = {"format": FORMAT, "version": FORMAT_VERSION,
                "buckets": [{"inputs": [[list(shape), dtype, *map(list, values)] for shape, dtype, *values in shapes],
                             "schedule": s.to_dict()} for shapes, s in schedules.items()]}
        write_json(path, data)

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        del state["_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        state.setdefault("specialize", "shape")  # pickled before it was an option
        self.__dict__.update(state)
        self._lock = threading.Lock()


def reapplied(load: Callable[[], ScheduledModule], memory_budget: int | None, what: str) -> ScheduledModule | None:
    """The module ``load`` makes by reapplying a schedule at new shapes, or None where the
    schedule does not fit the import at them (another graph there: ``what`` is logged) or its
    plan holds more than ``memory_budget``: those shapes are searched instead."""
    try:
        module = load()
    except (InvalidScheduleError, ScheduleMismatchError) as e:
        log.info("opsched: %s is searched: the schedule reapplied does not fit (%s)", what, e)
        return None
    if memory_budget is not None and module.peak_bytes > memory_budget:
        return None  # larger inputs, more held at once: searched within the budget
    return module


def optimize_per_shape(model: Model | str | os.PathLike[str], example_inputs: ExampleInputs | None = None, *,
                       max_shapes: int = MAX_SHAPES, specialize: str = "shape", **options: Any) -> ShapeBuckets:
    """:func:`opsched.optimize` for a model called with inputs of several shapes: the module
    returned schedules ``example_inputs``' shapes now, and each new shape on its first call, with
    ``options`` (any of :func:`opsched.optimize`'s), up to ``max_shapes`` shapes.
    ``specialize="graph"`` searches ``example_inputs``' shapes alone and reapplies that schedule at
    each new shape, with no search (see the module docstring).

    ``model`` may be the path of an ONNX file whose sizes are open: each shape is imported
    (``input_values``, :func:`opsched.from_onnx`'s, fixes inputs at values) and optimized by
    :func:`opsched.optimize_graph` with ``options``; ``example_inputs`` are a tensor per input,
    by the file's input names or in their order."""
    return ShapeBuckets(model, example_inputs, options, max_shapes=max_shapes, specialize=specialize)


def load_per_shape(model: Model | str | os.PathLike[str], path: str | os.PathLike[str],
                   example_inputs: ExampleInputs | None = None, *,
                   max_shapes: int = MAX_SHAPES, specialize: str = "shape", **options: Any) -> ShapeBuckets:
    """Reapply the schedules a :class:`ShapeBuckets` saved: a shape saved is imported on its first
    call and runs its saved schedule, with no search (refused, as by :func:`opsched.load`, where
    the model is not the one it was made for); a shape not saved is optimized with ``options``,
    or, with ``specialize="graph"``, runs the first bucket's schedule (see the module docstring)."""
    source = os.fspath(path)
    data = read_json(path, "saved buckets")
    if not isinstance(data, dict) or data.get("format") != FORMAT or data.get("version") != FORMAT_VERSION:
        raise InvalidScheduleError(f"{source}: not saved buckets of version {FORMAT_VERSION} (no \"format\": "
                                   f"\"{FORMAT}\"); a single schedule loads with opsched.load")
    saved: dict[Shapes, Schedule] = {}
    try:
        for k, bucket in enumerate(data["buckets"]):
            shapes = tuple(input_form(shape, str(dtype), *values) for shape, dtype, *values in bucket["inputs"])
            saved[shapes] = Schedule.from_dict(bucket["schedule"], f"{source}, bucket {k}")
    except (KeyError, TypeError, ValueError) as e:
        raise InvalidScheduleError(f"{source}: malformed buckets: {type(e).__name__}: {e}") from None
    return ShapeBuckets(model, example_inputs, options, max_shapes=max_shapes, specialize=specialize, saved=saved)

"""The scheduler registry: each scheduler is a spec (its function, a typed options dataclass,
defaults per device), registered by its own module.

A scheduler is a function ``(graph, cost, options, progress) -> Schedule``; it asks the cost
model, never runs kernels. Its options are a frozen dataclass whose fields are typed, default
to what the algorithm wants, and say what they mean (``metadata["help"]``): :func:`schedule`
checks names, types and ranges against it (:func:`make_options`), the API layers device
defaults over it (:attr:`SchedulerSpec.defaults`), and the CLI makes its flags from it. The
concurrency limit has one name everywhere: ``max_lanes``.

    from opsched.schedulers import schedule
    sched = schedule(graph, "ios", AnalyticCostModel("V100"), max_group_size=3, max_lanes=8)
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from opsched.cost import CostModel, StageCoster, estimate_stages
from opsched.errors import ScheduleError
from opsched.ir import Graph
from opsched.progress import Progress
from opsched.schedule import Lane, Schedule, Stage, graph_batch, input_types
from opsched.transforms import Split

__all__ = ["SchedulerSpec", "Progress", "NoOptions", "register", "spec", "scheduler_names", "make_options",
           "schedule", "staged", "laned", "option", "positive", "RENAMED"]



class SchedulerFn(Protocol):
    def __call__(self, graph: Graph, cost: CostModel, options: Any, progress: Progress | None) -> Schedule: ...


@dataclass(frozen=True)
class NoOptions:
    """A scheduler without options."""


def _no_defaults(device_type: str, cores: int) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class SchedulerSpec:
    """A registered scheduler.

    ``defaults(device_type, cores)``: option values that suit a device better than the
    dataclass's own (on a CPU, no more lanes than cores: more only oversubscribe it).
    ``summarize(stats)``: one line about a schedule's ``stats``, for reports.
    """

    name: str
    run: SchedulerFn
    options: type[Any] = NoOptions
    summary: str = ""
    defaults: Callable[[str, int], dict[str, Any]] = _no_defaults
    summarize: Callable[[Mapping[str, Any]], str] | None = None


_SPECS: dict[str, SchedulerSpec] = {}

#: Options renamed since earlier versions: named in the error for the old name.
RENAMED = {"max_groups": "max_lanes", "max_streams": "max_lanes"}


def register(s: SchedulerSpec) -> SchedulerSpec:
    if s.name in _SPECS:
        raise ValueError(f"scheduler {s.name!r} is registered twice")
    if not dataclasses.is_dataclass(s.options):
        raise TypeError(f"scheduler {s.name!r}: options must be a dataclass, got {s.options!r}")
    _SPECS[s.name] = s
    return s


def spec(name: str) -> SchedulerSpec:
    if not isinstance(name, str):
        raise ScheduleError(f"a scheduler is named by a string, got {name!r} ({type(name).__name__}); "
                            f"available: {', '.join(_SPECS)}")
    try:
        return _SPECS[name]
    except KeyError:
        close = difflib.get_close_matches(name, _SPECS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ScheduleError(f"no scheduler {name!r}{hint}; available: {', '.join(_SPECS)}") from None


def scheduler_names() -> list[str]:
    return list(_SPECS)


def positive(owner: str, name: str, value: float | None, *, allow_none: bool = False) -> None:
    """Raise :class:`ScheduleError` unless ``value`` is positive (or None, where allowed)."""
    if value is None and allow_none:
        return
    if value is None or value <= 0:
        raise ScheduleError(f"option {name} of scheduler {owner!r} must be positive"
                            f"{' or None' if allow_none else ''}, got {value!r}")


def _fits(value: Any, hint: Any) -> bool:
    """Whether ``value`` has the type ``hint`` (the simple types options use)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, h) for h in typing.get_args(hint))
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is tuple:
        (inner, _) = typing.get_args(hint)
        return isinstance(value, (tuple, list)) and all(_fits(v, inner) for v in value)
    return isinstance(value, hint)


def make_options(name: str, values: Mapping[str, Any]) -> Any:
    """Scheduler ``name``'s options dataclass from ``values``: every name known, every value of
    its field's type; ranges are the dataclass's own to check."""
    s = spec(name)
    fields = {f.name: f for f in dataclasses.fields(s.options)}
    hints = typing.get_type_hints(s.options)
    unknown = sorted(set(values) - set(fields))
    if unknown:
        hints_ = []
        for k in unknown:
            new = RENAMED.get(k)
            close = [new] if new in fields else difflib.get_close_matches(k, fields, n=1)
            hints_.append(f"{k!r} (did you mean {close[0]!r}?)" if close else repr(k))
        raise ScheduleError(f"scheduler {name!r} has no option {', '.join(hints_)}; it takes "
                            f"{sorted(fields) or 'none'}")
    converted = {}
    for k, v in values.items():
        if not _fits(v, hints[k]):
            raise ScheduleError(f"option {k} of scheduler {name!r} must be {_type_name(hints[k])}, got {v!r} "
                                f"({type(v).__name__})")
        converted[k] = tuple(v) if isinstance(v, list) else v
    return s.options(**converted)


def _type_name(hint: Any) -> str:
    """``int | None`` for ``typing.Optional[int]`` and the like, as a user would write it."""
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def schedule(graph: Graph, scheduler: str, cost: CostModel, options: Any = None, *, progress: Progress | None = None,
             **values: Any) -> Schedule:
    """Run ``scheduler`` on ``graph`` under ``cost``; the result is validated before it is
    returned. Options come as a dataclass (``options=``) or as keywords, not both."""
    graph.verify()
    s = spec(scheduler)
    if options is None:
        options = make_options(scheduler, values)
    elif values:
        raise ScheduleError(f"give scheduler {scheduler!r} its options as a dataclass or as keywords, not both")
    elif not isinstance(options, s.options):
        raise ScheduleError(f"scheduler {scheduler!r} takes {s.options.__name__}, got {type(options).__name__}")
    return s.run(graph, cost, options, progress).validate(graph)


def _meta(graph: Graph, cost: CostModel, name: str, options: Any) -> dict[str, Any]:
    values = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(options).items()}  # as JSON
    return dict(graph_name=graph.name, batch=graph_batch(graph), device=cost.device, scheduler=name, options=values,
                inputs=input_types(graph))


def staged(graph: Graph, cost: CostModel, stages: list[Stage], name: str, options: Any,
           stats: Mapping[str, Any] | None = None, coster: StageCoster | None = None) -> Schedule:
    """A schedule of ``stages``, estimated by the cost model (the sum of its stages and cuts)."""
    return Schedule.from_stages(graph.structural_hash(), stages, **_meta(graph, cost, name, options),
                                estimated_ms=estimate_stages(graph, stages, coster or cost), stats=dict(stats or {}))


def laned(graph: Graph, cost: CostModel, lanes: list[list[str]] | tuple[tuple[str, ...], ...], name: str,
          options: Any, waits: tuple[tuple[str, str], ...] = (), merges: tuple[tuple[str, ...], ...] = (),
          estimated_ms: float | None = None, stats: Mapping[str, Any] | None = None,
          splits: tuple[Split, ...] = ()) -> Schedule:
    """A schedule of free-running lanes (over the instance graph of ``splits``, where given)."""
    return Schedule(graph.structural_hash(), tuple(Lane(tuple(lane)) for lane in lanes), waits=waits, merges=merges,
                    **_meta(graph, cost, name, options), estimated_ms=estimated_ms,
                    stats=dict(stats or {"lanes": len(lanes)}), splits=splits)


def option(default: Any, help: str) -> Any:  # noqa: A002 (the dataclass metadata key)
    """A documented option field: ``max_lanes: int = option(8, "...")``."""
    return field(default=default, metadata={"help": help})

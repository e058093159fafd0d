"""What an optimization is asked for, checked before any work: the device, the backend, the
schedulers and their options, the precision. :func:`opsched.optimize` checks its arguments here,
and so do the command line (before it loads a model) and the ``torch.compile`` backend (at
compile time, so that a misspelt option fails then), each with an error naming what is accepted."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from opsched.backends import resolve_backend
from opsched.errors import OpschedError, ScheduleError
from opsched.schedulers import make_options, spec
from opsched.schedulers.registry import RENAMED
from opsched.transforms.place import dtype_name

__all__ = ["DEVICES", "Request", "check_request", "check_device", "scheduler_names", "scheduler_options"]

#: The devices opsched runs on.
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class Request:
    """What :func:`optimize_graph` was asked for, checked: the device, the backend as named
    (``"auto"`` or a name; it runs there in the precision asked, and the graph's own dtypes,
    a bfloat16 model's, settle which one ``"auto"`` is), the schedulers (each with its options
    dataclass), the precision, and the further backends every plan also races on (``also_on``:
    the plans are made, and their stages priced, on ``backend``)."""

    device: torch.device
    backend: str
    schedulers: tuple[str, ...]
    options: Mapping[str, Any]
    dtype: str | None
    also_on: tuple[str, ...] = ()


def check_request(*, device: str | torch.device = "cpu", scheduler: str | Sequence[str] = "ios",
                  backend: str | Sequence[str] = "auto", dtype: str | torch.dtype | None = None,
                  **options: Any) -> Request:
    """Every argument of an optimization checked, before any work (the CLI asks this before it
    loads a model): an unknown device, backend, scheduler, option or precision is refused with
    an :class:`~opsched.errors.OpschedError` naming what is accepted."""
    dev = check_device(device)
    precision = None if dtype is None else dtype_name(dtype)
    backends = _names("backend", "a backend's", backend, lambda name: resolve_backend(
        name, dev, () if precision is None else (precision,)))
    names = scheduler_names(scheduler)
    per_scheduler = scheduler_options(names, dev.type, options)
    return Request(dev, backends[0], names, per_scheduler, precision, backends[1:])


def scheduler_names(scheduler: object) -> tuple[str, ...]:
    return _names("scheduler", "a scheduler's", scheduler, spec)


def _names(what: str, whose: str, given: object, check: Callable[[str], object]) -> tuple[str, ...]:
    """``given``, one name or a sequence of distinct ones, each ``check``-ed (an unknown name
    fails there, before any work)."""
    names = (given,) if isinstance(given, str) else given
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise ScheduleError(f"{what}: {whose} name or a sequence of names, got {given!r}")
    if not names:
        raise ScheduleError(f"{what}: name at least one {what}")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ScheduleError(f"{what}: {', '.join(map(repr, twice))} named twice in {list(names)}")
    for name in names:
        check(name)
    return tuple(names)


def scheduler_options(names: Sequence[str], device_type: str, values: Mapping[str, Any],
                      cores: int | None = None) -> dict[str, Any]:
    """Each scheduler's options dataclass: its device defaults, overridden by the ``values`` it
    takes. An option no scheduler of ``names`` takes is an error naming what each one takes."""
    cores = cores or os.cpu_count() or 1
    takes = {name: {f.name for f in dataclasses.fields(spec(name).options)} for name in names}
    unknown = sorted(k for k in values if not any(k in t for t in takes.values()))
    if unknown:
        hints = [f"{k!r} (renamed {RENAMED[k]!r})" if k in RENAMED else repr(k) for k in unknown]
        listing = "; ".join(f"{name} takes {sorted(t) or 'none'}" for name, t in takes.items())
        inputs = [k for k in unknown if any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(values[k]))]
        hint = (f"; {', '.join(map(repr, inputs))} holds tensors, but a model's inputs go in example_inputs: one "
                f"tensor, a tuple of positional arguments or a mapping of keyword arguments" if inputs else "")
        raise ScheduleError(f"no scheduler of {list(names)} has option {', '.join(hints)} ({listing}){hint}")
    out = {}
    for name in names:
        chosen = {k: v for k, v in spec(name).defaults(device_type, cores).items() if k in takes[name]}
        chosen.update((k, v) for k, v in values.items() if k in takes[name])
        out[name] = make_options(name, chosen)
    return out


def check_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        dev = None
    if dev is None or dev.type not in DEVICES:
        raise OpschedError(f"device {str(device)!r} is not supported by this opsched; supported: {', '.join(DEVICES)}")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise OpschedError(f"device {str(device)!r}: CUDA is not available on this machine (torch {torch.__version__}, "
                           f"torch.cuda.is_available() is False)")
    return dev

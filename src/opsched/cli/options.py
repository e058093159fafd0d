"""Scheduler flags from the schedulers' option dataclasses: one flag per option name, typed as
its field, documented by its ``metadata["help"]`` (so the CLI never repeats the options)."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["add_scheduler_flags", "scheduler_values"]


def _converter(hint: Any) -> Callable[[str], Any] | None:
    """A str -> value converter for a field type (None for booleans: they are switches)."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        (inner,) = [h for h in typing.get_args(hint) if h is not type(None)]
        return _converter(inner)
    if hint is bool:
        return None
    if typing.get_origin(hint) is tuple:
        return lambda text: tuple(part.strip() for part in text.split(",") if part.strip())
    return typing.cast(Callable[[str], Any], hint)


def add_scheduler_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--option-name`` per option of any registered scheduler (default: the scheduler's own,
    or its device default)."""
    from opsched.schedulers import scheduler_names, spec

    group = parser.add_argument_group("scheduler options", "each goes to the schedulers that take it")
    seen: dict[str, list[str]] = {}
    fields: dict[str, tuple[dataclasses.Field[Any], Any]] = {}
    for name in scheduler_names():
        options = spec(name).options
        hints = typing.get_type_hints(options)
        for f in dataclasses.fields(options):
            seen.setdefault(f.name, []).append(name)
            fields.setdefault(f.name, (f, hints[f.name]))
    for key, (f, hint) in fields.items():
        flag = "--" + key.replace("_", "-")
        text = f"{f.metadata.get('help', '')} [{', '.join(seen[key])}]"
        convert = _converter(hint)
        if convert is None:
            group.add_argument(flag, dest=f"opt_{key}", action=argparse.BooleanOptionalAction, default=None, help=text)
        else:
            group.add_argument(flag, dest=f"opt_{key}", type=convert, default=None, help=text)


def scheduler_values(args: argparse.Namespace) -> dict[str, Any]:
    """The scheduler options given on the command line (those not given keep their defaults)."""
    return {k.removeprefix("opt_"): v for k, v in vars(args).items() if k.startswith("opt_") and v is not None}

"""Scheduler flags from the schedulers' option dataclasses: one flag per option name, typed as
its field, documented by its ``metadata["help"]`` (so the CLI never repeats the options)."""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any

__all__ = ["add_scheduler_flags", "scheduler_values", "reference"]


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


#: Scheduler options a command sets through a flag of its own, in the unit people think in
#: (``--memory-budget`` takes MiB; the option is bytes).
OWN_FLAGS = ("memory_budget",)


def add_scheduler_flags(parser: argparse.ArgumentParser) -> None:
    """One ``--option-name`` per option of any registered scheduler (default: the scheduler's own,
    or its device default), but those in :data:`OWN_FLAGS`."""
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
        if key in OWN_FLAGS:
            continue
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


def reference(markdown: bool = False) -> str:
    """Every scheduler with its options (type, default, device default, meaning), every backend,
    every analytic device preset and memory hierarchy preset, as text or as the Markdown of ``docs/options.md``."""
    from opsched.backends import backend_names, get_backend
    from opsched.cost import DEVICES
    from opsched.cost.hierarchy import BUILTIN, HOST_PRESETS, hierarchy
    from opsched.schedulers import scheduler_names, spec

    lines = ["# Options", "",
             "Generated from the code by `opsched options --markdown` (`tests/test_cli.py` checks that this page "
             "is current).", "", "## Schedulers", "",
             "`opsched.optimize(model, x, scheduler=NAME, **options)`, `opsched.schedulers.schedule(graph, NAME, "
             "cost, **options)`, and the flags of `opsched optimize` and `opsched schedule` (`--max-lanes 4`).", ""]
    for name in scheduler_names():
        s = spec(name)
        lines += [f"### `{name}`", "", s.summary[:1].upper() + s.summary[1:] + ".", ""]
        fields = dataclasses.fields(s.options)
        if not fields:
            lines += ["No options.", ""]
            continue
        hints = typing.get_type_hints(s.options)
        lines += ["| option | type | default | on a CPU | meaning |", "|---|---|---|---|---|"]
        for f in fields:
            cpu = _cpu_default(s.defaults, f.name)
            kind = _type_text(hints[f.name]).replace("|", "\\|")  # a bar inside a Markdown table cell
            lines.append(f"| `{f.name}` | `{kind}` | `{f.default!r}` | {cpu} | {f.metadata.get('help', '')} |")
        lines.append("")
    lines += ["## Backends", "", "`backend=` of `optimize()`, `--backend` of the command line; `auto` picks the "
              "first available for the device. Several (`backend=(\"cuda\", \"cuda-inductor\")`, "
              "`--backend cuda,cuda-inductor`): the plans are made on the first and race on each.", "",
              "| backend | device | what it is |", "|---|---|---|"]
    for name in backend_names():
        backend = get_backend(name)
        doc = (type(backend).__doc__ or "").strip().split("\n\n")[0].replace("\n", " ")
        lines.append(f"| `{name}` | {backend.device_type} | {doc} |")
    lines += _compile_backend()
    lines += ["", "## Analytic device presets", "", "`opsched schedule --device NAME`, "
              "`opsched.cost.AnalyticCostModel(NAME)`.", "", "| preset | kind | peak GFLOP/s | memory GB/s | units |",
              "|---|---|---:|---:|---:|"]
    for name, d in DEVICES.items():
        lines.append(f"| `{name}` | {d.kind} | {d.peak_gflops:,.0f} | {d.mem_gbps:,.0f} | {d.slots} |")
    lines += ["", "## Memory hierarchy presets", "", "The levels `graphturbo` fits instances to and its simulator "
              "charges bytes to: `hierarchy=NAME`, `opsched.cost.hierarchy.hierarchy(NAME)`.", "",
              "| preset | levels, fastest first |", "|---|---|"]
    for name in BUILTIN:
        lines.append(f"| `{name}` | {HOST_PRESETS.get(name) or '; '.join(map(str, hierarchy(name).levels))} |")
    text = "\n".join(lines) + "\n"
    if markdown:
        return text
    return text.replace("`", "").replace("\\|", "|").replace("### ", "").replace("## ", "").replace("# ", "")


def _compile_backend() -> list[str]:
    """The ``torch.compile`` backend's modes and options, as the reference lists them."""
    from opsched.dynamo_options import MODES, OPTIONS, OWN_OPTIONS, REFUSED

    lines = ["", "## `torch.compile(model, backend=\"opsched\")`", "",
             "`options={...}` takes `optimize()`'s " + ", ".join(f"`{k}`" for k in OPTIONS) + " and any scheduler "
             "option above; the device is the inputs'. Its own options:", "",
             "| option | default | meaning |", "|---|---|---|"]
    lines += [f"| `{k}` | `{o.default!r}` | {o.help} |" for k, o in OWN_OPTIONS.items()]
    lines += ["", "Not taken: " + "; ".join(f"`{k}` ({why})" for k, why in REFUSED.items()) + ".", "",
              "`mode=` (torch.compile takes a mode or options, not both) adds:", "", "| mode | options |", "|---|---|"]
    lines += [f"| `{mode}` | {', '.join(f'`{k}={v!r}`' for k, v in adds.items()) or 'nothing'} |"
              for mode, adds in MODES.items()]
    return lines


def _cpu_default(defaults: Callable[[str, int], dict[str, Any]], name: str) -> str:
    at4, at8 = defaults("cpu", 4).get(name), defaults("cpu", 8).get(name)
    if at4 is None:
        return ""
    return "the number of cores" if (at4, at8) == (4, 8) else f"`{at4!r}`"


def _type_text(hint: Any) -> str:
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")

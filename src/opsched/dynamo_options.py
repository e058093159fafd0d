"""What ``torch.compile(model, backend="opsched", mode=..., options={...})`` takes: the options it
passes on to :func:`opsched.optimize`, its own options, what each ``mode`` adds, what it refuses
and why, and the check of them all at compile time (:func:`checked_settings`). The backend
itself is :mod:`opsched.dynamo`; ``opsched options`` lists what is here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from opsched.buckets import MAX_SHAPES, SPECIALIZE
from opsched.errors import OpschedError

__all__ = ["MODES", "OPTIONS", "OWN_OPTIONS", "OwnOption", "PLAN_NEUTRAL", "REFUSED", "checked_settings"]

#: What ``torch.compile``'s ``mode`` adds to the options (the user's own options win).
MODES: dict[str, dict[str, Any]] = {
    "default": {},
    "reduce-overhead": {"graphs": True},            # CUDA graphs, opsched's default on a GPU anyway
    "max-autotune": {"scheduler": ("ios", "est")},  # race the dynamic program's plan and the list scheduler's
    "max-autotune-no-cudagraphs": {"scheduler": ("ios", "est"), "graphs": False},
}

#: :func:`opsched.optimize`'s keyword arguments that the backend passes on (any scheduler option
#: too). The device is the inputs'; the precision and layout are the model's own (a compiled
#: model takes the inputs its original takes).
OPTIONS = ("scheduler", "cost", "backend", "cache_dir", "verify", "tracer", "progress", "graphs", "memory_budget")


@dataclass(frozen=True)
class OwnOption:
    """An option of the backend's own (not :func:`opsched.optimize`'s): its default and meaning."""

    default: Any
    help: str


#: The backend's own options (``opsched options`` lists them).
OWN_OPTIONS: dict[str, OwnOption] = {
    "fallback": OwnOption(True, "a graph opsched cannot schedule runs as Dynamo captured it, with a warning that "
                                "says why; False raises instead"),
    "specialize": OwnOption("graph", "'graph': a graph Dynamo made dynamic searches its first shape and reapplies "
                                     "that schedule at every later one; 'shape': each shape is searched"),
    "max_shapes": OwnOption(MAX_SHAPES, "input shapes a graph holds a plan for; further shapes run as Dynamo "
                                        "captured them"),
    "max_new_in_a_row": OwnOption(4, "calls in a row at a new shape after which a dynamic graph makes a plan only "
                                     "for a shape met again (its sizes follow the data, or grow a step at a time: a "
                                     "plan would serve one call); a shape's first call runs as Dynamo captured it"),
    "schedule_cache": OwnOption(True, "keep every schedule searched on disk beside the profile store "
                                      "(opsched cache list), and load it in a later process instead of searching"),
}
#: Settings that do not change the plan a search makes (so not part of the schedule cache's key).
PLAN_NEUTRAL = frozenset({"fallback", "specialize", "max_shapes", "max_new_in_a_row", "schedule_cache", "cache_dir",
                          "verify", "progress"})
#: :func:`opsched.optimize`'s arguments the backend does not take, and why.
REFUSED = {"device": "the device is the inputs' own", "dtype": "a compiled model takes the inputs its original "
            "takes: place the model in that precision before compiling", "channels_last": "the layout is the inputs'",
            "leaf_modules": "Dynamo traces the model, not opsched's importer",
            "fixed_values": "Dynamo reads the values Python needs itself, ending a graph there, and guards the "
                            "next on them"}


def checked_settings(mode: str | None, options: dict[str, Any]) -> dict[str, Any]:
    """The settings of a graph compiled with ``mode`` and ``options``: the own options' defaults,
    what the mode adds, the options given. Raises :class:`OpschedError` naming what is accepted
    where an option is refused, misspelt or out of range, before any work."""
    from opsched.request import check_request

    mode = mode or "default"
    if mode not in MODES:
        raise OpschedError(f"torch.compile mode {mode!r} is not one of the opsched backend's: {', '.join(MODES)}")
    refused = sorted(k for k in options if k in REFUSED)
    if refused:
        raise OpschedError("; ".join(f"option {k!r} is not taken by the opsched backend: {REFUSED[k]}"
                                     for k in refused))
    settings = {**{k: o.default for k, o in OWN_OPTIONS.items()}, **MODES[mode], **options}
    if settings["specialize"] not in SPECIALIZE:
        raise OpschedError(f"torch.compile(backend='opsched', options=...): specialize is one of "
                           f"{', '.join(map(repr, SPECIALIZE))}, got {settings['specialize']!r}")
    for bound, what in (("max_shapes", "input shapes"), ("max_new_in_a_row", "calls")):
        if not isinstance(settings[bound], int) or isinstance(settings[bound], bool) or settings[bound] < 1:
            raise OpschedError(f"torch.compile(backend='opsched', options=...): {bound} is a positive number of "
                               f"{what}, got {settings[bound]!r}")
    for flag in ("fallback", "schedule_cache"):
        if not isinstance(settings[flag], bool):
            raise OpschedError(f"torch.compile(backend='opsched', options=...): {flag} is True or False, got "
                               f"{settings[flag]!r}")
    checked = {k: v for k, v in settings.items() if k in ("scheduler", "backend") or k not in (*OPTIONS, *OWN_OPTIONS)}
    try:
        check_request(**checked)  # unknown schedulers, backends and options fail here, before any work
    except OpschedError as e:
        raise OpschedError(f"torch.compile(backend='opsched', options=...): {e} (the backend also takes "
                           f"{', '.join((*OPTIONS, *OWN_OPTIONS))})") from e
    return settings

"""Progress of long work: a dependency-free bar on stderr, one per phase.

Work reports ``progress(done, total, text)`` (a :data:`Progress`); a caller that runs several
phases takes a :data:`Phases`, which gives the :data:`Progress` of each phase by name
(``phases("searching ios")``). :func:`phases` resolves what users pass: ``True`` (bars on
stderr), ``False`` (nothing), ``None`` (bars when stderr is a terminal: on for people, off in
tests, logs and CI), or their own callable.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import TextIO

__all__ = ["Progress", "Phases", "ProgressBar", "bars", "phases", "quiet"]

#: ``progress(done, total, text)``: called as work advances.
Progress = Callable[[int, int, str], None]
#: ``phases(name)``: the :data:`Progress` of the phase ``name``.
Phases = Callable[[str], Progress]


def _ignore(done: int, total: int, text: str) -> None:
    pass


def quiet(name: str) -> Progress:
    """Phases that report nothing."""
    return _ignore


class ProgressBar:
    """``bar.update(done, total, "text")``, redrawn in place; draws only when ``enabled``."""

    def __init__(self, label: str, enabled: bool = True, stream: TextIO | None = None, width: int = 28) -> None:
        self.label, self.enabled, self.width = label, enabled, width
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self._last = 0.0

    def update(self, done: int, total: int, text: str = "") -> None:
        if not self.enabled:
            return
        now = time.perf_counter()
        if done < total and now - self._last < 0.1:
            return
        self._last = now
        frac = done / total if total else 1.0
        filled = int(frac * self.width)
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r{self.label} [{bar}] {done}/{total} {now - self.start:6.1f}s {text}"[:160].ljust(100))
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def bars(stream: TextIO | None = None) -> Phases:
    """A progress bar per phase, on ``stream`` (stderr)."""
    return lambda name: ProgressBar(name, stream=stream).update


def phases(progress: bool | Phases | None) -> Phases:
    """What ``progress=`` means (see the module docstring)."""
    if progress is None:
        progress = sys.stderr.isatty()
    if progress is True:
        return bars()
    if progress is False:
        return quiet
    return progress

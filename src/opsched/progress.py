"""A dependency-free progress bar for long work (stderr, redrawn in place)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["ProgressBar"]


class ProgressBar:
    """``bar.update(done, total, "text")``; draws only when ``enabled`` (the CLI enables it)."""

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

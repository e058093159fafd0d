"""Which input shapes of a graph the ``torch.compile`` backend makes a plan for (a *bucket*), and
the calls it runs as Dynamo captured them instead, counted by why (:mod:`opsched.dynamo`'s
module docstring, "Shapes", says what a user sees of it).

A policy of its own, apart from how a graph is imported and run: a plan costs an import, a
build and sessions that it keeps, so it is made only where a shape is likely to be met again.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from opsched.dynamo_report import AsCaptured

__all__ = ["Admission"]

#: The backend's logger: its warnings are the backend's, whichever module decides them.
log = logging.getLogger("opsched.dynamo")

#: Why a graph runs a shape as captured once it holds ``max_shapes`` buckets: the warning, and the report's words.
_OVER = ("it holds max_shapes buckets already (each plan keeps its own sessions and constants): this and every "
         "further new shape run as Dynamo captured them; pad inputs to a few shapes (a static cache, for "
         "generation), or raise options={'max_shapes': ...}", "past max_shapes={}")
#: Why a dynamic graph runs new shapes as captured once ``max_new_in_a_row`` calls in a row met one.
_CHURN = ("its input shapes were new at max_new_in_a_row calls in a row: its sizes follow the data (a detector's "
          "boxes) or grow a step at a time (a decoding loop's cache), so a plan would serve one call and cost more "
          "than it saves; this and every further new shape run as Dynamo captured them, and get a plan if met "
          "again; the shapes that hold a plan keep it (pad inputs to a few shapes, or raise "
          "options={'max_new_in_a_row': ...})",
          "after max_new_in_a_row={} new shapes in a row")


class Admission:
    """Which new buckets a graph makes, and the calls it runs as captured instead (counted by why).

    None past ``max_shapes``. A dynamic graph whose shape was new at ``max_new_in_a_row`` calls in
    a row churns, for good: a new shape then runs as captured at its first call and gets a plan at
    its second, so a shape that recurs pays for one (a server warmed up over many batch sizes in a
    row, a detector's common counts of boxes) and one met once does not (a decoding loop's every
    length). The last ``remembered`` shapes met once are kept."""

    def __init__(self, max_shapes: int, max_new_in_a_row: int, dynamic: bool, remembered: int = 1024) -> None:
        self.max_shapes, self.max_new_in_a_row, self.dynamic = max_shapes, max_new_in_a_row, dynamic
        self.remembered = remembered
        self.new_in_a_row = 0  # calls in a row that met a new input shape (a call served by a bucket resets it)
        self.churning = False
        self.met_once: dict[tuple[Any, ...], bool] = {}  # shapes (and integers) run as captured once, in order
        self.as_captured: dict[str, AsCaptured] = {}  # by the report's words

    def admits(self, held: int, new_shape: bool, shape: tuple[Any, ...], shapes: tuple[tuple[int, ...], ...],
               graph: int) -> bool:
        """Whether graph ``graph``, holding ``held`` buckets, makes one for a call at ``shape`` (new
        to it where ``new_shape``); a call it does not is counted, and the first of each reason warned."""
        self.new_in_a_row += new_shape
        refused = self._refusal(held, new_shape, shape)
        if refused is None:
            return True
        warning, words = refused
        seen = self.as_captured.get(words)
        if seen is None:
            log.warning("opsched backend: graph %d with inputs %s runs eagerly: %s", graph, list(shapes), warning)
            seen = AsCaptured(words, 0, shapes, shapes)
        self.as_captured[words] = dataclasses.replace(seen, calls=seen.calls + 1, last=shapes)
        return False

    def _refusal(self, held: int, new_shape: bool, shape: tuple[Any, ...]) -> tuple[str, str] | None:
        """Why no bucket is made (the warning, the report's words), or None where one is."""
        if held >= self.max_shapes:
            return _OVER[0], _OVER[1].format(self.max_shapes)
        self.churning |= self.dynamic and self.new_in_a_row > self.max_new_in_a_row
        if not (self.churning and new_shape) or self.met_once.pop(shape, False):
            return None
        self.met_once[shape] = True
        if len(self.met_once) > self.remembered:
            del self.met_once[next(iter(self.met_once))]  # the longest ago
        return _CHURN[0], _CHURN[1].format(self.max_new_in_a_row)

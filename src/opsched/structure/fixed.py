"""Inputs a graph is made for one value of (:func:`opsched.from_onnx`'s ``input_values``): the
record a graph keeps of each, and whether a value given in a call is that one."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from opsched.structure.shown import values

__all__ = ["FixedInput", "holds_value"]


@dataclass(frozen=True, eq=False)
class FixedInput:
    """An input of a model that a graph computes for one value of (:func:`opsched.from_onnx`'s
    ``input_values``: a sample rate, a mode): its name as a call passes it, that value, and its
    position among the model's inputs. A call may leave it out or pass it, with that value: a
    module made of the graph is fed as the file is (``module(x, sr)``, ``module(**feeds)``)."""

    name: str
    value: torch.Tensor
    position: int

    def holds(self, given: Any) -> bool:
        """Whether ``given`` (a tensor, an array, a number) is this value (:func:`holds_value`)."""
        return holds_value(given, self._shape, self._numbers)

    @functools.cached_property
    def _numbers(self) -> Any:
        """The value as Python numbers (a number, or nested lists of them)."""
        return self.value.tolist()

    @functools.cached_property
    def _shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    def __repr__(self) -> str:  # how a call's description shows it: ``forward(x, sr=16000)``
        return repr(self._numbers)

    def __str__(self) -> str:  # how a report shows it: ``sr=16000 (int64)``
        return f"{self.name}={values(self.value)}"


def holds_value(given: Any, shape: tuple[int, ...], numbers: Any) -> bool:
    """Whether ``given`` (a tensor, an array, a number) is the value of ``shape`` whose elements
    are ``numbers`` (a number, or nested lists of them), whatever the type that holds them
    (``16000`` for an int64 ``sr``). Compared as Python numbers: a call that passes a fixed
    input each time pays a microsecond, not a tensor op's ten."""
    if isinstance(given, (bool, int, float)):
        return not shape and given == numbers
    if not (hasattr(given, "shape") and hasattr(given, "tolist")):  # neither a tensor nor an array
        return False
    try:
        return tuple(given.shape) == shape and given.tolist() == numbers
    except (TypeError, ValueError, RuntimeError):  # an object that only looks like one
        return False

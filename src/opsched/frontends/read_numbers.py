"""The numbers a draft program reads out of fixed inputs, as the converter learns them.

:func:`torch.export.draft_export` (the fallback of ``fixed_values``: :mod:`opsched.frontends.export_trace`)
leaves a number the model reads out of a tensor (``grid_thw.tolist()``) as a symbol (``u0``), and
the sizes that follow from it as expressions of symbols. The converter folds what the model
computes of the fixed inputs alone, so it learns a symbol's value where it folds the call that
read it (:meth:`ReadNumbers.bind`); :meth:`ReadNumbers.concrete` then gives a later call's traced
value with every symbol it knows substituted: sizes that are numbers again, which every converter
can read.
"""

from __future__ import annotations

from typing import Any

import sympy
import torch
import torch.fx
import torch.utils._pytree as pytree

from opsched.frontends._common import symbolic

__all__ = ["ReadNumbers", "data_sized"]

_NUMBERS = {torch.SymInt: int, torch.SymFloat: float, torch.SymBool: bool}


def data_sized(val: Any) -> bool:
    """Whether a traced value holds a tensor whose sizes or strides are numbers read out of tensors."""
    return any(isinstance(t, torch.Tensor) and symbolic((tuple(t.shape), t.stride()))
               for t in pytree.tree_leaves(val))


class ReadNumbers:
    """The symbols (``u0``) whose values the converter has read, folding the calls that read them."""

    def __init__(self) -> None:
        self._values: dict[sympy.Symbol, sympy.Basic] = {}

    def __bool__(self) -> bool:
        return bool(self._values)

    def bind(self, n: torch.fx.Node, out: Any) -> None:
        """The numbers call ``n`` read out of tensors, as ``out``, its value computed, holds them."""
        for symbol, path in (n.meta.get("unbacked_bindings") or {}).items():
            self._values[symbol] = sympy.sympify(pytree.key_get(out, path))

    def concrete(self, val: Any) -> Any:
        """A traced value with each symbol known substituted: a number where every symbol it
        follows from is known, a tensor whose sizes and strides are all known remade of them
        (fake, in its own fake mode)."""
        def number(v: Any) -> Any:
            if not isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                return v
            expr = v.node.expr.xreplace(self._values)
            return v if expr.free_symbols else _NUMBERS[type(v)](expr)

        def tensor(t: torch.Tensor) -> torch.Tensor:
            shape, stride = [number(d) for d in t.shape], [number(d) for d in t.stride()]
            if symbolic((shape, stride)):
                return t
            with t.fake_mode:  # type: ignore[attr-defined]
                return torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device)

        return pytree.tree_map(lambda v: tensor(v) if isinstance(v, torch.Tensor) and data_sized(v) else number(v),
                               val)

"""The least and greatest values a graph's tensors can hold, by interval arithmetic.

A value's bounds are worked out from the calls that make it, back to what is known: a weight or
constant (its own least and greatest entries), a scalar argument, a graph input (its dtype's
range: anything at all for a float). Each call has a rule (:data:`_ATEN_RULES` for generic ATen
nodes, by the operator's name; :data:`_RULES` for opsched's own ops); a call without one may give
anything its dtype holds. A bound is then rounded as the value's dtype rounds it: a float's past
its largest finite value is infinite (``finfo.min - 5`` rounds to ``finfo.min`` in float32, where
``finfo.min - 1e32`` is ``-inf``), an integer's past its range wraps, so it may be anything then.

Bounds are sound, not tight: the value holds nothing outside them, and may not reach them. NaN is
not tracked (it is not in any interval): a call whose bounds would be NaN (``inf - inf``) may give
anything. Rounding is applied once per call to bounds computed in float64, which holds a float32
sum or product exactly, so a float32 value's bound is what float32 rounding of that call gives.

What it decides: a float attention mask whose least value is finite hides no query from every key,
and its export leaves out the zeroing of such queries (:mod:`opsched.ir.ops.attention`).
"""

from __future__ import annotations

import math
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from opsched.ir.graph import Graph
from opsched.ir.node import Node

__all__ = ["Bounds", "bounds", "least"]

#: How many calls back from a value its bounds are followed; beyond, it may hold anything (a
#: mask is made within a few calls of what is known; a model's activations are not).
DEPTH = 48


@dataclass(frozen=True)
class Bounds:
    """Every entry of a tensor is in [low, high] (float64; infinite where unbounded)."""

    low: float
    high: float

    def hull(self, *others: Bounds) -> Bounds:
        return Bounds(min((self.low, *(o.low for o in others))), max((self.high, *(o.high for o in others))))


ANY = Bounds(-math.inf, math.inf)


def bounds(graph: Graph, value: str) -> Bounds:
    """The bounds of ``value`` (a graph input or a node's output) in ``graph``."""
    return _Bounder.of(graph).value(value, 0)


def least(graph: Graph, operand: tuple[str, Any], node: Node) -> float:
    """The least value an encoded operand of ``node`` can hold (``("t", k)``: its k-th input;
    ``("p", k)``: its k-th weight; ``("v", x)``: a scalar); -inf where unknown."""
    return _Bounder.of(graph).operand(node, operand, 0).low


class _Bounder:
    """One graph's bounds, each value's worked out once."""

    _made: weakref.WeakKeyDictionary[Graph, _Bounder] = weakref.WeakKeyDictionary()

    @classmethod
    def of(cls, graph: Graph) -> _Bounder:
        made = cls._made.get(graph)
        if made is None:
            made = cls._made[graph] = cls(graph)
        return made

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.made: dict[str, Bounds] = {}
        self.weights: dict[str, Bounds] = {}

    def value(self, name: str, depth: int) -> Bounds:
        known = self.made.get(name)
        if known is not None:
            return known
        dtype = self.graph.types[name].dtype
        if name not in self.graph.index or depth > DEPTH:  # a graph input, or too far back to follow
            return _of_dtype(dtype)
        node = self.graph.node(name)
        rule = _ATEN_RULES.get(_aten_name(node)) if node.op.startswith("aten.") else _RULES.get(node.op)
        found = _rounded(rule(self, node, depth + 1), dtype) if rule is not None else _of_dtype(dtype)
        if depth <= DEPTH // 2:  # kept where half the depth was left below it: a bound the cut loosened is not
            self.made[name] = found
        return found

    def operand(self, node: Node, enc: Any, depth: int) -> Bounds:
        """An encoded argument's bounds: an input, a weight, a scalar or a list of them (their hull)."""
        tag, x = enc
        if tag == "t":
            return self.value(node.inputs[x], depth)
        if tag == "p":
            return self.param(node, x)
        if tag == "v" and isinstance(x, (bool, int, float)):
            return Bounds(float(x), float(x))
        if tag == "list" and x:
            found = [self.operand(node, e, depth) for e in x]
            return found[0].hull(*found[1:])
        return ANY

    def param(self, node: Node, k: int) -> Bounds:
        """The bounds of ``node``'s k-th weight: its own entries', each weight's found once."""
        name = node.params[k]
        found = self.weights.get(name)
        if found is None:
            found = self.weights[name] = _of_tensor(self.graph.params[name])
        return found


def _aten_name(node: Node) -> str:
    """A generic node's operator name without namespace or overload: ``aten::where.self`` is ``where``."""
    return str(node.attrs.get("target", "")).partition("::")[2].partition(".")[0]


def _of_dtype(dtype: str) -> Bounds:
    """Anything a tensor of ``dtype`` can hold."""
    if dtype == "bool":
        return Bounds(0.0, 1.0)
    kind = getattr(torch, dtype, None)
    if isinstance(kind, torch.dtype) and not (kind.is_floating_point or kind.is_complex):
        info = torch.iinfo(kind)
        return Bounds(float(info.min), float(info.max))
    return ANY


def _of_tensor(t: torch.Tensor) -> Bounds:
    """A weight's own least and greatest entries; anything where it is empty, complex or holds NaN."""
    if t.numel() == 0 or t.is_complex():
        return ANY
    low, high = torch.aminmax(t.detach().reshape(-1).to(torch.float64))
    if torch.isnan(low) or torch.isnan(high):
        return ANY
    return Bounds(float(low), float(high))


def _rounded(b: Bounds, dtype: str) -> Bounds:
    """``b`` as a tensor of ``dtype`` holds it: a float's bounds rounded as its kernels round (to
    nearest, ties to even, so that from its largest finite value plus half a unit in the last place
    on, a bound is infinite); an integer's out to whole numbers (a float cast to it truncates), and
    past its range they wrap, so they may be anything it holds; NaN bounds may be anything."""
    if math.isnan(b.low) or math.isnan(b.high):
        return _of_dtype(dtype)
    kind = getattr(torch, dtype, None)
    if not isinstance(kind, torch.dtype) or kind.is_complex:
        return ANY
    if kind == torch.bool:
        return Bounds(0.0, 1.0)
    if kind.is_floating_point:  # as the kernel rounds: to nearest, ties to even, infinite past the largest
        low, high = torch.tensor([b.low, b.high], dtype=torch.float64).to(kind).tolist()
        return Bounds(low, high)
    whole = _of_dtype(dtype)
    if not whole.low <= b.low <= b.high <= whole.high:
        return whole
    return Bounds(float(math.floor(b.low)), float(math.ceil(b.high)))  # a float cast to it truncates


Rule = Callable[[_Bounder, Node, int], Bounds]


def _hull(*names: str) -> Rule:
    """The hull of the generic node's arguments ``names`` (each entry is one of theirs): of one,
    its own bounds (a view, a copy or a reordering of it; a tensor filled with a scalar); anything
    where the call has not each of them."""
    def rule(b: _Bounder, node: Node, depth: int) -> Bounds:
        args = _encoded(node)
        if any(n not in args for n in names):
            return ANY
        found = [b.operand(node, args[n], depth) for n in names]
        return found[0].hull(*found[1:])
    return rule


def _point(low: float, high: float | None = None) -> Rule:
    """A tensor whose entries are ``low`` (or between ``low`` and ``high``), whatever its arguments."""
    found = Bounds(low, low if high is None else high)
    return lambda b, node, depth: found


def _combined(op: Callable[[Bounds, Bounds], Bounds], first: str, second: str, scaled: bool = False) -> Rule:
    """``op`` of the generic node's arguments ``first`` and ``second`` (the latter times ``alpha``
    where ``scaled``: add, sub and rsub take one)."""
    def rule(b: _Bounder, node: Node, depth: int) -> Bounds:
        args = _encoded(node)
        if first not in args or second not in args:
            return ANY
        y = b.operand(node, args[second], depth)
        if scaled:
            y = _product(y, b.operand(node, args.get("alpha", ("v", 1)), depth))
        return op(b.operand(node, args[first], depth), y)
    return rule


def _sum(x: Bounds, y: Bounds) -> Bounds:
    return Bounds(x.low + y.low, x.high + y.high)


def _difference(x: Bounds, y: Bounds) -> Bounds:
    return Bounds(x.low - y.high, x.high - y.low)


def _product(x: Bounds, y: Bounds) -> Bounds:
    ends = [p * q for p in (x.low, x.high) for q in (y.low, y.high)]
    if any(math.isnan(e) for e in ends):  # 0 x inf: the entry may be NaN, which no interval holds
        return Bounds(math.nan, math.nan)
    return Bounds(min(ends), max(ends))


def _clamped(b: _Bounder, node: Node, depth: int) -> Bounds:
    """``clamp(self, min, max)``, each bound a scalar, a tensor or absent: ``minimum(maximum(self,
    min), max)``."""
    args = _encoded(node)
    if "self" not in args:
        return ANY
    x = b.operand(node, args["self"], depth)
    low, high = (args.get(k, ("v", None)) for k in ("min", "max"))
    if low[1] is not None:
        x = _larger(x, b.operand(node, low, depth))
    if high[1] is not None:
        x = _smaller(x, b.operand(node, high, depth))
    return x


def _larger(x: Bounds, y: Bounds) -> Bounds:
    """Of ``maximum(x, y)``."""
    return Bounds(max(x.low, y.low), max(x.high, y.high))


def _smaller(x: Bounds, y: Bounds) -> Bounds:
    """Of ``minimum(x, y)``."""
    return Bounds(min(x.low, y.low), min(x.high, y.high))


def _negated(b: _Bounder, node: Node, depth: int) -> Bounds:
    x = _hull("self")(b, node, depth)
    return Bounds(-x.high, -x.low)


def _with_zero(name: str) -> Rule:
    """The argument ``name`` with some entries made zero (``triu``, ``tril``)."""
    inner = _hull(name)
    return lambda b, node, depth: inner(b, node, depth).hull(Bounds(0.0, 0.0))


def _range(b: _Bounder, node: Node, depth: int) -> Bounds:
    """``arange(start=0, end)``: between its ends, whichever way it steps."""
    args = _encoded(node)
    if "end" not in args:
        return ANY
    return b.operand(node, args.get("start", ("v", 0)), depth).hull(b.operand(node, args["end"], depth))


def _encoded(node: Node) -> dict[str, Any]:
    from opsched.ir.ops.aten import encoded_arguments

    return encoded_arguments(node)


_SAME = ("alias", "clone", "contiguous", "detach", "expand", "view", "_unsafe_view", "reshape", "permute",
         "transpose", "t", "unsqueeze", "squeeze", "slice", "select", "narrow", "index", "flatten", "repeat",
         "tile", "flip", "roll", "movedim", "as_strided", "unfold", "lift_fresh_copy", "_to_copy", "to",
         "_unsafe_index", "index_select", "gather", "expand_copy", "view_copy", "permute_copy", "slice_copy",
         "squeeze_copy", "unsqueeze_copy", "transpose_copy", "select_copy", "repeat_interleave")
_PREDICATES = ("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_not", "logical_xor",
               "isinf", "isnan", "isneginf", "isposinf", "isfinite", "__and__", "__or__", "__xor__", "bitwise_not")

#: Generic ATen nodes' rules, by operator name (:func:`_aten_name`).
_ATEN_RULES: dict[str, Rule] = {
    **{name: _hull("self") for name in _SAME},
    **{name: _point(0.0, 1.0) for name in _PREDICATES},
    "where": _hull("self", "other"),
    "masked_fill": _hull("self", "value"),
    "cat": _hull("tensors"),
    "stack": _hull("tensors"),
    "full": _hull("fill_value"),
    "full_like": _hull("fill_value"),
    "new_full": _hull("fill_value"),
    "fill": _hull("value"),
    "scalar_tensor": _hull("s"),
    "zeros": _point(0.0), "zeros_like": _point(0.0), "new_zeros": _point(0.0),
    "ones": _point(1.0), "ones_like": _point(1.0), "new_ones": _point(1.0),
    "arange": _range,
    "triu": _with_zero("self"), "tril": _with_zero("self"),
    "add": _combined(_sum, "self", "other", scaled=True),
    "sub": _combined(_difference, "self", "other", scaled=True),
    "rsub": _combined(_difference, "other", "self", scaled=True),
    "mul": _combined(_product, "self", "other"),
    "neg": _negated,
    "clamp": _clamped, "clamp_min": _clamped, "clamp_max": _clamped,
    "maximum": _combined(_larger, "self", "other"),
    "minimum": _combined(_smaller, "self", "other"),
}


def _inputs_hull(b: _Bounder, node: Node, depth: int) -> Bounds:
    found = [b.value(v, depth) for v in node.inputs]
    return found[0].hull(*found[1:]) if found else ANY


def _inputs_sum(b: _Bounder, node: Node, depth: int) -> Bounds:
    """Added in order, each partial sum rounded as the kernel rounds it."""
    total = b.value(node.inputs[0], depth)
    for v in node.inputs[1:]:
        total = _rounded(_sum(total, b.value(v, depth)), node.out.dtype)
    return total


def _inputs_product(b: _Bounder, node: Node, depth: int) -> Bounds:
    x, y = (b.value(v, depth) for v in node.inputs)
    return _product(x, y)


def _padded(b: _Bounder, node: Node, depth: int) -> Bounds:
    value = node.attr("value", 0.0)
    return b.value(node.inputs[0], depth).hull(Bounds(float(value), float(value)))


def _first_input(b: _Bounder, node: Node, depth: int) -> Bounds:
    return b.value(node.inputs[0], depth)


#: opsched's own ops' rules, by op.
_RULES: dict[str, Rule] = {
    **{op: _first_input for op in ("identity", "reshape", "flatten", "slice")},
    "concat": _inputs_hull,
    "add": _inputs_sum,
    "mul": _inputs_product,
    "pad": _padded,
    "constant": lambda b, node, depth: b.param(node, 0),
    "relu": lambda b, node, depth: _larger(_first_input(b, node, depth), Bounds(0.0, 0.0)),
    "softmax": _point(0.0, 1.0),
}

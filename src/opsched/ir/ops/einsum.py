"""``torch.einsum`` of two operands in ONNX as one batched MatMul, the way PyTorch computes it.

torch.onnx exports an einsum as ONNX's ``Einsum``, which ONNX Runtime's CPU kernel computes far
slower than its MatMul: UnivNet's location-variable convolutions (``bildsk,biokl->bolsd`` over
its 3,000 frames) took 1.15 s a call in ``Einsum`` against 0.37 s in PyTorch and 0.44 s as the
Transpose, Reshape and MatMul below (one probe, two cores, in one process). So a two-operand
einsum that is a contraction is planned as PyTorch plans it (:class:`Contraction`): each label
is a *batch* label (both operands and the output), *contracted* (both operands, not the output),
*kept* by one operand (it and the output) or *summed* by one operand alone (ReduceSum first);
each operand is transposed to (batch, kept, contracted) or (batch, contracted, kept), its kept
and contracted labels folded into one axis each, and the MatMul's product unfolded and
transposed to the output's order. Batch labels stay axes of their own, so an operand's size 1
broadcasts as MatMul broadcasts. Equations that are not such a contraction (one operand or
three, a label repeated in an operand, a contracted label broadcast, the implicit output) and
dtypes MatMul lacks export as ``Einsum``, as before.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from opsched.ir.node import Node

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__ = ["Contraction", "EINSUM_FORMS", "contraction"]

#: What ONNX Runtime's CPU MatMul computes.
MATMUL_DTYPES = frozenset({"float32", "float64", "float16"})


@dataclass(frozen=True)
class Contraction:
    """How a two-operand einsum runs as a batched matrix product (module docstring): per operand,
    the axes it sums alone, the order it is transposed to once they are gone, and the shape it
    is folded to; then the product's unfolded shape and its transposition to the output."""

    summed: tuple[tuple[int, ...], tuple[int, ...]]
    order: tuple[tuple[int, ...], tuple[int, ...]]
    folded: tuple[tuple[int, ...], tuple[int, ...]]
    unfolded: tuple[int, ...]
    to_output: tuple[int, ...]


def contraction(equation: str, shapes: Sequence[Sequence[int]]) -> Contraction | None:
    """The plan of ``torch.einsum(equation, a, b)`` on operands of ``shapes``; None where it is
    not a contraction of two operands with an explicit output (module docstring)."""
    equation = equation.replace(" ", "")
    if len(shapes) != 2 or equation.count("->") != 1:
        return None
    given, out = equation.split("->")
    if given.count(",") != 1:
        return None
    terms = given.split(",")
    spare = iter(sorted(set(map(chr, range(ord("A"), ord("Z") + 1))) - set(equation)))
    dots = max((len(shape) - len(term.replace("...", "")) for term, shape in zip(terms, shapes) if "..." in term),
               default=0)
    broadcast = "".join(next(spare) for _ in range(dots))  # the ellipsis' dimensions, right-aligned
    a, b = (_expanded(term, len(shape), broadcast) for term, shape in zip(terms, shapes))
    out_rank = len(out.replace("...", "")) + (dots if "..." in out else 0)  # no ellipsis: its dimensions summed
    out_labels = _expanded(out, out_rank, broadcast)
    if a is None or b is None or out_labels is None:
        return None
    out = out_labels
    if any(len(set(s)) != len(s) for s in (a, b, out)) or not set(out) <= set(a) | set(b) \
            or not all(c.isalpha() for c in a + b):
        return None
    size: dict[str, int] = {}
    for labels, shape in ((a, shapes[0]), (b, shapes[1])):
        for c, n in zip(labels, shape):
            if c in size and size[c] != n and 1 not in (size[c], n):
                return None  # sizes torch refuses
            size[c] = max(size.get(c, n), n)
    sizes = (dict(zip(a, shapes[0])), dict(zip(b, shapes[1])))
    batch = [c for c in out if c in a and c in b]
    kept = ([c for c in out if c in a and c not in b], [c for c in out if c in b and c not in a])
    contracted = [c for c in a if c in b and c not in out]
    if any(sizes[0][c] != sizes[1][c] for c in contracted):
        return None  # a contracted size 1 against a larger one: a sum, not a product
    summed = (tuple(k for k, c in enumerate(a) if c not in out and c not in b),
              tuple(k for k, c in enumerate(b) if c not in out and c not in a))
    left = [c for c in a if c in out or c in b]  # the labels left once the summed are gone
    right = [c for c in b if c in out or c in a]
    order_a = [batch, kept[0], contracted]
    order_b = [batch, contracted, kept[1]]
    folded = (
        (*(sizes[0][c] for c in batch), math.prod(sizes[0][c] for c in kept[0]),
         math.prod(sizes[0][c] for c in contracted)),
        (*(sizes[1][c] for c in batch), math.prod(sizes[1][c] for c in contracted),
         math.prod(sizes[1][c] for c in kept[1])))
    product = [*batch, *kept[0], *kept[1]]
    return Contraction(summed, (tuple(left.index(c) for group in order_a for c in group),
                                tuple(right.index(c) for group in order_b for c in group)), folded,
                       (*(size[c] for c in batch), *(sizes[0][c] for c in kept[0]), *(sizes[1][c] for c in kept[1])),
                       tuple(product.index(c) for c in out))


def _expanded(term: str, rank: int, broadcast: str) -> str | None:
    """A term with its ellipsis spelled out in labels: the last of ``broadcast``'s, as many as
    the term's rank leaves to it."""
    if "..." not in term:
        return term if len(term) == rank else None
    head, _, tail = term.partition("...")
    count = rank - len(head) - len(tail)
    if "." in head + tail or count < 0 or count > len(broadcast):
        return None
    return head + broadcast[len(broadcast) - count:] + tail


def _einsum(b: OnnxBuilder, node: Node) -> None:
    """``aten::einsum`` as its :class:`Contraction`'s nodes, where it has one, else as ONNX's
    ``Einsum`` (torch.onnx's export of it)."""
    from opsched.ir.ops.aten_export import export_default

    (_, equation), (_, refs), *rest = node.attrs["args"]
    types = [t for ref in refs if (t := b.operand_type(node, ref)) is not None and t.dtype in MATMUL_DTYPES]
    plan = None
    if not rest and not node.attrs["kwargs"] and len(refs) == len(types) == 2 and types[0].dtype == types[1].dtype:
        plan = contraction(equation, [t.shape for t in types])
    if plan is None:
        return export_default(b, node)
    operands = []
    for k, ref in enumerate(refs):
        x = b.operand(node, ref)
        if plan.summed[k]:
            x = b.add("ReduceSum", [x, b.init(np.array(plan.summed[k], np.int64), b.fresh("axes"))],
                      b.fresh(f"{node.name}_summed"), keepdims=0)
        if plan.order[k] != tuple(range(len(plan.order[k]))):
            x = b.add("Transpose", [x], b.fresh(f"{node.name}_ordered"), perm=list(plan.order[k]))
        operands.append(b.add("Reshape", [x, b.init(np.array(plan.folded[k], np.int64), b.fresh("shape"))],
                              b.fresh(f"{node.name}_folded"), allowzero=1))
    product = b.add("MatMul", operands, b.fresh(f"{node.name}_product"))
    unfolded = b.add("Reshape", [product, b.init(np.array(plan.unfolded, np.int64), b.fresh("shape"))],
                     b.fresh(f"{node.name}_unfolded") if plan.to_output != tuple(range(len(plan.to_output)))
                     else node.name, allowzero=1)  # a size 0 is 0, not the input's size
    if unfolded != node.name:
        b.add("Transpose", [unfolded], node.name, perm=list(plan.to_output))


#: The einsum overload's form, by target.
EINSUM_FORMS = {"aten::einsum.default": _einsum}

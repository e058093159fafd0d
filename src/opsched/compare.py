"""How near a module's outputs are to its model's: the rules :mod:`opsched.check` compares by,
on tensors alone.

* :func:`tolerance`: a dtype's share (:data:`TOLERANCES`, TF32's on a GPU that uses it) of the
  reference's :func:`scale`, its largest finite magnitude; :func:`largest_difference` the
  distance it bounds, in which equal values (infinities of one sign, NaNs on both sides among
  them) are 0 apart and a NaN or an infinity on one side only infinitely far.
* :func:`as_true`: the float64 arbiter. A model whose weights amplify rounding sets two float32
  computations of it further apart than float32's tolerance though neither is wrong; an output
  passes where it is as near the model run in float64 as the model's own, and where the model's
  own is :data:`UNDECIDED` of its scale away, float32 decides nothing.
* :func:`reordering`: values that tie, taken in another order. A model that picks values by
  their order (``topk`` over scores, a ``sort``) ranks two scores that tie within rounding by
  their last bits, which a plan's other kernels and sums compute otherwise: RT-DETR's plan,
  every score within 1.2e-6 of eager's, kept the same 300 queries with two neighbours swapped
  (ranks 161 and 162), and every output computed from the queries (logits, boxes, the decoder's
  states) came out with those two rows swapped, 0.1-1.5 apart. Such a module computes the
  model, in another order of what ties; a reordering is accepted where one explains every
  output that differs, and nothing a wrong result is likely to be: along one dimension, shared
  by every such output, only neighbours exchanged, within runs of at most :data:`MOST_TIED` (a
  ranking's near-ties are neighbours in it), each position then within the output's tolerance.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch

__all__ = ["TOLERANCES", "TF32_TOLERANCE", "UNDECIDED", "MOST_TIED", "tf32_in_use", "tolerance", "scale",
           "largest_difference", "as_true", "Reordering", "reordering"]

#: Absolute tolerance relative to the reference's largest finite magnitude, per dtype. Floating-point
#: sums reassociate (BN folding, merged convolutions, other kernels), so bitwise equality is
#: not the contract; agreement to this many ulps of the output's scale is.
#: float64's leaves room for deep models on other kernels: the corpus's GPT-2 in float64 on ONNX
#: Runtime's kernels was 2e-10 of its scale from eager.
TOLERANCES: dict[torch.dtype, float] = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2,
                                        torch.float64: 1e-8}
#: float32 on a GPU whose convolutions or matrix products run in TF32 (PyTorch's default for
#: cuDNN convolutions on Ampere and later): float16's 10-bit mantissa in the products, float32
#: sums. Seen on an H100: 0.07-0.12% of the output's scale between two cuDNN algorithm choices.
TF32_TOLERANCE = 5e-3
#: A model whose own output is this share of its scale from its float64 output computes nothing in
#: its precision that a module could be checked by: the float64 arbiter (:func:`as_true`) then
#: passes whatever is as far, and the check says so. Random detectors are (D-FINE's float32
#: detections 5.9 from float64's, of a scale of 5.5, its queries picked by top-k among scores
#: float32 orders otherwise).
UNDECIDED = 0.1


def tf32_in_use() -> bool:
    """Whether float32 convolutions or matrix products on a GPU may run in TF32."""
    return bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)


def tolerance(reference: torch.Tensor, computed_in: Collection[str] = ()) -> float:
    """The absolute tolerance for an output compared with ``reference``: its dtype's (TF32's for
    float32 on a GPU with TF32 on), or the coarsest of ``computed_in``'s (the dtypes a graph's
    values have: a float64 Llama computes its rotary embedding in float32, and agrees to
    float32's), times the reference's scale; none for integers and bools."""
    if not (reference.is_floating_point() or reference.is_complex()):
        return 0.0
    if reference.dtype == torch.float32 and reference.is_cuda and tf32_in_use():
        rel = TF32_TOLERANCE
    else:
        rel = TOLERANCES.get(reference.dtype, 1e-4)
    rel = max([rel, *(TOLERANCES.get(getattr(torch, d), 0.0) for d in computed_in)])
    return rel * max(1.0, scale(reference))


def scale(reference: torch.Tensor) -> float:
    """The largest finite magnitude in ``reference`` (0 where it holds none): an attention's
    masked logits of -inf (GroundingDINO's) set no tolerance of infinity for the rest."""
    finite = reference[torch.isfinite(reference)] if reference.is_floating_point() or reference.is_complex() \
        else reference
    return float(finite.abs().max()) if finite.numel() else 0.0


def largest_difference(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``max|actual - expected|`` in double precision (complex values as complex: both parts
    count), 0 for empty tensors: values that are equal, infinities of one sign and NaNs on both
    sides among them, 0 apart; a NaN or an infinity on one side only, infinitely far (a module
    that returns NaN is as far from its model as can be, not, as NaN compares, within any
    tolerance)."""
    if not expected.numel():
        return 0.0
    wide = torch.complex128 if actual.is_complex() or expected.is_complex() else torch.float64
    a, e = actual.to(wide), expected.to(wide)
    apart = torch.where((a == e) | (torch.isnan(a) & torch.isnan(e)), 0.0, (a - e).abs())
    return float(torch.nan_to_num(apart, nan=math.inf, posinf=math.inf).max())


def as_true(actual: torch.Tensor, expected: torch.Tensor, truth: object, tol: float) -> tuple[bool, str]:
    """Whether ``actual``, apart from ``expected`` (the model's) by more than ``tol``, is as near
    the float64 ``truth`` as ``expected`` is (within twice its error, or ``tol``): a model whose
    weights amplify rounding (trained batch norms of small variance, folded into convolutions)
    sets two float32 computations apart by more than the precision's tolerance though neither is
    wrong; and what the comparison found, for a message. A module infinitely far from the truth
    (a NaN where it holds none) is not as near it as anything."""
    if not (isinstance(truth, torch.Tensor) and truth.shape == expected.shape):
        return False, ""
    own, off = largest_difference(expected, truth), largest_difference(actual, truth)
    said = f"; against the model run in float64, the module is {off:.3g} off and the model itself {own:.3g}"
    return math.isfinite(off) and off <= max(tol, 2 * own), said


#: The most neighbours a run of tied values holds: positions move only within such runs.
MOST_TIED = 4
#: Matching positions along a dimension compares each of the module's with each of the model's:
#: dimensions longer than this are not matched.
LONGEST = 4096


@dataclass(frozen=True)
class Reordering:
    """Positions along a dimension of ``size`` taken in another order: ``moved`` pairs the
    module's position with the model's whose values it holds; ``outputs`` are the outputs (by
    index among those compared) that are the model's in that order."""

    size: int
    moved: tuple[tuple[int, int], ...]
    outputs: tuple[int, ...]

    def describe(self) -> str:
        pairs = ", ".join(f"{i} holds {j}'s" for i, j in self.moved[:6])
        more = f", and {len(self.moved) - 6} more" if len(self.moved) > 6 else ""
        return f"positions of a dimension of {self.size} in another order ({pairs}{more})"


def reordering(compared: Sequence[tuple[torch.Tensor, torch.Tensor, float]]) -> Reordering | None:
    """The reordering that makes each of ``compared`` (the module's output, the model's, the
    tolerance between them) that differs by more than its tolerance equal the model's within it:
    one permutation of the positions along a dimension of one size, the same for every such
    output (wherever that dimension lies in it), exchanging only neighbours within runs of at most
    :data:`MOST_TIED`, and no more than a quarter of the positions (or :data:`MOST_TIED`). None where
    outputs differ in shape or dtype, none differs, or no such reordering explains them all."""
    if any(a.shape != e.shape or a.dtype != e.dtype for a, e, _ in compared):
        return None
    differing = [k for k, (a, e, tol) in enumerate(compared) if largest_difference(a, e) > tol]
    if not differing:
        return None
    first, expected, tol = compared[differing[0]]
    for axis, size in enumerate(first.shape):
        order = _matching(first, expected, axis, tol)
        if order is None or not _among_neighbours(order) or int((order != torch.arange(size)).sum()) > \
                max(MOST_TIED, size // 4):  # ties are few: most positions moved is no tie
            continue
        if all(_explains(order, *compared[k]) for k in differing):
            moved = tuple((i, j) for i, j in enumerate(order.tolist()) if i != j)
            return Reordering(size, moved, tuple(differing))
    return None


def _matching(actual: torch.Tensor, expected: torch.Tensor, axis: int, tol: float) -> torch.Tensor | None:
    """For each position along ``axis`` of ``actual``, the position of ``expected`` whose values
    it holds within ``tol`` (its own where it holds those), where that makes a permutation other
    than the identity; None otherwise."""
    size = actual.shape[axis]
    if not 1 < size <= LONGEST:
        return None
    rows = actual.movedim(axis, 0).reshape(size, -1).to(torch.float64)
    theirs = expected.movedim(axis, 0).reshape(size, -1).to(torch.float64)
    if rows.is_complex() or not rows.shape[1]:
        return None
    far = torch.cdist(rows[None], theirs[None], p=float("inf"))[0]  # each row of the module's to each of the model's
    here = torch.arange(size, device=far.device)
    order = torch.where(far.diagonal() <= tol, here, far.argmin(1))
    if not bool((far[here, order] <= tol).all()) or torch.equal(order, here) or \
            torch.unique(order).numel() != size:
        return None
    return order.cpu()


def _among_neighbours(order: torch.Tensor) -> bool:
    """Whether the permutation ``order`` only exchanges positions within runs of at most
    :data:`MOST_TIED` neighbours (it maps each such run onto itself)."""
    start, reach = 0, -1
    for i, j in enumerate(order.tolist()):
        reach = max(reach, j)
        if reach == i:  # positions start..i map onto themselves: a run ends
            if i - start + 1 > MOST_TIED:
                return False
            start = i + 1
    return True


def _explains(order: torch.Tensor, actual: torch.Tensor, expected: torch.Tensor, tol: float) -> bool:
    """Whether ``actual`` is ``expected`` taken in ``order`` along one of its dimensions of that length."""
    for axis, size in enumerate(expected.shape):
        if size == order.numel() and \
                largest_difference(actual, expected.index_select(axis, order.to(expected.device))) <= tol:
            return True
    return False

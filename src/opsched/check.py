"""Checking a scheduled module against the model it was made from, within stated tolerances."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn

from opsched.errors import ExecutionError
from opsched.ir import Graph

__all__ = ["TOLERANCES", "TF32_TOLERANCE", "tf32_in_use", "tolerance", "placed_inputs", "verify_against"]

#: Absolute tolerance relative to the reference's largest magnitude, per dtype. Floating-point
#: sums reassociate (BN folding, merged convolutions, other kernels), so bitwise equality is
#: not the contract; agreement to this many ulps of the output's scale is.
TOLERANCES: dict[torch.dtype, float] = {torch.float32: 1e-4, torch.float16: 1e-2, torch.bfloat16: 5e-2,
                                        torch.float64: 1e-10}
#: float32 on a GPU whose convolutions or matrix products run in TF32 (PyTorch's default for
#: cuDNN convolutions on Ampere and later): float16's 10-bit mantissa in the products, float32
#: sums. Seen on an H100: 0.07-0.12% of the output's scale between two cuDNN algorithm choices.
TF32_TOLERANCE = 5e-3


def tf32_in_use() -> bool:
    """Whether float32 convolutions or matrix products on a GPU may run in TF32."""
    return bool(torch.backends.cudnn.allow_tf32 or torch.backends.cuda.matmul.allow_tf32)


def tolerance(reference: torch.Tensor) -> float:
    """The absolute tolerance for an output compared with ``reference``: its dtype's (TF32's for
    float32 on a GPU with TF32 on) times the reference's scale."""
    if reference.dtype == torch.float32 and reference.is_cuda and tf32_in_use():
        rel = TF32_TOLERANCE
    else:
        rel = TOLERANCES.get(reference.dtype, 1e-4)
    return rel * max(1.0, float(reference.abs().max()))


def placed_inputs(graph: Graph, inputs: Sequence[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, ...]:
    """``inputs`` moved to ``device`` and cast to ``graph``'s input dtypes (after placement)."""
    return tuple(t.to(device, getattr(torch, i.type.dtype)) for i, t in zip(graph.inputs, inputs))


def verify_against(module: nn.Module, graph: Graph, device: torch.device, model: nn.Module,
                   inputs: tuple[torch.Tensor, ...]) -> None:
    """Raise :class:`ExecutionError` unless ``module`` (running ``graph``, placed on ``device``)
    returns what ``model`` returns on ``inputs``, output by output, within :func:`tolerance`."""
    placed = placed_inputs(graph, inputs, device)
    if any(p.dtype != t.dtype or p.device != t.device for p, t in zip(placed, inputs)):  # compare like with like
        model, inputs = copy.deepcopy(model).to(device, placed[0].dtype), placed
    with torch.no_grad():
        expected = model(*inputs)
        actual = module(*inputs)
    exp = [expected] if isinstance(expected, torch.Tensor) else list(expected)
    act = [actual] if isinstance(actual, torch.Tensor) else list(actual)
    for i, (a, e) in enumerate(zip(act, exp)):
        tol = tolerance(e)
        err = float((a - e).abs().max())
        if err > tol:
            raise ExecutionError(f"the scheduled module's output {i} differs from the model's by {err:.3g} "
                                 f"(tolerance {tol:.3g}); please report this with the model")

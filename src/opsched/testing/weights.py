"""Random weights made to look trained, so that a model's outputs are worth comparing.

A model built from its config has its initialiser's weights: convolutions drawn small, batch
norms at mean 0 and variance 1, biases and some heads zero. Layer by layer its activations
shrink, and its outputs can end as nothing (transformers' MobileNetV2 at 2e-21, EfficientNet at
exactly 0), equal within any tolerance to anything a plan computes. :func:`trained_looking`
gives it the state a trained model has; the corpora (:mod:`opsched.testing.corpus`,
:mod:`opsched.testing.vision`) and ``benchmarks/transformers_all.py`` build their models with it.
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch import nn

__all__ = ["trained_looking"]


def trained_looking(model: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
    """``model`` (in eval mode) with the state a freshly built model lacks and a trained one has,
    so that a wrong result cannot hide behind outputs of nothing: the parameters its initialiser
    zeroes drawn at random (biases; classifier heads of ViT, Mixer and ResMLP, whose outputs are
    then all zero; the last batch norm of each residual branch, which silences the branch), and the
    running statistics of its batch norms, frozen ones too (:func:`_normalises`), those of its own
    activations in the call ``model(*args, **kwargs)``, each norm's taken from its input before it
    runs, so that the norms after it see activations already normalised (in eval mode: no dropout;
    a norm that sees a single value per channel, as at batch 1 after pooling, kept at its initial
    statistics), away from 0 and 1 as a trained model's are, which folding a batch norm into a
    convolution must then get right.

    Left as their initialisers make them, convolutions whose weights are drawn small and batch
    norms that do not normalise shrink the activations at every layer: the corpus's MobileNetV2
    returned outputs of 2e-21, EfficientNet's and MobileViTV2's exact zeros, equal to anything
    within a tolerance. (Statistics drawn at random instead leave activations unnormalised:
    torchvision's Inception V3's outputs reached 6.5e12. Frozen batch norms left at mean 0 and
    variance 1 did that to the backbones of transformers' detectors: D-FINE's encoder normalised
    inputs of variance 1e-25, and its float32 outputs were 410 from its float64 ones, of a scale
    of 410.)"""
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and not p.any():
                p.normal_(0.0, 0.02)
        model.eval()
        hooks = [m.register_forward_pre_hook(_takes_statistics) for m in model.modules() if _normalises(m)]
        try:
            if hooks:
                model(*args, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
    return model.eval()


def _normalises(module: nn.Module) -> bool:
    """Whether ``module`` normalises by running statistics it holds: a batch norm tracking them,
    or a frozen one (the buffers ``running_mean`` and ``running_var`` of torchvision's
    ``FrozenBatchNorm2d`` and of the detection models of transformers, DETR's to D-FINE's)."""
    return all(isinstance(getattr(module, name, None), torch.Tensor) for name in ("running_mean", "running_var"))


def _takes_statistics(norm: nn.Module, args: tuple[Any, ...]) -> None:
    """Before ``norm`` runs in :func:`trained_looking`'s pass: its running statistics those of the
    input it is given, per channel (dimension 1), the variance unbiased as training mode's
    running estimate is; unchanged where it sees a single value per channel (at batch 1 after
    pooling: no variance to take) or its input's channels are not its own. Called more than once
    in the pass, a norm keeps its last call's."""
    x = args[0]
    mean, var = cast(torch.Tensor, norm.running_mean), cast(torch.Tensor, norm.running_var)  # _normalises
    if x.dim() < 2 or x.shape[1] != mean.numel() or x.numel() == x.shape[1]:
        return
    dims = [0, *range(2, x.dim())]
    mean.copy_(x.mean(dims))
    var.copy_(x.var(dims))

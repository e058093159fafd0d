"""Random weights made to look trained, so that a model's outputs are worth comparing.

A model built from its config has its initialiser's weights: convolutions drawn small, batch
norms at mean 0 and variance 1, biases and some heads zero. Layer by layer its activations
shrink, and its outputs can end as nothing (transformers' MobileNetV2 at 2e-21, EfficientNet at
exactly 0), equal within any tolerance to anything a plan computes. :func:`trained_looking`
gives it the state a trained model has; the corpora (:mod:`opsched.testing.corpus`,
:mod:`opsched.testing.vision`) and ``benchmarks/transformers_all.py`` build their models with it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["trained_looking"]


def trained_looking(model: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
    """``model`` (in eval mode) with the state a freshly built model lacks and a trained one has,
    so that a wrong result cannot hide behind outputs of nothing: the parameters its initialiser
    zeroes drawn at random (biases; classifier heads of ViT, Mixer and ResMLP, whose outputs are
    then all zero; the last batch norm of each residual branch, which silences the branch), and its
    batch norms' running statistics those of its own activations in the call
    ``model(*args, **kwargs)`` (each batch norm in training mode for that call, the rest of the
    model in eval mode: no dropout; one that sees a single value per channel, as at batch 1 after
    pooling, kept at its initial statistics), away from 0 and 1 as a trained model's are, which
    folding a batch norm into a convolution must then get right.

    Left as their initialisers make them, convolutions whose weights are drawn small and batch
    norms that do not normalise shrink the activations at every layer: the corpus's MobileNetV2
    returned outputs of 2e-21, EfficientNet's and MobileViTV2's exact zeros, equal to anything
    within a tolerance. (Statistics drawn at random instead leave activations unnormalised:
    torchvision's Inception V3's outputs reached 6.5e12.)"""
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point() and not p.any():
                p.normal_(0.0, 0.02)
        norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        momenta = [m.momentum for m in norms]
        model.eval()
        hooks = [m.register_forward_pre_hook(_gathers) for m in norms]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average: this pass's statistics exactly
        try:
            if norms:
                model(*args, **kwargs)
        finally:
            for m, momentum, hook in zip(norms, momenta, hooks, strict=True):
                m.momentum = momentum  # the model's own again (MNASNet's is 3e-4)
                hook.remove()
    return model.eval()


def _gathers(norm: nn.Module, args: tuple[Any, ...]) -> None:
    """A batch norm's mode for a call of :func:`trained_looking`'s pass: training (gathering its
    statistics), unless it sees a single value per channel, of which training mode refuses to take any."""
    x = args[0]
    norm.train(x.dim() > 1 and x.numel() > x.shape[1])

"""Building blocks shared by the zoo, and deterministic random initialisation."""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["ConvBN", "SepConv", "randomize", "calibrate"]


class ConvBN(nn.Sequential):
    """conv (no bias) -> batch norm -> optional ReLU: the unit most CNNs are made of."""

    def __init__(self, cin: int, cout: int, kernel: int | tuple[int, int], stride: int = 1,
                 padding: int | tuple[int, int] = 0, *, relu: bool = True, groups: int = 1,
                 eps: float = 1e-3) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(cout, eps=eps),
        ]
        if relu:
            layers.append(nn.ReLU())
        super().__init__(*layers)


class SepConv(nn.Sequential):
    """ReLU -> depthwise kxk -> pointwise 1x1 -> batch norm (NasNet's and RandWire's unit)."""

    def __init__(self, cin: int, cout: int, kernel: int, stride: int = 1) -> None:
        super().__init__(
            nn.ReLU(),
            nn.Conv2d(cin, cin, kernel, stride, kernel // 2, groups=cin, bias=False),
            nn.Conv2d(cin, cout, 1, bias=False),
            nn.BatchNorm2d(cout, eps=1e-3),
        )


@torch.no_grad()
def randomize(model: nn.Module, seed: int) -> nn.Module:
    """Seeded random weights, and random batch-norm statistics so that folding is exercised.

    Convolutions and linear layers get He-normal weights (variance 2 / fan-in), which keeps
    activations of deep random networks at a sane scale; batch norms get statistics near the
    identity but not equal to it. Returns the model in eval mode.
    """
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            fan_in = m.weight[0].numel()
            m.weight.copy_(torch.randn(m.weight.shape, generator=gen) * (2.0 / fan_in) ** 0.5)
            if m.bias is not None:
                m.bias.copy_(torch.randn(m.bias.shape, generator=gen) * 0.05)
        elif isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            m.weight.copy_(0.5 + torch.rand(c, generator=gen))
            m.bias.copy_(torch.randn(c, generator=gen) * 0.1)
            assert m.running_mean is not None and m.running_var is not None  # tracked by default
            m.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)
            m.running_var.copy_(0.5 + torch.rand(c, generator=gen))
    return model.eval()


@torch.no_grad()
def calibrate(model: nn.Module, example: torch.Tensor) -> nn.Module:
    """Rescale every batch norm so its output has unit standard deviation on ``example``.

    One forward pass suffices: a hook divides each batch norm's affine weight and bias by the
    standard deviation of its output and passes the rescaled output on, so later layers are
    calibrated against already-calibrated inputs. Without this, random weights let sums of
    branches (RandWire, NASNet, ResNet) grow activations to 1e9 and beyond.
    """
    def hook(bn: nn.Module, args: object, out: torch.Tensor) -> torch.Tensor:
        assert isinstance(bn, nn.BatchNorm2d)
        std = float(out.std().clamp_min(1e-6))
        bn.weight.div_(std)
        bn.bias.div_(std)
        return out / std

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    try:
        model(example)
    finally:
        for h in handles:
            h.remove()
    return model

"""SqueezeNet 1.0 and 1.1 (Iandola et al., 2016), laid out as in torchvision.

IOS benchmarks a v1.0-style SqueezeNet with bypass convolutions (50 schedule units: 30 conv,
4 pool, 16 identity/concat-or-add). The torchvision layout used here has no bypasses: 26
convolutions (each Fire module's squeeze and two expands, stem and classifier), 3 max pools,
8 concats and the global pool, so it exposes width 2 (the two expand convolutions of a Fire
module), where the IOS variant has 3.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["SqueezeNet"]


class Fire(nn.Module):
    def __init__(self, cin: int, squeeze: int, e1: int, e3: int) -> None:
        super().__init__()
        self.squeeze = nn.Sequential(nn.Conv2d(cin, squeeze, 1), nn.ReLU())
        self.e1 = nn.Sequential(nn.Conv2d(squeeze, e1, 1), nn.ReLU())
        self.e3 = nn.Sequential(nn.Conv2d(squeeze, e3, 3, padding=1), nn.ReLU())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.squeeze(x)
        return torch.cat([self.e1(s), self.e3(s)], 1)


class SqueezeNet(nn.Module):
    def __init__(self, version: str = "1_0", num_classes: int = 1000) -> None:
        super().__init__()
        def pool() -> nn.Module:
            return nn.MaxPool2d(3, 2, ceil_mode=True)

        if version == "1_0":
            self.features = nn.Sequential(
                nn.Conv2d(3, 96, 7, stride=2), nn.ReLU(), pool(),
                Fire(96, 16, 64, 64), Fire(128, 16, 64, 64), Fire(128, 32, 128, 128), pool(),
                Fire(256, 32, 128, 128), Fire(256, 48, 192, 192), Fire(384, 48, 192, 192),
                Fire(384, 64, 256, 256), pool(), Fire(512, 64, 256, 256))
        elif version == "1_1":
            self.features = nn.Sequential(
                nn.Conv2d(3, 64, 3, stride=2), nn.ReLU(), pool(),
                Fire(64, 16, 64, 64), Fire(128, 16, 64, 64), pool(),
                Fire(128, 32, 128, 128), Fire(256, 32, 128, 128), pool(),
                Fire(256, 48, 192, 192), Fire(384, 48, 192, 192), Fire(384, 64, 256, 256),
                Fire(512, 64, 256, 256))
        else:
            raise ValueError(f"SqueezeNet version must be '1_0' or '1_1', got {version!r}")
        self.classifier = nn.Sequential(
            nn.Dropout(0.5), nn.Conv2d(512, num_classes, 1), nn.ReLU(), nn.AdaptiveAvgPool2d(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(self.classifier(self.features(x)), 1)

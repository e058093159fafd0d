"""GoogLeNet (Inception v1; Szegedy et al., 2015) with batch norm, no auxiliary heads.

Like torchvision's layout except that the "5x5" branch uses a real 5x5 convolution, as in the
paper (torchvision keeps a 3x3 there for weight compatibility). Width 4: the four branches of
each Inception module.
"""

from __future__ import annotations

import torch
from torch import nn

from opsched.models._blocks import ConvBN

__all__ = ["GoogLeNet"]


class Inception(nn.Module):
    def __init__(self, cin: int, c1: int, c3r: int, c3: int, c5r: int, c5: int, pool: int) -> None:
        super().__init__()
        self.b1 = ConvBN(cin, c1, 1)
        self.b3 = nn.Sequential(ConvBN(cin, c3r, 1), ConvBN(c3r, c3, 3, padding=1))
        self.b5 = nn.Sequential(ConvBN(cin, c5r, 1), ConvBN(c5r, c5, 5, padding=2))
        self.pool = nn.Sequential(nn.MaxPool2d(3, 1, 1, ceil_mode=True), ConvBN(cin, pool, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b3(x), self.b5(x), self.pool(x)], 1)


class GoogLeNet(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            ConvBN(3, 64, 7, 2, 3), nn.MaxPool2d(3, 2, ceil_mode=True),
            ConvBN(64, 64, 1), ConvBN(64, 192, 3, padding=1), nn.MaxPool2d(3, 2, ceil_mode=True))
        self.body = nn.Sequential(
            Inception(192, 64, 96, 128, 16, 32, 32), Inception(256, 128, 128, 192, 32, 96, 64),
            nn.MaxPool2d(3, 2, ceil_mode=True),
            Inception(480, 192, 96, 208, 16, 48, 64), Inception(512, 160, 112, 224, 24, 64, 64),
            Inception(512, 128, 128, 256, 24, 64, 64), Inception(512, 112, 144, 288, 32, 64, 64),
            Inception(528, 256, 160, 320, 32, 128, 128), nn.MaxPool2d(2, 2, ceil_mode=True),
            Inception(832, 256, 160, 320, 32, 128, 128), Inception(832, 384, 192, 384, 48, 128, 128))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.2)
        self.fc = nn.Linear(1024, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.flatten(self.pool(self.body(self.stem(x))), 1)
        return self.fc(self.dropout(x))

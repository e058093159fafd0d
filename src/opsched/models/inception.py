"""Inception V3 (Szegedy et al., 2016) at 299x299, laid out as in torchvision, no aux head.

Operator count. IOS counts 119 schedule units (94 conv, 14 pool, 11 concat) for the body;
after BN folding and ReLU fusion opsched sees the same 94 convolutions and 14 pools, plus
15 concats (IOS expresses the two inner concats of each Inception-E branch as multi-term
inputs of the outer one, so they cost it nothing), plus the classifier (flatten, linear).
"""

from __future__ import annotations

import torch
from torch import nn

from opsched.models._blocks import ConvBN

__all__ = ["InceptionV3"]


class InceptionA(nn.Module):
    def __init__(self, cin: int, pool_features: int) -> None:
        super().__init__()
        self.b1 = ConvBN(cin, 64, 1)
        self.b5 = nn.Sequential(ConvBN(cin, 48, 1), ConvBN(48, 64, 5, padding=2))
        self.b3 = nn.Sequential(ConvBN(cin, 64, 1), ConvBN(64, 96, 3, padding=1), ConvBN(96, 96, 3, padding=1))
        self.pool = nn.Sequential(nn.AvgPool2d(3, 1, 1), ConvBN(cin, pool_features, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b5(x), self.b3(x), self.pool(x)], 1)


class InceptionB(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.b3 = ConvBN(cin, 384, 3, stride=2)
        self.b3dbl = nn.Sequential(ConvBN(cin, 64, 1), ConvBN(64, 96, 3, padding=1), ConvBN(96, 96, 3, stride=2))
        self.pool = nn.MaxPool2d(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b3dbl(x), self.pool(x)], 1)


class InceptionC(nn.Module):
    def __init__(self, cin: int, c7: int) -> None:
        super().__init__()
        self.b1 = ConvBN(cin, 192, 1)
        self.b7 = nn.Sequential(ConvBN(cin, c7, 1), ConvBN(c7, c7, (1, 7), padding=(0, 3)),
                                ConvBN(c7, 192, (7, 1), padding=(3, 0)))
        self.b7dbl = nn.Sequential(
            ConvBN(cin, c7, 1), ConvBN(c7, c7, (7, 1), padding=(3, 0)), ConvBN(c7, c7, (1, 7), padding=(0, 3)),
            ConvBN(c7, c7, (7, 1), padding=(3, 0)), ConvBN(c7, 192, (1, 7), padding=(0, 3)))
        self.pool = nn.Sequential(nn.AvgPool2d(3, 1, 1), ConvBN(cin, 192, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b1(x), self.b7(x), self.b7dbl(x), self.pool(x)], 1)


class InceptionD(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.b3 = nn.Sequential(ConvBN(cin, 192, 1), ConvBN(192, 320, 3, stride=2))
        self.b7x3 = nn.Sequential(ConvBN(cin, 192, 1), ConvBN(192, 192, (1, 7), padding=(0, 3)),
                                  ConvBN(192, 192, (7, 1), padding=(3, 0)), ConvBN(192, 192, 3, stride=2))
        self.pool = nn.MaxPool2d(3, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.b3(x), self.b7x3(x), self.pool(x)], 1)


class InceptionE(nn.Module):
    def __init__(self, cin: int) -> None:
        super().__init__()
        self.b1 = ConvBN(cin, 320, 1)
        self.b3_1 = ConvBN(cin, 384, 1)
        self.b3_2a = ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.b3_2b = ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.dbl_1 = nn.Sequential(ConvBN(cin, 448, 1), ConvBN(448, 384, 3, padding=1))
        self.dbl_3a = ConvBN(384, 384, (1, 3), padding=(0, 1))
        self.dbl_3b = ConvBN(384, 384, (3, 1), padding=(1, 0))
        self.pool = nn.Sequential(nn.AvgPool2d(3, 1, 1), ConvBN(cin, 192, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b3 = self.b3_1(x)
        b3 = torch.cat([self.b3_2a(b3), self.b3_2b(b3)], 1)
        dbl = self.dbl_1(x)
        dbl = torch.cat([self.dbl_3a(dbl), self.dbl_3b(dbl)], 1)
        return torch.cat([self.b1(x), b3, dbl, self.pool(x)], 1)


class InceptionV3(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            ConvBN(3, 32, 3, stride=2), ConvBN(32, 32, 3), ConvBN(32, 64, 3, padding=1), nn.MaxPool2d(3, 2),
            ConvBN(64, 80, 1), ConvBN(80, 192, 3), nn.MaxPool2d(3, 2))
        self.blocks = nn.Sequential(
            InceptionA(192, 32), InceptionA(256, 64), InceptionA(288, 64), InceptionB(288),
            InceptionC(768, 128), InceptionC(768, 160), InceptionC(768, 160), InceptionC(768, 192),
            InceptionD(768), InceptionE(1280), InceptionE(2048))
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(self.blocks(self.stem(x)))
        return self.fc(self.dropout(torch.flatten(x, 1)))

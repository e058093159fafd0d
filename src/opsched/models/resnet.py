"""ResNet-50 and ResNet-18 (He et al., 2016; stride on the 3x3 convolution, as in torchvision's
v1.5).

ResNet-50 is a reference with little inter-operator parallelism: width 2 (the projection shortcut beside
the bottleneck in the first block of each stage). IOS counts 86 schedule units for its
ResNet-50; opsched sees 53 convs, 16 adds, a max pool, the global pool, flatten and linear.
"""

from __future__ import annotations

import torch
from torch import nn

from opsched.models._blocks import ConvBN

__all__ = ["ResNet18", "ResNet50"]


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * 4
        self.body = nn.Sequential(
            ConvBN(cin, width, 1, eps=1e-5), ConvBN(width, width, 3, stride, 1, eps=1e-5),
            ConvBN(width, cout, 1, relu=False, eps=1e-5))
        self.shortcut = (ConvBN(cin, cout, 1, stride, relu=False, eps=1e-5)
                         if stride != 1 or cin != cout else nn.Identity())
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class Basic(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(ConvBN(cin, cout, 3, stride, 1, eps=1e-5),
                                  ConvBN(cout, cout, 3, 1, 1, relu=False, eps=1e-5))
        self.shortcut = (ConvBN(cin, cout, 1, stride, relu=False, eps=1e-5)
                         if stride != 1 or cin != cout else nn.Identity())
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.relu(self.body(x) + self.shortcut(x))


class ResNet18(nn.Module):
    """ResNet-18: two 3x3 convolutions per block, two blocks per stage."""

    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(ConvBN(3, 64, 7, 2, 3, eps=1e-5), nn.MaxPool2d(3, 2, 1))
        layers: list[nn.Module] = []
        cin = 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            layers += [Basic(cin, cout, stride), Basic(cout, cout, 1)]
            cin = cout
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = nn.Sequential(ConvBN(3, 64, 7, 2, 3, eps=1e-5), nn.MaxPool2d(3, 2, 1))
        layers: list[nn.Module] = []
        cin = 64
        for width, blocks, stride in ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)):
            for i in range(blocks):
                layers.append(Bottleneck(cin, width, stride if i == 0 else 1))
                cin = width * 4
        self.layers = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(2048, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

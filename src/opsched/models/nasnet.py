"""NASNet-A (Zoph et al., 2018): mobile (4@1056, 224x224) and large (6@4032, 331x331).

The cells follow the published NASNet-A normal and reduction cells (the TF-slim definition):
each cell first brings its two inputs, the previous cell's output h and the one before, h',
to ``f`` channels (h: ReLU-1x1 conv-BN; h': the same, or a factorised reduction when its
spatial size is twice h's), then combines them by five pairwise sums of separable convs
(ReLU-SepConv-BN twice), 3x3 pools and identities, and concatenates the unused hidden states.
Stem: a 3x3/2 conv, then two reduction cells at f/4 and f/2; then N normal cells at f, a
reduction cell at 2f, N normal at 2f, a reduction at 4f, N normal at 4f. Every cell reads the
outputs of the previous two cells (TF-slim's ``skip_reduction_layer_input`` variant is not
modelled).

IOS counts 374 schedule units (861 primitives) for NasNet-A large, treating ReLU-SepConv as
one unit; opsched sees ReLUs, depthwise and pointwise convs separately, and repeats the ReLU
of a hidden state in every branch that reads it, as the model does.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from opsched.models._blocks import ConvBN, SepConv

__all__ = ["NASNetA"]


class SepStack(nn.Sequential):
    """NASNet's 'separable_kxk_2': ReLU-SepConv-BN twice, the first with the stride."""

    def __init__(self, c: int, kernel: int, stride: int) -> None:
        super().__init__(SepConv(c, c, kernel, stride), SepConv(c, c, kernel, 1))


class FactorizedReduce(nn.Module):
    """Halve the spatial size with two offset 1x1 paths, concatenated (c must be even)."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.relu = nn.ReLU()
        self.path1 = nn.Sequential(nn.AvgPool2d(1, 2), nn.Conv2d(cin, cout // 2, 1, bias=False))
        self.path2 = nn.Sequential(nn.AvgPool2d(1, 2), nn.Conv2d(cin, cout - cout // 2, 1, bias=False))
        self.bn = nn.BatchNorm2d(cout, eps=1e-3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(x)
        shifted = F.pad(x, (0, 1, 0, 1))[:, :, 1:, 1:]
        return self.bn(torch.cat([self.path1(x), self.path2(shifted)], 1))


def _adjust(cin: int, cout: int, reduce: bool) -> nn.Module:
    if reduce:
        return FactorizedReduce(cin, cout)
    return nn.Sequential(nn.ReLU(), ConvBN(cin, cout, 1, relu=False))


def _op(kind: str, c: int, stride: int) -> nn.Module:
    if kind.startswith("sep"):
        return SepStack(c, int(kind[3]), stride)
    if kind == "avg":
        return nn.AvgPool2d(3, stride, 1, count_include_pad=False)
    if kind == "max":
        return nn.MaxPool2d(3, stride, 1)
    assert kind == "id" and stride == 1
    return nn.Identity()


# (left op, left input, right op, right input) per combination; hidden states 0 = h, 1 = h',
# then 2, 3, ... the combinations in order. ``_OUTPUT`` lists the states concatenated.
_NORMAL = (("sep5", 0, "sep3", 1), ("sep5", 1, "sep3", 1), ("avg", 0, "id", 1),
           ("avg", 1, "avg", 1), ("sep3", 0, "id", 0))
_REDUCTION = (("sep5", 0, "sep7", 1), ("max", 0, "sep7", 1), ("avg", 0, "sep5", 1),
              ("id", 3, "avg", 2), ("sep3", 2, "max", 0))
_OUTPUT = {"normal": (1, 2, 3, 4, 5, 6), "reduction": (3, 4, 5, 6)}


class Cell(nn.Module):
    def __init__(self, kind: str, c_h: int, c_prev: int, prev_reduce: bool, f: int) -> None:
        super().__init__()
        self.kind = kind
        self.base = _adjust(c_h, f, False)
        self.base_prev = _adjust(c_prev, f, prev_reduce)
        stride = 2 if kind == "reduction" else 1
        recipe = _NORMAL if kind == "normal" else _REDUCTION
        self.recipe = [(li, ri) for _, li, _, ri in recipe]
        self.left = nn.ModuleList(_op(lo, f, stride if li < 2 else 1) for lo, li, _, _ in recipe)
        self.right = nn.ModuleList(_op(ro, f, stride if ri < 2 else 1) for _, _, ro, ri in recipe)
        self.channels = f * len(_OUTPUT[kind])

    def forward(self, h: torch.Tensor, h_prev: torch.Tensor) -> torch.Tensor:
        states = [self.base(h), self.base_prev(h_prev)]
        for (li, ri), left, right in zip(self.recipe, self.left, self.right):
            states.append(left(states[li]) + right(states[ri]))
        return torch.cat([states[i] for i in _OUTPUT[self.kind]], 1)


class NASNetA(nn.Module):
    def __init__(self, cells_per_stage: int = 4, filters: int = 44, stem_filters: int = 32,
                 num_classes: int = 1000) -> None:
        super().__init__()
        self.stem = ConvBN(3, stem_filters, 3, stride=2, relu=False)
        plan = [("reduction", filters // 4), ("reduction", filters // 2)]
        for stage in range(3):
            if stage:
                plan.append(("reduction", filters * 2 ** stage))
            plan += [("normal", filters * 2 ** stage)] * cells_per_stage
        cells = []
        # (channels, is spatially larger than the next cell's h) of the last two outputs
        c_prev, c_h = stem_filters, stem_filters
        prev_reduce = False
        for kind, f in plan:
            cell = Cell(kind, c_h, c_prev, prev_reduce, f)
            cells.append(cell)
            # the next cell's h' is this cell's h: it is larger iff this cell reduces
            prev_reduce = kind == "reduction"
            c_prev, c_h = c_h, cell.channels
        # the very first cell reads the stem twice (h' = h), so it needs no reduction
        self.cells = nn.ModuleList(cells)
        self.relu = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(c_h, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h_prev = h = self.stem(x)
        for cell in self.cells:
            h_prev, h = h, cell(h, h_prev)
        x = torch.flatten(self.pool(self.relu(h)), 1)
        return self.fc(self.dropout(x))

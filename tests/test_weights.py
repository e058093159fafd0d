"""``opsched.testing.weights.trained_looking``: the state it gives a freshly built model, checked
exactly against statistics computed by hand."""

from __future__ import annotations

import torch
from torch import nn

from opsched.testing.weights import trained_looking


class FrozenNorm(nn.Module):
    """A frozen batch norm as torchvision's and transformers' detectors hold them: its
    statistics and affine terms buffers, not parameters, and not a ``_BatchNorm``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.register_buffer("weight", torch.ones(n))
        self.register_buffer("bias", torch.zeros(n))
        self.register_buffer("running_mean", torch.zeros(n))
        self.register_buffer("running_var", torch.ones(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = self.weight * (self.running_var + 1e-5).rsqrt()
        return x * scale[:, None, None] + (self.bias - self.running_mean * scale)[:, None, None]


def _net() -> nn.Sequential:
    torch.manual_seed(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3),  # 0
        nn.BatchNorm2d(8, momentum=3e-4),  # 1: a model's own momentum, which it must keep
        nn.Dropout(0.5),  # 2: off in the calibrating call, or the statistics are of dropped activations
        nn.Conv2d(8, 6, 3, bias=False),  # 3
        FrozenNorm(6),  # 4
        nn.AdaptiveAvgPool2d(1),  # 5
        nn.Flatten(),  # 6
        nn.BatchNorm1d(6),  # 7: a single value per channel at batch 1
        nn.Linear(6, 4),  # 8
    )
    with torch.no_grad():
        net[1].weight.zero_()  # zeroed as a residual branch's last norm is, silencing the branch
        net[8].bias.zero_()
    return net.train()


def _statistics(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    dims = [0, *range(2, x.dim())]
    return x.mean(dims), x.var(dims)


def test_each_norm_frozen_or_not_takes_the_statistics_of_its_input_after_the_norms_before_it() -> None:
    net = _net()
    x = torch.randn(2, 3, 10, 10) * 5 + 3
    trained_looking(net, x)
    with torch.no_grad():
        h = net[0](x)
        mean, var = _statistics(h)
        torch.testing.assert_close(net[1].running_mean, mean, rtol=0, atol=1e-6)
        torch.testing.assert_close(net[1].running_var, var, rtol=1e-6, atol=0)
        h = net[3](net[1](h))
        mean, var = _statistics(h)  # the frozen norm's input, the first norm calibrated before it
        torch.testing.assert_close(net[4].running_mean, mean, rtol=0, atol=1e-6)
        torch.testing.assert_close(net[4].running_var, var, rtol=1e-6, atol=0)
        stats = net[4].running_var
        mean, var = _statistics(net[4](h))  # normalised: a norm again, not the identity it was built as
        torch.testing.assert_close(mean, torch.zeros(6), rtol=0, atol=1e-5)
        torch.testing.assert_close(var, stats / (stats + 1e-5), rtol=1e-5, atol=0)
    assert not net.training and not any(m.training for m in net.modules())
    assert net[1].momentum == 3e-4
    assert net[1].weight.abs().min() > 0 and net[8].bias.abs().min() > 0  # the zeroed parameters, drawn


def test_a_norm_that_sees_one_value_per_channel_keeps_its_statistics_and_at_batch_two_takes_them() -> None:
    net = trained_looking(_net(), torch.randn(1, 3, 10, 10))
    assert torch.equal(net[7].running_mean, torch.zeros(6)) and torch.equal(net[7].running_var, torch.ones(6))
    net = trained_looking(_net(), torch.randn(2, 3, 10, 10))
    assert not torch.equal(net[7].running_var, torch.ones(6))


def test_parameters_the_initialiser_drew_are_kept_and_a_model_without_norms_is_not_called() -> None:
    calls = []
    net = nn.Linear(3, 3)
    before = net.weight.detach().clone()
    net.register_forward_hook(lambda *_: calls.append(1))
    trained_looking(net, torch.randn(2, 3))
    assert not calls and not net.training
    assert torch.equal(net.weight, before)

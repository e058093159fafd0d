"""A fuzzer: seeded random DAG modules, run through every scheduler, backend and frontend.

:class:`FuzzNet` builds, from a seed, an ordinary ``nn.Module`` whose forward is a random DAG of
9-66 operators over NCHW tensors: convolutions of every kind (grouped, depthwise, dilated,
strided, rectangular, "same"-padded, transposed), pools, norms, activations (some in place),
add/mul/sub/div (broadcasting too), concatenation and splits, matrix products, softmax,
interpolation, padding, permutes, reshapes, linear layers, reductions; one to three outputs.
Shapes are tracked by running each operator on an example tensor as it is chosen, so every
model is valid by construction.

:mod:`opsched.testing.fuzz_check` runs such models through every frontend, scheduler and backend.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["FuzzNet"]


Apply = Callable[["FuzzNet", list[torch.Tensor]], torch.Tensor]


@dataclass(frozen=True)
class _Step:
    kind: str
    inputs: tuple[int, ...]
    apply: Apply


def _act(name: str, rng: random.Random) -> tuple[nn.Module | None, Callable[[torch.Tensor], torch.Tensor]]:
    """An activation as a module (sometimes in place) or a function, of many kinds."""
    modules: dict[str, Callable[[], nn.Module]] = {
        "relu": lambda: nn.ReLU(inplace=rng.random() < 0.3), "relu6": nn.ReLU6, "sigmoid": nn.Sigmoid,
        "tanh": nn.Tanh, "gelu": lambda: nn.GELU(rng.choice(["none", "tanh"])), "silu": nn.SiLU,
        "hardswish": nn.Hardswish, "hardsigmoid": nn.Hardsigmoid, "leaky_relu": lambda: nn.LeakyReLU(0.1),
        "elu": nn.ELU, "softplus": nn.Softplus, "mish": nn.Mish,
    }
    functions: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
        "relu": F.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "gelu": F.gelu, "silu": F.silu,
        "relu_": lambda t: t.relu_(), "hardswish": F.hardswish,
    }
    if name in functions and rng.random() < 0.4:
        return None, functions[name]
    module = modules.get(name, nn.ReLU)()
    return module, module


class FuzzNet(nn.Module):
    """A random DAG module, the same for the same ``seed`` (see the module docstring)."""

    def __init__(self, seed: int, ops: int | None = None) -> None:
        super().__init__()
        with torch.random.fork_rng():  # the modules' own initial weights: the same for the same seed
            torch.manual_seed(seed)
            self._build(seed, ops)
        self.eval()

    def _build(self, seed: int, ops: int | None) -> None:
        rng = random.Random(seed)
        gen = torch.Generator().manual_seed(seed)
        self.seed = seed
        self.mods = nn.ModuleDict()
        self.weights = nn.ParameterDict()
        self.steps: list[_Step] = []
        batch, channels, size = rng.choice([1, 1, 2]), rng.randint(3, 8), rng.randint(8, 20)
        self.input_shape = (batch, channels, size, size)
        values = [torch.randn(self.input_shape, generator=gen)]
        target = ops or rng.randint(9, 66)
        attempts = 0
        while len(self.steps) < target and attempts < 20 * target:
            attempts += 1
            kind = rng.choice(_KINDS)
            made = _MAKERS[kind](self, rng, gen, values)
            if made is None:
                continue
            inputs, apply = made
            step = _Step(kind, inputs, apply)
            try:
                with torch.no_grad():  # on the values themselves: in-place calls and views act as in forward
                    out = apply(self, [values[i] for i in inputs])
            except (RuntimeError, ValueError):  # what torch refuses here: a kernel too large, an in-place
                # write into memory that the other operand shares
                self._drop(len(self.steps))
                continue
            if out.dim() != 4 or out.numel() == 0 or out.numel() > 2**16 or not torch.isfinite(out).all():
                self._drop(len(self.steps))
                continue
            self.steps.append(step)
            values.append(out)
        used = {i for s in self.steps for i in s.inputs}
        sinks = [k for k in range(1, len(values)) if k not in used] or [len(values) - 1]
        self.outputs = tuple(rng.sample(sinks, min(len(sinks), rng.randint(1, 3))))

    def _drop(self, index: int) -> None:
        for table in (self.mods, self.weights):
            for key in [k for k in table if k.startswith(f"s{index}_")]:
                del table[key]

    def add(self, index_hint: str, module: nn.Module) -> str:
        """Hold the next step's module; its key."""
        key = f"s{len(self.steps)}_{index_hint}"
        self.mods[key] = module.eval()
        return key

    def weight(self, index_hint: str, value: torch.Tensor) -> str:
        """Hold the next step's parameter; its key."""
        key = f"s{len(self.steps)}_{index_hint}"
        self.weights[key] = nn.Parameter(value)
        return key

    def forward(self, x: torch.Tensor) -> Any:
        values = [x]
        for step in self.steps:
            values.append(step.apply(self, [values[i] for i in step.inputs]))
        outs = tuple(values[k] for k in self.outputs)
        return outs[0] if len(outs) == 1 else outs


# --- operator makers: each picks inputs among the values so far and returns (inputs, apply) ------
Maker = Callable[[FuzzNet, random.Random, torch.Generator, list[torch.Tensor]], tuple[tuple[int, ...], Apply] | None]


def _pick(rng: random.Random, values: list[torch.Tensor]) -> int:
    """Later values more often: deep graphs, not only fans from the input."""
    return min(len(values) - 1, int(len(values) * rng.random() ** 0.5))


def _conv(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    cin, h = values[i].shape[1], values[i].shape[2]
    kernel: Any = rng.choice([1, 1, 3, 3, 5, (1, 3), (3, 1), (1, 7), (7, 1)])
    groups = rng.choice([1, 1, 1, cin, next(g for g in (4, 3, 2, 1) if cin % g == 0)])
    cout = cin * rng.choice([1, 2]) if groups == cin else rng.choice([groups * k for k in (1, 2, 4, 6)])
    stride = rng.choice([1, 1, 1, 2])
    dilation = rng.choice([1, 1, 1, 2])
    padding: Any = rng.choice([0, 1, 2, (0, 1), "same"]) if stride == 1 else rng.choice([0, 1, 2])
    if padding == "same" and dilation > 1 and rng.random() < 0.5:
        padding = 0
    if rng.random() < 0.1 and h >= 4:
        module: nn.Module = nn.ConvTranspose2d(cin, cout, rng.choice([2, 3]), stride=2)
    else:
        module = nn.Conv2d(cin, cout, kernel, stride, padding, dilation, groups, bias=rng.random() < 0.7)
    key = net.add("conv", module)
    return (i,), lambda n, xs: n.mods[key](xs[0])


def _pool(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    h = values[i].shape[2]
    k = rng.choice([2, 3])
    if h < k:
        return None
    stride, padding = rng.choice([1, 2, k]), rng.choice([0, k // 2])
    ceil = rng.random() < 0.3
    module: nn.Module = (nn.MaxPool2d(k, stride, padding, ceil_mode=ceil) if rng.random() < 0.5 else
                         nn.AvgPool2d(k, stride, padding, ceil_mode=ceil, count_include_pad=rng.random() < 0.5))
    key = net.add("pool", module)
    return (i,), lambda n, xs: n.mods[key](xs[0])


def _adaptive(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    module = rng.choice([nn.AdaptiveAvgPool2d(1), nn.AdaptiveAvgPool2d(2), nn.AdaptiveMaxPool2d(1)])
    key = net.add("adaptive", module)
    return (i,), lambda n, xs: n.mods[key](xs[0])


def _norm(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    c, w = values[i].shape[1], values[i].shape[3]
    choice = rng.random()
    if choice < 0.5:
        bn = nn.BatchNorm2d(c).eval()
        with torch.no_grad():
            bn.running_mean.copy_(torch.randn(c, generator=gen) * 0.1)  # type: ignore[union-attr]
            bn.running_var.copy_(0.5 + torch.rand(c, generator=gen))  # type: ignore[union-attr]
            bn.weight.copy_(0.5 + torch.rand(c, generator=gen))
        module: nn.Module = bn
    elif choice < 0.7:
        module = nn.GroupNorm(next(g for g in (4, 2, 1) if c % g == 0), c)
    elif choice < 0.85:
        module = nn.LayerNorm([w])
    else:
        module = nn.InstanceNorm2d(c)
    key = net.add("norm", module)
    return (i,), lambda n, xs: n.mods[key](xs[0])


def _activation(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    name = rng.choice(["relu", "relu", "relu6", "sigmoid", "tanh", "gelu", "silu", "hardswish", "hardsigmoid",
                       "leaky_relu", "elu", "softplus", "mish", "relu_"])
    module, fn = _act(name, rng)
    if module is None:
        return (i,), lambda n, xs: fn(xs[0])
    key = net.add("act", module)
    return (i,), lambda n, xs: n.mods[key](xs[0])


def _binary(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    shape = values[i].shape
    partners = [j for j, v in enumerate(values) if j != i and
                (v.shape == shape or v.shape == (shape[0], shape[1], 1, 1))]
    op = rng.choice(["add", "add", "mul", "sub", "div", "mask", "scalar", "param"])
    if op == "scalar":
        c = rng.choice([3.0, 0.5, -2.0])
        return (i,), (lambda n, xs: xs[0] / c) if rng.random() < 0.5 else (lambda n, xs: xs[0] * c + 1)
    if op == "param" or not partners:
        key = net.weight("scale", torch.randn(1, shape[1], 1, 1, generator=gen))
        return (i,), lambda n, xs: xs[0] * n.weights[key]
    j = rng.choice(partners)
    functions: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
        "add": torch.add, "mul": torch.mul, "sub": torch.sub,
        "div": lambda a, b: a / (b.abs() + 1.0),
        # a bool operand, promoted to a's dtype; at a threshold no value sits at by construction
        # (a normalised value's mean is 0 give or take rounding, which a threshold of 0 flips)
        "mask": lambda a, b: a * (b.abs() > 0.3),
    }
    fn = functions[op]
    if op == "add" and rng.random() < 0.3:
        def augmented(n: FuzzNet, xs: list[torch.Tensor]) -> torch.Tensor:
            a = xs[0]
            a += xs[1]  # in place, on a value that other operators may read
            return a
        return (i, j), augmented
    return (i, j), lambda n, xs: fn(xs[0], xs[1])


def _cat(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    b, _, h, w = values[i].shape
    partners = [j for j, v in enumerate(values) if v.shape[0] == b and v.shape[2:] == (h, w)]
    picked = tuple(rng.sample(partners, min(len(partners), rng.randint(2, 3))))
    if len(picked) < 2:
        return None
    return picked, lambda n, xs: torch.cat(xs, 1)


def _split(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    c = values[i].shape[1]
    if c < 2:
        return None
    piece = rng.randint(0, 1)
    if rng.random() < 0.5:
        return (i,), lambda n, xs: torch.chunk(xs[0], 2, 1)[piece]
    size = rng.randint(1, c - 1)
    return (i,), lambda n, xs: xs[0].split([size, c - size], 1)[piece]


def _matmul(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    c = values[i].shape[1]
    cout = rng.choice([4, 8, 16])
    key = net.weight("matmul", torch.randn(c, cout, generator=gen) / c**0.5)

    def apply(n: FuzzNet, xs: list[torch.Tensor]) -> torch.Tensor:
        b, _, h, w = xs[0].shape
        y = torch.matmul(xs[0].flatten(2).transpose(1, 2), n.weights[key])  # (b, h*w, cout)
        return y.transpose(1, 2).reshape(b, -1, h, w)
    return (i,), apply


def _softmax(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    dim = rng.choice([1, -1])
    return (i,), lambda n, xs: torch.softmax(xs[0], dim)


def _resize(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    h = values[i].shape[2]
    if h > 16:
        return None
    mode = rng.choice(["nearest", "bilinear"])
    if rng.random() < 0.5:
        return (i,), lambda n, xs: F.interpolate(xs[0], scale_factor=2.0, mode=mode)
    size = rng.randint(h, 2 * h)
    return (i,), lambda n, xs: F.interpolate(xs[0], size=(size, size), mode=mode)


def _pad(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    h = values[i].shape[2]
    pads = tuple(rng.choice([0, 1, 2]) for _ in range(4))
    if rng.random() < 0.3 and h > max(pads):
        return (i,), lambda n, xs: F.pad(xs[0], pads, mode="reflect")
    value = rng.choice([0.0, 1.0])
    return (i,), lambda n, xs: F.pad(xs[0], pads, value=value)


def _reshape(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    b, c, h, w = values[i].shape
    kind = rng.random()
    if kind < 0.25:
        return (i,), lambda n, xs: xs[0].permute(0, 1, 3, 2).contiguous() if h != w else xs[0].transpose(2, 3)
    if kind < 0.5:  # dimensions counted from the end, as models write them
        if rng.random() < 0.5 and w >= 2:
            return (i,), lambda n, xs: xs[0].unfold(-1, 2, 2).amax(-1).flip(-2)
        return (i,), lambda n, xs: xs[0].permute(0, -3, -1, -2).contiguous() if h != w else xs[0].transpose(-1, -2)
    if h % 2:
        return None
    return (i,), lambda n, xs: xs[0].reshape(b, c * 2, h // 2, w)


def _linear(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    features = values[i][0].numel()
    if features > 4096:
        return None
    key = net.add("linear", nn.Linear(features, rng.choice([8, 16])))
    return (i,), lambda n, xs: n.mods[key](torch.flatten(xs[0], 1))[:, :, None, None]


def _reduce(net: FuzzNet, rng: random.Random, gen: torch.Generator, values: list[torch.Tensor]) -> Any:
    i = _pick(rng, values)
    if rng.random() < 0.5:
        return (i,), lambda n, xs: xs[0].mean((2, 3), keepdim=True)
    return (i,), lambda n, xs: xs[0].amax(1, keepdim=True)


_MAKERS: dict[str, Maker] = {
    "conv": _conv, "pool": _pool, "adaptive": _adaptive, "norm": _norm, "activation": _activation,
    "binary": _binary, "cat": _cat, "split": _split, "matmul": _matmul, "softmax": _softmax, "resize": _resize,
    "pad": _pad, "reshape": _reshape, "linear": _linear, "reduce": _reduce,
}
#: Convolutions and activations most often, as in real networks.
_COMMON = {"conv": 5, "activation": 3, "binary": 2}
_KINDS = [k for k, n in _COMMON.items() for _ in range(n)] + [k for k in _MAKERS if k not in _COMMON]

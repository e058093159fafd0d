"""What both torch importers (torch.export and torch.fx) emit for torch's operators.

The attribute conventions live here, once, so that a model imports to the same graph (the same
structural hash, the same schedules, the same profile-store entries) through either: windows as
pairs, a convolution's ``"same"`` padding resolved, a batch norm's four parameters in one order.
Each function raises :class:`~opsched.frontends._common.Unsupported` for a configuration the op
does not model; the importer then keeps the call generic (or opaque).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opsched.frontends._common import ConversionContext, Unsupported
from opsched.ir.ops._common import pair

__all__ = ["arg", "tensor_arg", "conv2d", "linear", "batch_norm", "pool", "adaptive_avg_pool", "gelu", "slices", "pad",
           "concat"]


def arg(args: Sequence[Any], kwargs: dict[str, Any], i: int, key: str, default: Any = None) -> Any:
    """A call's arg ``i`` (named ``key``), positional or keyword, else ``default``."""
    if len(args) > i:
        return args[i]
    return kwargs.get(key, default)


def tensor_arg(v: Any) -> str:
    """``v`` as a graph value; anything else is a form the converter does not handle."""
    if not isinstance(v, str):
        raise Unsupported
    return v


def _padding(padding: Any, kernel: tuple[int, int], dilation: tuple[int, int]) -> tuple[int, int]:
    if padding == "valid":
        return (0, 0)
    if padding == "same":  # symmetric only: an even effective kernel is padded unevenly by torch
        reach = [d * (k - 1) for d, k in zip(dilation, kernel)]
        if any(r % 2 for r in reach):
            raise Unsupported
        return (reach[0] // 2, reach[1] // 2)
    return pair(padding)


def conv2d(ctx: ConversionContext, name: str, x: str, weight: str, bias: str | None, stride: Any, padding: Any,
           dilation: Any, groups: int) -> str:
    w = ctx.b.params[weight]
    if w.dim() != 4:
        raise Unsupported
    kernel = (int(w.shape[2]), int(w.shape[3]))
    params = [weight] if bias is None else [weight, bias]
    return ctx.add("conv2d", [x], name=name, params=params, stride=pair(stride),
                   padding=_padding(padding, kernel, pair(dilation)), dilation=pair(dilation), groups=int(groups),
                   act="none")


def linear(ctx: ConversionContext, name: str, x: str, weight: str, bias: str | None) -> str:
    return ctx.add("linear", [x], name=name, params=[weight] if bias is None else [weight, bias], act="none")


def batch_norm(ctx: ConversionContext, name: str, x: str, params: Sequence[str], eps: float) -> str:
    """``params``: weight, bias, running mean, running variance."""
    return ctx.add("batch_norm", [x], name=name, params=list(params), eps=float(eps))


def pool(ctx: ConversionContext, op: str, name: str, x: str, kernel: Any, stride: Any, padding: Any, *,
         ceil_mode: bool, dilation: Any = None, count_include_pad: bool | None = None) -> str:
    """``max_pool2d`` (with ``dilation``) or ``avg_pool2d`` (with ``count_include_pad``)."""
    attrs: dict[str, Any] = {"kernel": pair(kernel), "stride": pair(stride if stride not in (None, (), []) else kernel),
                             "padding": pair(padding), "ceil_mode": bool(ceil_mode)}
    if dilation is not None:
        attrs["dilation"] = pair(dilation)
    if count_include_pad is not None:
        attrs["count_include_pad"] = bool(count_include_pad)
    return ctx.add(op, [x], name=name, **attrs)


def adaptive_avg_pool(ctx: ConversionContext, name: str, x: str, size: Any) -> str:
    if size is None or (isinstance(size, (tuple, list)) and None in size):
        raise Unsupported
    return ctx.add("adaptive_avg_pool2d", [x], name=name, output_size=pair(size))


def gelu(ctx: ConversionContext, name: str, x: str, approximate: str) -> str:
    if approximate == "none":  # the default is no attribute, so that it can fuse into its producer
        return ctx.add("gelu", [x], name=name)
    return ctx.add("gelu", [x], name=name, approximate=approximate)


def slices(ctx: ConversionContext, name: str, x: str, sizes: Sequence[int], dim: int) -> tuple[str, ...]:
    """``x`` cut along ``dim`` into pieces of ``sizes`` (a split, a chunk)."""
    outs, start = [], 0
    for i, size in enumerate(sizes):
        outs.append(ctx.add("slice", [x], name=f"{name}_{i}", axis=dim, start=start, end=start + size))
        start += size
    return tuple(outs)


def pad(ctx: ConversionContext, name: str, x: str, pads: Sequence[int], value: float | None) -> str:
    return ctx.add("pad", [x], name=name, pads=tuple(int(p) for p in pads), value=float(value or 0.0))


def concat(ctx: ConversionContext, name: str, values: Sequence[str], dim: int) -> str:
    """``torch.cat``: a 1-D tensor of size 0 among the inputs is skipped, as torch skips it
    whatever the others' rank (an empty key-value cache before its first step)."""
    kept = [v for v in values if ctx.type(v).shape != (0,)]
    if not kept:
        raise Unsupported
    return ctx.add("concat", kept, name=name, axis=dim)

"""The ATen converter table: per ATen overload, a converter to one of our ops.

A converter gets the conversion (:class:`~opsched.frontends.torch_export.ExportConverter`), the
exported node, and its arguments with nodes replaced by what they hold: a value name (``str``), a
known tensor (:class:`~opsched.frontends.torch_export.Const`), a tuple of those, or a Python
constant. It raises :class:`~opsched.frontends._common.Unsupported` for a configuration our op
does not model, and the call stays a generic ATen node. The attribute conventions are
:mod:`opsched.frontends.torch_emit`'s, shared with the torch.fx importer.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.fx

from opsched.frontends import torch_emit as emit
from opsched.frontends._common import Unsupported
from opsched.frontends.torch_emit import arg, tensor_arg
from opsched.ir.ops.activation import ACTIVATIONS
from opsched.ir.ops.aten import generic_kind, overload, target_of

if TYPE_CHECKING:
    from opsched.frontends.torch_export import ExportConverter

__all__ = ["ATEN_CONVERTERS", "AtenConverter", "getitem"]

AtenConverter = Callable[["ExportConverter", torch.fx.Node, list[Any], dict[str, Any]], Any]
ATEN_CONVERTERS: dict[torch._ops.OpOverload, AtenConverter] = {}
getitem = operator.getitem
aten = torch.ops.aten


def _on(*ops: torch._ops.OpOverload) -> Callable[[AtenConverter], AtenConverter]:
    def deco(fn: AtenConverter) -> AtenConverter:
        for op in ops:
            ATEN_CONVERTERS[op] = fn
        return fn
    return deco




def _optional(c: ExportConverter, v: Any) -> str | None:
    return None if v is None else c.param(v)


@_on(aten.conv2d.default, aten.conv2d.padding)
def _conv2d(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    bias = _optional(c, arg(args, kwargs, 2, "bias"))
    return emit.conv2d(c.ctx, c.name(n), tensor_arg(args[0]), c.param(args[1]), bias, arg(args, kwargs, 3, "stride", 1),
                       arg(args, kwargs, 4, "padding", 0), arg(args, kwargs, 5, "dilation", 1),
                       arg(args, kwargs, 6, "groups", 1))


@_on(aten.convolution.default)
def _convolution(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    x, weight, bias, stride, padding, dilation, transposed, _, groups = args
    if transposed:
        raise Unsupported
    return emit.conv2d(c.ctx, c.name(n), tensor_arg(x), c.param(weight), _optional(c, bias), stride, padding, dilation,
                       groups)


@_on(aten.linear.default)
def _linear(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    bias = _optional(c, arg(args, kwargs, 2, "bias"))
    return emit.linear(c.ctx, c.name(n), tensor_arg(args[0]), c.param(args[1]), bias)


def _batch_norm(c: ExportConverter, n: torch.fx.Node, x: Any, weight: Any, bias: Any, mean: Any, var: Any,
                eps: float) -> str:
    from opsched.frontends.torch_export import Const

    if not isinstance(mean, Const) or not isinstance(var, Const):
        raise Unsupported  # statistics computed from the batch: not a fixed affine map
    stem = mean.name.rsplit(".", 1)[0]
    weight = weight if weight is not None else Const(torch.ones_like(mean.tensor), f"{stem}.weight")
    bias = bias if bias is not None else Const(torch.zeros_like(mean.tensor), f"{stem}.bias")
    return emit.batch_norm(c.ctx, c.name(n), tensor_arg(x), [c.param(t) for t in (weight, bias, mean, var)], eps)


@_on(aten._native_batch_norm_legit_no_training.default)
def _batch_norm_inference(c: ExportConverter, n: torch.fx.Node, args: list[Any],
                          kwargs: dict[str, Any]) -> tuple[str | None, ...]:
    x, weight, bias, mean, var, _, eps = args
    return (_batch_norm(c, n, x, weight, bias, mean, var, eps), None, None)  # the statistics: generic if read


@_on(aten.batch_norm.default)
def _batch_norm_call(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    x, weight, bias, mean, var, training, _, eps = args[:8]
    if training:
        raise Unsupported
    return _batch_norm(c, n, x, weight, bias, mean, var, eps)


def _unary(op: str) -> AtenConverter:
    def convert(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
        return c.ctx.add(op, [tensor_arg(args[0])], name=c.name(n))
    return convert


for _act in ACTIVATIONS.values():  # the one table of activations says how ATen spells each
    _on(*(overload(t) for t in _act.aten))(_unary(_act.name))


@_on(aten.hardtanh.default)
def _hardtanh(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    if (arg(args, kwargs, 1, "min_val", -1.0), arg(args, kwargs, 2, "max_val", 1.0)) != (0.0, 6.0):
        raise Unsupported
    return c.ctx.add("relu6", [tensor_arg(args[0])], name=c.name(n))


@_on(aten.gelu.default)
def _gelu(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    return emit.gelu(c.ctx, c.name(n), tensor_arg(args[0]), kwargs.get("approximate", "none"))


def _binary(op: str) -> AtenConverter:
    def convert(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
        if kwargs.get("alpha", 1) != 1 or len(args) != 2:
            raise Unsupported
        return c.ctx.add(op, [c.value(args[0]), c.value(args[1])], name=c.name(n))
    return convert


_on(aten.add.Tensor)(_binary("add"))
_on(aten.mul.Tensor)(_binary("mul"))


@_on(aten.cat.default)
def _cat(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    return emit.concat(c.ctx, c.name(n), [c.value(t) for t in args[0]], arg(args, kwargs, 1, "dim", 0))


@_on(aten.max_pool2d.default)
def _max_pool(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    return emit.pool(c.ctx, "max_pool2d", c.name(n), tensor_arg(args[0]), args[1], arg(args, kwargs, 2, "stride"),
                     arg(args, kwargs, 3, "padding", 0), ceil_mode=arg(args, kwargs, 5, "ceil_mode", False),
                     dilation=arg(args, kwargs, 4, "dilation", 1))


@_on(aten.max_pool2d_with_indices.default)
def _max_pool_indices(c: ExportConverter, n: torch.fx.Node, args: list[Any],
                      kwargs: dict[str, Any]) -> tuple[str | None, ...]:
    return (_max_pool(c, n, args, kwargs), None)  # the indices: generic if read


@_on(aten.avg_pool2d.default)
def _avg_pool(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    if arg(args, kwargs, 6, "divisor_override") is not None:
        raise Unsupported
    return emit.pool(c.ctx, "avg_pool2d", c.name(n), tensor_arg(args[0]), args[1], arg(args, kwargs, 2, "stride"),
                     arg(args, kwargs, 3, "padding", 0), ceil_mode=arg(args, kwargs, 4, "ceil_mode", False),
                     count_include_pad=arg(args, kwargs, 5, "count_include_pad", True))


@_on(aten.adaptive_avg_pool2d.default)
def _adaptive(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    return emit.adaptive_avg_pool(c.ctx, c.name(n), tensor_arg(args[0]), args[1])


@_on(aten.mean.dim)
def _mean(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    dims = arg(args, kwargs, 1, "dim")
    if dims is None or arg(args, kwargs, 3, "dtype") is not None:
        raise Unsupported
    return c.ctx.add("mean", [tensor_arg(args[0])], name=c.name(n), dims=tuple(dims),
                     keepdim=bool(arg(args, kwargs, 2, "keepdim", False)))


@_on(aten.view.default, aten.reshape.default, aten._unsafe_view.default)
def _reshape(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    return c.ctx.add("reshape", [tensor_arg(args[0])], name=c.name(n), shape=c.out_type(n).shape)


@_on(aten.flatten.using_ints)
def _flatten(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    return c.ctx.add("flatten", [tensor_arg(args[0])], name=c.name(n), start_dim=arg(args, kwargs, 1, "start_dim", 0),
                     end_dim=arg(args, kwargs, 2, "end_dim", -1))


@_on(aten.slice.Tensor)
def _slice(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    x = tensor_arg(args[0])
    dim, start = arg(args, kwargs, 1, "dim", 0), arg(args, kwargs, 2, "start")
    end, step = arg(args, kwargs, 3, "end"), arg(args, kwargs, 4, "step", 1)
    if step <= 0:
        raise Unsupported
    size = c.ctx.type(x).shape[dim]
    return c.ctx.add("slice", [x], name=c.name(n), axis=dim, start=start or 0,
                     end=None if end is None or end >= size else end, step=step)


@_on(aten.split.Tensor, aten.split_with_sizes.default, aten.chunk.default)
def _split(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> tuple[str, ...]:
    dim = arg(args, kwargs, 2, "dim", 0)
    sizes = [int(t.shape[dim]) for t in n.meta["val"]]
    return emit.slices(c.ctx, c.name(n), tensor_arg(args[0]), sizes, dim)


@_on(aten._softmax.default, aten.softmax.int)
def _softmax(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    if n.target is aten._softmax.default and args[2]:
        raise Unsupported  # half to float
    if n.target is aten.softmax.int and arg(args, kwargs, 2, "dtype") is not None:
        raise Unsupported
    return c.ctx.add("softmax", [tensor_arg(args[0])], name=c.name(n), axis=args[1])


@_on(aten.constant_pad_nd.default)
def _constant_pad(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    return emit.pad(c.ctx, c.name(n), tensor_arg(args[0]), args[1], arg(args, kwargs, 2, "value", 0.0))


@_on(aten.pad.default)
def _pad(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    if arg(args, kwargs, 2, "mode", "constant") != "constant":
        raise Unsupported
    return emit.pad(c.ctx, c.name(n), tensor_arg(args[0]), args[1], arg(args, kwargs, 3, "value"))


@_on(aten.clone.default, aten.alias.default, aten.detach.default, aten.contiguous.default,
     aten.lift_fresh_copy.default)
def _same(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    if kwargs.get("memory_format") not in (None, torch.contiguous_format, torch.preserve_format):
        raise Unsupported
    return c.ctx.add("identity", [tensor_arg(args[0])], name=c.name(n))


@_on(aten.dropout.default)
def _dropout(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    if arg(args, kwargs, 2, "train", False):
        raise Unsupported
    return c.ctx.add("identity", [tensor_arg(args[0])], name=c.name(n))


@functools.lru_cache(maxsize=64)
def _strided_elements(layout: tuple[tuple[int, ...], tuple[int, ...], int], size: tuple[int, ...],
                      stride: tuple[int, ...], offset: int) -> torch.Tensor:
    """For each element of the view of a tensor's memory by ``size``, ``stride`` and ``offset``
    (an ``as_strided`` view), the flat (row-major) index of the tensor's element it reads, told
    from the tensor's ``layout`` (its shape, strides and storage offset, as traced).
    :class:`Unsupported` where the view reads memory that is not one of its elements (storage
    beyond a slice). One tensor per view, however many calls make it (a Longformer's layers all
    chunk alike), so that they share one parameter of the graph."""
    shape, strides, x_offset = layout
    x_positions = np.full((), x_offset, dtype=np.int64)
    for extent, step in zip(shape, strides):
        x_positions = np.add.outer(x_positions, np.arange(extent, dtype=np.int64) * step)
    read = np.full((), offset, dtype=np.int64)
    for extent, step in zip(size, stride):
        read = np.add.outer(read, np.arange(extent, dtype=np.int64) * step)
    span = int(x_positions.max()) + 1 if x_positions.size else 0
    if read.size and (read.min() < 0 or read.max() >= span):
        raise Unsupported
    element = np.full(span, -1, dtype=np.int64)
    element[x_positions.reshape(-1)] = np.arange(x_positions.size, dtype=np.int64)  # aliased positions: any one
    taken = element[read]
    if (taken < 0).any():
        raise Unsupported
    return torch.from_numpy(taken)


@_on(aten.as_strided.default)
def _as_strided(c: ExportConverter, n: torch.fx.Node, args: list[Any], kwargs: dict[str, Any]) -> str:
    """A view by explicit strides (Longformer's overlapping chunks) reads memory, not values: what
    it gives depends on its input's layout, which the graph's types do not hold, and which a
    kernel that made the input (ONNX Runtime's, or a copy) need not reproduce. So it becomes a
    gather (``torch.take`` over a constant) of the elements of its input, or of the tensor its
    input is a view of where it reads beyond the view (a slice's base), by positions computed
    here from that tensor's layout as traced: the same on any backend and any layout."""
    source = n.args[0]
    assert isinstance(source, torch.fx.Node)
    offset = arg(args, kwargs, 3, "storage_offset")
    view = (tuple(map(int, arg(args, kwargs, 1, "size"))), tuple(map(int, arg(args, kwargs, 2, "stride"))),
            int(source.meta["val"].storage_offset()) if offset is None else int(offset))
    while True:
        assert isinstance(source, torch.fx.Node)
        x = source.meta["val"]
        try:
            taken = _strided_elements((tuple(map(int, x.shape)), tuple(map(int, x.stride())),
                                       int(x.storage_offset())), *view)
            break
        except Unsupported:
            op = source.target
            if not (isinstance(op, torch._ops.OpOverload) and op.is_view and source.args):
                raise
            source = source.args[0]  # the same memory, seen whole
    name = c.name(n)
    positions = c.ctx.param(f"{name}.positions", taken)
    return c.ctx.add(generic_kind(aten.take.default), [c.value(c.env[source])], name=name, params=[positions],
                     out=c.out_type(n), target=target_of(aten.take.default), args=(("t", 0), ("p", 0)), kwargs=(),
                     flops=0)

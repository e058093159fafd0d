"""The torch.fx converter tables: per module type, function and method, a converter to IR ops.

A converter gets the conversion state, the fx node, and its arguments with fx nodes replaced by
value names (tensors) or Python constants, and returns the value name(s) it defines; it raises
:class:`~opsched.frontends._common.Unsupported` for a configuration it does not handle, and the
call then runs opaquely.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from opsched.frontends import torch_emit as emit
from opsched.frontends._common import Unsupported
from opsched.frontends.torch_emit import arg, tensor_arg
from opsched.ir.ops.activation import ACTIVATIONS

if TYPE_CHECKING:
    from opsched.frontends.torch_fx import _FxConverter

__all__ = ["Value", "Converter", "MODULE_CONVERTERS", "FUNCTION_CONVERTERS", "METHOD_CONVERTERS"]

Value = Any  # a value name (str), a tuple of them, or a Python constant
Converter = Callable[["_FxConverter", torch.fx.Node, list[Value], dict[str, Value]], Value]

MODULE_CONVERTERS: dict[type, Converter] = {}
FUNCTION_CONVERTERS: dict[Any, Converter] = {}
METHOD_CONVERTERS: dict[str, Converter] = {}


def _register(table: dict[Any, Converter], *keys: Any) -> Callable[[Converter], Converter]:
    def deco(fn: Converter) -> Converter:
        for k in keys:
            table[k] = fn
        return fn
    return deco




# --- module converters --------------------------------------------------------------------
def _weights(c: _FxConverter, n: torch.fx.Node, m: nn.Conv2d | nn.Linear) -> tuple[str, str | None]:
    weight = c.ctx.param(f"{n.target}.weight", m.weight)
    return weight, None if m.bias is None else c.ctx.param(f"{n.target}.bias", m.bias)


@_register(MODULE_CONVERTERS, nn.Conv2d)
def _conv2d_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n, nn.Conv2d)
    if m.padding_mode != "zeros":
        raise Unsupported
    return emit.conv2d(c.ctx, n.name, tensor_arg(args[0]), *_weights(c, n, m), m.stride, m.padding, m.dilation,
                       m.groups)


@_register(MODULE_CONVERTERS, nn.Linear)
def _linear_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return emit.linear(c.ctx, n.name, tensor_arg(args[0]), *_weights(c, n, c.module(n, nn.Linear)))


def _held(c: _FxConverter, n: torch.fx.Node, position: int, keyword: str) -> str | None:
    """The weight a functional call names at ``position`` (or ``keyword``) as a parameter: None
    where it passes none, and :class:`Unsupported` where it computes one (a standardised
    weight, say), which an operator with constant weights cannot take."""
    given = n.args[position] if len(n.args) > position else n.kwargs.get(keyword)
    if given is None:
        return None
    if not (isinstance(given, torch.fx.Node) and given.op == "get_attr"):
        raise Unsupported
    return c.ctx.param(str(given.target), c.values[given])


@_register(FUNCTION_CONVERTERS, F.conv2d)  # torch.conv2d itself, as Dynamo's graphs call it
def _conv2d_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    weight = _held(c, n, 1, "weight")
    if weight is None or isinstance(arg(args, kwargs, 4, "padding", 0), str):
        raise Unsupported
    return emit.conv2d(c.ctx, n.name, tensor_arg(args[0]), weight, _held(c, n, 2, "bias"),
                       arg(args, kwargs, 3, "stride", 1), arg(args, kwargs, 4, "padding", 0),
                       arg(args, kwargs, 5, "dilation", 1), arg(args, kwargs, 6, "groups", 1))


@_register(FUNCTION_CONVERTERS, F.linear)  # torch._C._nn.linear
def _linear_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    weight = _held(c, n, 1, "weight")
    if weight is None:
        raise Unsupported
    return emit.linear(c.ctx, n.name, tensor_arg(args[0]), weight, _held(c, n, 2, "bias"))


@_register(MODULE_CONVERTERS, nn.BatchNorm2d)
def _batch_norm_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n, nn.BatchNorm2d)
    if m.training or m.running_mean is None or m.running_var is None:
        raise Unsupported  # only inference-mode batch norm with running statistics is a fixed affine map
    ones, zeros = torch.ones_like(m.running_mean), torch.zeros_like(m.running_mean)
    weight = m.weight if m.weight is not None else ones
    bias = m.bias if m.bias is not None else zeros
    params = [c.ctx.param(f"{n.target}.{k}", t) for k, t in
              (("weight", weight), ("bias", bias), ("running_mean", m.running_mean), ("running_var", m.running_var))]
    return emit.batch_norm(c.ctx, n.name, tensor_arg(args[0]), params, m.eps)


def _unary(op: str) -> Converter:
    def convert(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
        return c.ctx.add(op, [tensor_arg(args[0])], name=n.name)
    return convert


for _act in ACTIVATIONS.values():  # the one table of activations says how torch spells each
    _register(MODULE_CONVERTERS, *_act.modules)(_unary(_act.name))
    _register(FUNCTION_CONVERTERS, *_act.functions)(_unary(_act.name))
    _register(METHOD_CONVERTERS, *_act.methods)(_unary(_act.name))


@_register(MODULE_CONVERTERS, nn.GELU)
def _gelu_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return _gelu(c, n, args[0], c.module(n, nn.GELU).approximate)


@_register(FUNCTION_CONVERTERS, F.gelu)
def _gelu_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return _gelu(c, n, args[0], kwargs.get("approximate", "none"))


def _gelu(c: _FxConverter, n: torch.fx.Node, x: Value, approximate: str) -> str:
    return emit.gelu(c.ctx, n.name, tensor_arg(x), approximate)


@_register(MODULE_CONVERTERS, nn.Dropout, nn.Dropout2d, nn.Identity)
@_register(FUNCTION_CONVERTERS, F.dropout)
@_register(METHOD_CONVERTERS, "contiguous")
def _passthrough(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return c.ctx.add("identity", [tensor_arg(args[0])], name=n.name)


@_register(MODULE_CONVERTERS, nn.MaxPool2d)
def _max_pool_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n, nn.MaxPool2d)
    if m.return_indices:
        raise Unsupported
    return emit.pool(c.ctx, "max_pool2d", n.name, tensor_arg(args[0]), m.kernel_size, m.stride, m.padding,
                     ceil_mode=m.ceil_mode, dilation=m.dilation)


@_register(MODULE_CONVERTERS, nn.AvgPool2d)
def _avg_pool_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n, nn.AvgPool2d)
    if m.divisor_override is not None:
        raise Unsupported
    return emit.pool(c.ctx, "avg_pool2d", n.name, tensor_arg(args[0]), m.kernel_size, m.stride, m.padding,
                     ceil_mode=m.ceil_mode, count_include_pad=m.count_include_pad)


@_register(FUNCTION_CONVERTERS, F.max_pool2d)
def _max_pool_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    if arg(args, kwargs, 6, "return_indices", False):
        raise Unsupported
    return emit.pool(c.ctx, "max_pool2d", n.name, tensor_arg(args[0]), arg(args, kwargs, 1, "kernel_size"),
                     arg(args, kwargs, 2, "stride"), arg(args, kwargs, 3, "padding", 0),
                     ceil_mode=arg(args, kwargs, 5, "ceil_mode", False), dilation=arg(args, kwargs, 4, "dilation", 1))


@_register(FUNCTION_CONVERTERS, F.avg_pool2d)
def _avg_pool_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    if arg(args, kwargs, 6, "divisor_override") is not None:
        raise Unsupported
    return emit.pool(c.ctx, "avg_pool2d", n.name, tensor_arg(args[0]), arg(args, kwargs, 1, "kernel_size"),
                     arg(args, kwargs, 2, "stride"), arg(args, kwargs, 3, "padding", 0),
                     ceil_mode=arg(args, kwargs, 4, "ceil_mode", False),
                     count_include_pad=arg(args, kwargs, 5, "count_include_pad", True))


def _adaptive(c: _FxConverter, n: torch.fx.Node, x: Value, size: Any) -> str:
    return emit.adaptive_avg_pool(c.ctx, n.name, tensor_arg(x), size)


@_register(MODULE_CONVERTERS, nn.AdaptiveAvgPool2d)
def _adaptive_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return _adaptive(c, n, args[0], c.module(n, nn.AdaptiveAvgPool2d).output_size)


@_register(FUNCTION_CONVERTERS, F.adaptive_avg_pool2d)
def _adaptive_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return _adaptive(c, n, args[0], arg(args, kwargs, 1, "output_size"))


@_register(MODULE_CONVERTERS, nn.Flatten)
def _flatten_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n, nn.Flatten)
    return c.ctx.add("flatten", [tensor_arg(args[0])], name=n.name, start_dim=m.start_dim, end_dim=m.end_dim)


@_register(FUNCTION_CONVERTERS, torch.flatten)
@_register(METHOD_CONVERTERS, "flatten")
def _flatten_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return c.ctx.add("flatten", [tensor_arg(args[0])], name=n.name, start_dim=arg(args, kwargs, 1, "start_dim", 0),
                     end_dim=arg(args, kwargs, 2, "end_dim", -1))


@_register(METHOD_CONVERTERS, "view", "reshape")
@_register(FUNCTION_CONVERTERS, torch.reshape)
def _reshape(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return c.ctx.add("reshape", [tensor_arg(args[0])], name=n.name, shape=c.out_type(n).shape)


@_register(MODULE_CONVERTERS, nn.Softmax)
def _softmax_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    dim = c.module(n, nn.Softmax).dim
    if dim is None:
        raise Unsupported
    return c.ctx.add("softmax", [tensor_arg(args[0])], name=n.name, axis=dim)


@_register(FUNCTION_CONVERTERS, F.softmax, torch.softmax)
@_register(METHOD_CONVERTERS, "softmax")
def _softmax_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    dim = arg(args, kwargs, 1, "dim")
    if dim is None:
        raise Unsupported
    return c.ctx.add("softmax", [tensor_arg(args[0])], name=n.name, axis=dim)


@_register(FUNCTION_CONVERTERS, operator.add, torch.add, operator.iadd)
@_register(METHOD_CONVERTERS, "add")
def _add(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    if "alpha" in kwargs or len(args) != 2:
        raise Unsupported
    return c.ctx.add("add", [tensor_arg(args[0]), tensor_arg(args[1])], name=n.name)


@_register(FUNCTION_CONVERTERS, operator.mul, torch.mul)
@_register(METHOD_CONVERTERS, "mul")
def _mul(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    if len(args) != 2:
        raise Unsupported
    return c.ctx.add("mul", [tensor_arg(args[0]), tensor_arg(args[1])], name=n.name)


@_register(FUNCTION_CONVERTERS, torch.cat, torch.concat)
def _cat(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    tensors = arg(args, kwargs, 0, "tensors")
    dim = arg(args, kwargs, 1, "dim", 0)
    return emit.concat(c.ctx, n.name, [tensor_arg(t) for t in tensors], dim)


@_register(FUNCTION_CONVERTERS, torch.mean)
@_register(METHOD_CONVERTERS, "mean")
def _mean(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    dims = arg(args, kwargs, 1, "dim")
    if dims is None or "dtype" in kwargs:
        raise Unsupported
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return c.ctx.add("mean", [tensor_arg(args[0])], name=n.name, dims=dims,
                     keepdim=bool(arg(args, kwargs, 2, "keepdim", False)))


@_register(FUNCTION_CONVERTERS, F.pad)
def _pad(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    if arg(args, kwargs, 2, "mode", "constant") != "constant":
        raise Unsupported
    return emit.pad(c.ctx, n.name, tensor_arg(args[0]), arg(args, kwargs, 1, "pad"), arg(args, kwargs, 3, "value"))


@_register(MODULE_CONVERTERS, nn.ZeroPad2d, nn.ConstantPad2d)
def _pad_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n, nn.ConstantPad2d)  # ZeroPad2d is one too
    return emit.pad(c.ctx, n.name, tensor_arg(args[0]), m.padding, m.value)


@_register(FUNCTION_CONVERTERS, torch.chunk, torch.split)
@_register(METHOD_CONVERTERS, "chunk", "split")
def _split(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> tuple[str, ...]:
    dim = arg(args, kwargs, 2, "dim", 0)
    sizes = [int(t.shape[dim]) for t in c.values[n]]
    return emit.slices(c.ctx, n.name, tensor_arg(args[0]), sizes, dim)


@_register(FUNCTION_CONVERTERS, operator.getitem)
def _getitem(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> Value:
    obj, idx = args
    if isinstance(obj, tuple):  # an element of a split / chunk
        return obj[idx]
    x = tensor_arg(obj)
    index = idx if isinstance(idx, tuple) else (idx,)
    if any(not isinstance(i, slice) for i in index):
        raise Unsupported  # integer or advanced indexing changes the rank: leave it opaque
    rank = c.ctx.type(x).rank
    for axis, s in enumerate(index):
        if s == slice(None):
            continue
        if axis >= rank or (s.step or 1) <= 0:
            raise Unsupported
        x = c.ctx.add("slice", [x], name=f"{n.name}_ax{axis}", axis=axis, start=s.start or 0, end=s.stop,
                      step=s.step or 1)
    return x if x != obj else c.ctx.add("identity", [x], name=n.name)

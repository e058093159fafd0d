"""PyTorch import: torch.fx symbolic trace, a recording run on the example inputs, converters.

The recording run gives every fx node its concrete value, so shapes are known and non-tensor
values (``x.size(0)``, shape tuples) become constants of a graph specialised to the example
inputs' shapes. A call without a converter becomes an ``opaque`` node that runs the original
callable; every such node is reported once, in one log line.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch import nn

from opsched.errors import FrontendError, UntraceableModuleError
from opsched.frontends._common import ConversionContext, Unsupported, report_opaque
from opsched.ir import Graph, tensor_type
from opsched.transforms import canonicalize

__all__ = ["from_torch"]

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


def from_torch(module: nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor, *,
               name: str | None = None, leaf_modules: Iterable[type[nn.Module]] = (),
               canonical: bool = True) -> Graph:
    """Import ``module`` as a :class:`~opsched.ir.Graph` specialised to ``example_inputs``.

    ``leaf_modules`` are submodule types to keep whole (opaque) instead of tracing into them:
    the fix for a submodule with data-dependent control flow. With ``canonical`` (default),
    batch norms are folded and activations fused (:func:`opsched.transforms.canonicalize`).
    """
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    name = name or type(module).__name__
    gm = _trace(module, tuple(leaf_modules))
    values = _record(gm, example_inputs, name)
    graph = _FxConverter(gm, values, name).run()
    graph = graph.verify()
    if canonical:
        graph = canonicalize(graph)
    report_opaque(graph, f"from_torch({name})")
    return graph


# --- tracing ------------------------------------------------------------------------------
class _Tracer(torch.fx.Tracer):
    def __init__(self, leaves: tuple[type[nn.Module], ...]) -> None:
        super().__init__()
        self.leaves = leaves
        self.path: list[str] = []
        self.failed_in: str | None = None  # the innermost module being traced when tracing failed

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        return isinstance(m, self.leaves) or super().is_leaf_module(m, qualname)

    def call_module(self, m: nn.Module, forward: Callable[..., Any], args: Any, kwargs: Any) -> Any:
        self.path.append(self.path_of_module(m) or type(m).__name__)
        try:
            return super().call_module(m, forward, args, kwargs)
        except Exception:
            if self.failed_in is None:
                self.failed_in = self.path[-1]
            raise
        finally:
            self.path.pop()


def _trace(module: nn.Module, leaves: tuple[type[nn.Module], ...]) -> torch.fx.GraphModule:
    tracer = _Tracer(leaves)
    try:
        fx_graph = tracer.trace(module)
    except Exception as e:  # fx raises TraceError, TypeError, RuntimeError... for the same root causes
        where = tracer.failed_in or "the top-level forward"
        sub = module.get_submodule(where) if tracer.failed_in else module
        raise UntraceableModuleError(
            f"torch.fx cannot trace {type(module).__name__}: in {where!r} ({type(sub).__name__}): "
            f"{type(e).__name__}: {e}. This usually means Python control flow or a Python call on "
            f"a tensor value (if/for on tensor data, len(), .item(), .tolist(), numpy). Fix: pass "
            f"leaf_modules=[{type(sub).__name__}] to run that module opaquely, rewrite the forward "
            f"without data-dependent control flow, or export the model to ONNX and use "
            f"opsched.from_onnx()") from e
    return torch.fx.GraphModule(tracer.root, fx_graph, type(module).__name__)


class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        super().__init__(gm)
        self.values: dict[torch.fx.Node, Any] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        self.values[n] = out
        return out


def _record(gm: torch.fx.GraphModule, inputs: Sequence[torch.Tensor], name: str) -> dict[torch.fx.Node, Any]:
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(inputs):
        raise FrontendError(f"{name}.forward takes {len(placeholders)} inputs "
                            f"({', '.join(p.name for p in placeholders)}), {len(inputs)} example inputs given")
    rec = _Recorder(gm)
    with torch.no_grad():
        try:
            rec.run(*inputs)
        except Exception as e:
            raise FrontendError(f"running {name} on the example inputs failed: {type(e).__name__}: {e}") from e
    return rec.values


# --- conversion ---------------------------------------------------------------------------
class _FxConverter:
    def __init__(self, gm: torch.fx.GraphModule, values: dict[torch.fx.Node, Any], name: str) -> None:
        self.gm = gm
        self.values = values
        self.ctx = ConversionContext(name)
        self.env: dict[torch.fx.Node, Value] = {}

    def run(self) -> Graph:
        outputs: list[str] = []
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                v = self.values[n]
                if not isinstance(v, torch.Tensor):
                    raise FrontendError(f"input {n.name!r} must be a tensor, got {type(v).__name__}")
                self.env[n] = self.ctx.b.input(n.name, tuple(v.shape), tensor_type(v).dtype)
            elif n.op == "output":
                outputs = self._flatten_output(n.args[0])
            else:
                self.env[n] = self._convert(n)
        return self.ctx.b.build(outputs)

    def _flatten_output(self, arg: Any) -> list[str]:
        if isinstance(arg, torch.fx.Node):
            v = self.env[arg]
            if isinstance(v, str):
                return [v]
            if isinstance(v, tuple):
                return list(v)
            raise FrontendError(f"model output {arg.name!r} is not a tensor")
        if isinstance(arg, (list, tuple)):
            return [x for a in arg for x in self._flatten_output(a)]
        raise FrontendError(f"model outputs must be tensors or tuples of tensors, got {type(arg).__name__}")

    def _arg(self, a: Any) -> Value:
        if isinstance(a, torch.fx.Node):
            v = self.env[a]
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        return a

    def _convert(self, n: torch.fx.Node) -> Value:
        value = self.values[n]
        is_tensor_like = isinstance(value, torch.Tensor) or (
            isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value))
        if not is_tensor_like and n.op != "get_attr":
            return value  # ints, shapes, ...: constants of this specialised graph
        if n.op == "get_attr":
            if not isinstance(value, torch.Tensor):
                return value
            return self.ctx.add("constant", [], name=n.name, params=[self.ctx.param(str(n.target), value)])
        args = [self._arg(a) for a in n.args]
        kwargs = {k: self._arg(v) for k, v in n.kwargs.items()}
        conv = self._converter_for(n)
        if conv is not None:
            try:
                return conv(self, n, args, kwargs)
            except Unsupported:
                pass
        return self._opaque(n)

    def _converter_for(self, n: torch.fx.Node) -> Converter | None:
        if n.op == "call_module":
            return MODULE_CONVERTERS.get(type(self.gm.get_submodule(n.target)))
        if n.op == "call_function":
            return FUNCTION_CONVERTERS.get(n.target)
        if n.op == "call_method":
            return METHOD_CONVERTERS.get(n.target)
        return None

    def _opaque(self, n: torch.fx.Node) -> str:
        value = self.values[n]
        if not isinstance(value, torch.Tensor):
            raise FrontendError(f"call {n.format_node()} has no converter and returns "
                                f"{type(value).__name__}; an opaque call must return one tensor")
        if n.op == "call_module":
            fn: Callable[..., Any] = self.gm.get_submodule(n.target)
            target = f"{type(fn).__name__} {n.target}"
        elif n.op == "call_method":
            method = n.target

            def fn(self_: Any, *a: Any, **k: Any) -> Any:
                return getattr(self_, method)(*a, **k)
            target = f"Tensor.{method}"
        else:
            fn = n.target
            target = getattr(fn, "__name__", str(fn))
        tensor_nodes = [a for a in n.all_input_nodes if isinstance(self.env.get(a), str)]
        consts = {a: self.values[a] for a in n.all_input_nodes if a not in tensor_nodes}
        fx_args, fx_kwargs = n.args, n.kwargs

        def call(*tensors: torch.Tensor) -> torch.Tensor:
            env = dict(zip(tensor_nodes, tensors))
            look = lambda a: env[a] if a in env else consts[a]  # noqa: E731
            return fn(*torch.fx.node.map_arg(fx_args, look), **torch.fx.node.map_arg(fx_kwargs, look))

        call.__qualname__ = target
        return self.ctx.add("opaque", [self.env[a] for a in tensor_nodes], name=n.name,
                            out=tensor_type(value), fn=call, target=target)

    # helpers for converters
    def module(self, n: torch.fx.Node) -> nn.Module:
        return self.gm.get_submodule(n.target)

    def out_type(self, n: torch.fx.Node) -> Any:
        return tensor_type(self.values[n])


def _get(args: list[Value], kwargs: dict[str, Value], i: int, key: str, default: Any = None) -> Any:
    if len(args) > i:
        return args[i]
    return kwargs.get(key, default)


def _tensor(v: Value) -> str:
    if not isinstance(v, str):
        raise Unsupported
    return v


# --- module converters --------------------------------------------------------------------
@_register(MODULE_CONVERTERS, nn.Conv2d)
def _conv2d_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n)
    if m.padding_mode != "zeros":
        raise Unsupported
    if isinstance(m.padding, str):
        if m.padding == "valid":
            padding: tuple[int, ...] = (0, 0)
        else:  # 'same' with stride 1; odd effective kernels only, otherwise torch pads asymmetrically
            eff = [d * (k - 1) for d, k in zip(m.dilation, m.kernel_size)]
            if any(e % 2 for e in eff):
                raise Unsupported
            padding = tuple(e // 2 for e in eff)
    else:
        padding = tuple(m.padding)
    params = [c.ctx.param(f"{n.target}.weight", m.weight)]
    if m.bias is not None:
        params.append(c.ctx.param(f"{n.target}.bias", m.bias))
    return c.ctx.add("conv2d", [_tensor(args[0])], name=n.name, params=params, stride=tuple(m.stride),
                     padding=padding, dilation=tuple(m.dilation), groups=m.groups, act="none")


@_register(MODULE_CONVERTERS, nn.Linear)
def _linear_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n)
    params = [c.ctx.param(f"{n.target}.weight", m.weight)]
    if m.bias is not None:
        params.append(c.ctx.param(f"{n.target}.bias", m.bias))
    return c.ctx.add("linear", [_tensor(args[0])], name=n.name, params=params, act="none")


@_register(MODULE_CONVERTERS, nn.BatchNorm2d)
def _batch_norm_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n)
    if m.training or m.running_mean is None:
        raise Unsupported  # only inference-mode batch norm with running statistics is a fixed affine map
    ones, zeros = torch.ones_like(m.running_mean), torch.zeros_like(m.running_mean)
    weight = m.weight if m.weight is not None else ones
    bias = m.bias if m.bias is not None else zeros
    params = [c.ctx.param(f"{n.target}.{k}", t) for k, t in
              (("weight", weight), ("bias", bias), ("running_mean", m.running_mean), ("running_var", m.running_var))]
    return c.ctx.add("batch_norm", [_tensor(args[0])], name=n.name, params=params, eps=float(m.eps))


def _unary(op: str) -> Converter:
    def convert(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
        return c.ctx.add(op, [_tensor(args[0])], name=n.name)
    return convert


for _cls, _op in ((nn.ReLU, "relu"), (nn.ReLU6, "relu6"), (nn.Sigmoid, "sigmoid"), (nn.Tanh, "tanh"),
                  (nn.SiLU, "silu"), (nn.Hardswish, "hardswish")):
    _register(MODULE_CONVERTERS, _cls)(_unary(_op))
for _fn, _op in ((F.relu, "relu"), (torch.relu, "relu"), (F.relu6, "relu6"), (torch.sigmoid, "sigmoid"),
                 (F.sigmoid, "sigmoid"), (torch.tanh, "tanh"), (F.tanh, "tanh"), (F.silu, "silu"),
                 (F.hardswish, "hardswish")):
    _register(FUNCTION_CONVERTERS, _fn)(_unary(_op))
for _m, _op in (("relu", "relu"), ("sigmoid", "sigmoid"), ("tanh", "tanh")):
    _register(METHOD_CONVERTERS, _m)(_unary(_op))


@_register(MODULE_CONVERTERS, nn.GELU)
def _gelu_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    approx = c.module(n).approximate
    attrs = {} if approx == "none" else {"approximate": approx}
    return c.ctx.add("gelu", [_tensor(args[0])], name=n.name, **attrs)


@_register(FUNCTION_CONVERTERS, F.gelu)
def _gelu_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    approx = kwargs.get("approximate", "none")
    attrs = {} if approx == "none" else {"approximate": approx}
    return c.ctx.add("gelu", [_tensor(args[0])], name=n.name, **attrs)


@_register(MODULE_CONVERTERS, nn.Dropout, nn.Dropout2d, nn.Identity)
@_register(FUNCTION_CONVERTERS, F.dropout)
@_register(METHOD_CONVERTERS, "contiguous")
def _passthrough(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return c.ctx.add("identity", [_tensor(args[0])], name=n.name)


def _pool_attrs(kernel: Any, stride: Any, padding: Any) -> dict[str, Any]:
    stride = kernel if stride in (None, ()) else stride
    return {"kernel": kernel, "stride": stride, "padding": padding}


@_register(MODULE_CONVERTERS, nn.MaxPool2d)
def _max_pool_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n)
    if m.return_indices:
        raise Unsupported
    return c.ctx.add("max_pool2d", [_tensor(args[0])], name=n.name, dilation=m.dilation,
                     ceil_mode=m.ceil_mode, **_pool_attrs(m.kernel_size, m.stride, m.padding))


@_register(MODULE_CONVERTERS, nn.AvgPool2d)
def _avg_pool_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n)
    if m.divisor_override is not None:
        raise Unsupported
    return c.ctx.add("avg_pool2d", [_tensor(args[0])], name=n.name, ceil_mode=m.ceil_mode,
                     count_include_pad=m.count_include_pad, **_pool_attrs(m.kernel_size, m.stride, m.padding))


@_register(FUNCTION_CONVERTERS, F.max_pool2d)
def _max_pool_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    if _get(args, kwargs, 6, "return_indices", False):
        raise Unsupported
    return c.ctx.add("max_pool2d", [_tensor(args[0])], name=n.name,
                     dilation=_get(args, kwargs, 4, "dilation", 1), ceil_mode=_get(args, kwargs, 5, "ceil_mode", False),
                     **_pool_attrs(_get(args, kwargs, 1, "kernel_size"), _get(args, kwargs, 2, "stride"),
                                   _get(args, kwargs, 3, "padding", 0)))


@_register(FUNCTION_CONVERTERS, F.avg_pool2d)
def _avg_pool_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    if _get(args, kwargs, 6, "divisor_override") is not None:
        raise Unsupported
    return c.ctx.add("avg_pool2d", [_tensor(args[0])], name=n.name, ceil_mode=_get(args, kwargs, 4, "ceil_mode", False),
                     count_include_pad=_get(args, kwargs, 5, "count_include_pad", True),
                     **_pool_attrs(_get(args, kwargs, 1, "kernel_size"), _get(args, kwargs, 2, "stride"),
                                   _get(args, kwargs, 3, "padding", 0)))


def _adaptive(c: _FxConverter, n: torch.fx.Node, x: Value, size: Any) -> str:
    if size is None or (isinstance(size, tuple) and None in size):
        raise Unsupported
    return c.ctx.add("adaptive_avg_pool2d", [_tensor(x)], name=n.name, output_size=size)


@_register(MODULE_CONVERTERS, nn.AdaptiveAvgPool2d)
def _adaptive_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return _adaptive(c, n, args[0], c.module(n).output_size)


@_register(FUNCTION_CONVERTERS, F.adaptive_avg_pool2d)
def _adaptive_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return _adaptive(c, n, args[0], _get(args, kwargs, 1, "output_size"))


@_register(MODULE_CONVERTERS, nn.Flatten)
def _flatten_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n)
    return c.ctx.add("flatten", [_tensor(args[0])], name=n.name, start_dim=m.start_dim, end_dim=m.end_dim)


@_register(FUNCTION_CONVERTERS, torch.flatten)
@_register(METHOD_CONVERTERS, "flatten")
def _flatten_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return c.ctx.add("flatten", [_tensor(args[0])], name=n.name, start_dim=_get(args, kwargs, 1, "start_dim", 0),
                     end_dim=_get(args, kwargs, 2, "end_dim", -1))


@_register(METHOD_CONVERTERS, "view", "reshape")
@_register(FUNCTION_CONVERTERS, torch.reshape)
def _reshape(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    return c.ctx.add("reshape", [_tensor(args[0])], name=n.name, shape=c.out_type(n).shape)


@_register(MODULE_CONVERTERS, nn.Softmax)
def _softmax_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    dim = c.module(n).dim
    if dim is None:
        raise Unsupported
    return c.ctx.add("softmax", [_tensor(args[0])], name=n.name, axis=dim)


@_register(FUNCTION_CONVERTERS, F.softmax, torch.softmax)
@_register(METHOD_CONVERTERS, "softmax")
def _softmax_fn(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    dim = _get(args, kwargs, 1, "dim")
    if dim is None:
        raise Unsupported
    return c.ctx.add("softmax", [_tensor(args[0])], name=n.name, axis=dim)


@_register(FUNCTION_CONVERTERS, operator.add, torch.add, operator.iadd)
@_register(METHOD_CONVERTERS, "add")
def _add(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    if "alpha" in kwargs or len(args) != 2:
        raise Unsupported
    return c.ctx.add("add", [_tensor(args[0]), _tensor(args[1])], name=n.name)


@_register(FUNCTION_CONVERTERS, operator.mul, torch.mul)
@_register(METHOD_CONVERTERS, "mul")
def _mul(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    if len(args) != 2:
        raise Unsupported
    return c.ctx.add("mul", [_tensor(args[0]), _tensor(args[1])], name=n.name)


@_register(FUNCTION_CONVERTERS, torch.cat, torch.concat)
def _cat(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    tensors = _get(args, kwargs, 0, "tensors")
    dim = _get(args, kwargs, 1, "dim", 0)
    return c.ctx.add("concat", [_tensor(t) for t in tensors], name=n.name, axis=dim)


@_register(FUNCTION_CONVERTERS, torch.mean)
@_register(METHOD_CONVERTERS, "mean")
def _mean(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    dims = _get(args, kwargs, 1, "dim")
    if dims is None or "dtype" in kwargs:
        raise Unsupported
    dims = (dims,) if isinstance(dims, int) else tuple(dims)
    return c.ctx.add("mean", [_tensor(args[0])], name=n.name, dims=dims,
                     keepdim=bool(_get(args, kwargs, 2, "keepdim", False)))


@_register(FUNCTION_CONVERTERS, F.pad)
def _pad(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    if _get(args, kwargs, 2, "mode", "constant") != "constant":
        raise Unsupported
    value = _get(args, kwargs, 3, "value", None)
    return c.ctx.add("pad", [_tensor(args[0])], name=n.name, pads=tuple(_get(args, kwargs, 1, "pad")),
                     value=float(value or 0.0))


@_register(MODULE_CONVERTERS, nn.ZeroPad2d, nn.ConstantPad2d)
def _pad_module(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> str:
    m = c.module(n)
    return c.ctx.add("pad", [_tensor(args[0])], name=n.name, pads=tuple(m.padding), value=float(getattr(m, "value", 0.0)))


def _chunks(c: _FxConverter, n: torch.fx.Node, x: str, sizes: list[int], dim: int) -> tuple[str, ...]:
    outs, start = [], 0
    for i, s in enumerate(sizes):
        outs.append(c.ctx.add("slice", [x], name=f"{n.name}_{i}", axis=dim, start=start, end=start + s))
        start += s
    return tuple(outs)


@_register(FUNCTION_CONVERTERS, torch.chunk, torch.split)
@_register(METHOD_CONVERTERS, "chunk", "split")
def _split(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> tuple[str, ...]:
    dim = _get(args, kwargs, 2, "dim", 0)
    sizes = [int(t.shape[dim]) for t in c.values[n]]
    return _chunks(c, n, _tensor(args[0]), sizes, dim)


@_register(FUNCTION_CONVERTERS, operator.getitem)
def _getitem(c: _FxConverter, n: torch.fx.Node, args: list[Value], kwargs: dict[str, Value]) -> Value:
    obj, idx = args
    if isinstance(obj, tuple):  # an element of a split / chunk
        return obj[idx]
    x = _tensor(obj)
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

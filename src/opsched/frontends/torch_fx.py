"""PyTorch import: torch.fx symbolic trace, a recording run on the example inputs, converters.

The recording run gives every fx node its concrete value, so shapes are known and non-tensor
values (``x.size(0)``, shape tuples) become constants of a graph specialised to the example
inputs' shapes. A call without a converter becomes an ``opaque`` node that runs the original
callable; every such node is reported once, in one log line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch
import torch.fx
from torch import nn

from opsched.errors import FrontendError, UntraceableModuleError
from opsched.frontends._common import ConversionContext, Unsupported, report_opaque
from opsched.frontends.torch_ops import FUNCTION_CONVERTERS, METHOD_CONVERTERS, MODULE_CONVERTERS, Converter, Value
from opsched.ir import Graph, tensor_type
from opsched.transforms import canonicalize

__all__ = ["from_torch"]

M = TypeVar("M", bound=nn.Module)

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
            return MODULE_CONVERTERS.get(type(self.gm.get_submodule(str(n.target))))
        if n.op == "call_function":
            return FUNCTION_CONVERTERS.get(n.target)
        if n.op == "call_method":
            return METHOD_CONVERTERS.get(str(n.target))
        return None

    def _opaque(self, n: torch.fx.Node) -> str:
        value = self.values[n]
        if not isinstance(value, torch.Tensor):
            raise FrontendError(f"call {n.format_node()} has no converter and returns "
                                f"{type(value).__name__}; an opaque call must return one tensor")
        fn: Callable[..., Any]
        if n.op == "call_module":
            fn = self.gm.get_submodule(str(n.target))
            target = f"{type(fn).__name__} {n.target}"
        elif n.op == "call_method":
            method = str(n.target)

            def fn(self_: Any, *a: Any, **k: Any) -> Any:
                return getattr(self_, method)(*a, **k)
            target = f"Tensor.{method}"
        else:
            assert callable(n.target)
            fn = n.target
            target = getattr(fn, "__name__", str(fn))
        tensor_nodes = [a for a in n.all_input_nodes if isinstance(self.env.get(a), str)]
        consts = {a: self.values[a] for a in n.all_input_nodes if a not in tensor_nodes}
        fx_args, fx_kwargs = n.args, n.kwargs

        def call(*tensors: torch.Tensor) -> torch.Tensor:
            env = dict(zip(tensor_nodes, tensors))

            def look(a: torch.fx.Node) -> Any:
                return env[a] if a in env else consts[a]
            out: torch.Tensor = fn(*torch.fx.node.map_arg(fx_args, look), **torch.fx.node.map_arg(fx_kwargs, look))
            return out

        call.__qualname__ = target
        return self.ctx.add("opaque", [self.env[a] for a in tensor_nodes], name=n.name,
                            out=tensor_type(value), fn=call, target=target)

    # helpers for converters
    def module(self, n: torch.fx.Node, kind: type[M]) -> M:
        """The submodule a ``call_module`` node calls, which is a ``kind``."""
        m = self.gm.get_submodule(str(n.target))
        assert isinstance(m, kind), f"{n.target} is a {type(m).__name__}, not a {kind.__name__}"
        return m

    def out_type(self, n: torch.fx.Node) -> Any:
        return tensor_type(self.values[n])


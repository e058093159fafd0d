"""PyTorch import by torch.fx (the fallback of :func:`opsched.from_torch`): symbolic trace, a
recording run on the example inputs, converters.

The recording run gives every fx node its concrete value, so shapes are known and non-tensor
values (``x.size(0)``, shape tuples) become constants of a graph specialised to the example
inputs' shapes. A call without a converter becomes an ``opaque`` node that runs the original
callable; every such node is reported once, in one log line. So does a module with forward
hooks, which fx would trace by its type alone: it runs whole, as called, with its hooks. A
number read from a tensor's values (``.item()``) is refused, not frozen into the graph.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Iterable, Sequence
from typing import Any, TypeVar

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch import nn

from opsched.errors import FrontendError, UntraceableModuleError
from opsched.frontends._common import (
    ConversionContext,
    Unsupported,
    check_weight_writes,
    fx_ancestors,
    held_type,
    replaying,
)
from opsched.frontends.torch_alias import Aliases
from opsched.frontends.torch_ops import FUNCTION_CONVERTERS, METHOD_CONVERTERS, MODULE_CONVERTERS, Converter, Value
from opsched.ir import Graph, tensor_type
from opsched.structure.trees import canonical_order

__all__ = ["fx_graph", "mutated_by"]

M = TypeVar("M", bound=nn.Module)


def fx_graph(module: nn.Module, example_inputs: Sequence[torch.Tensor], name: str,
             leaf_modules: Iterable[type[nn.Module]] = ()) -> Graph:
    """``module`` traced by torch.fx, run once on ``example_inputs`` and converted (module
    docstring); ``leaf_modules`` are submodule types kept whole (opaque)."""
    gm = _trace(module, tuple(leaf_modules))
    values = _record(gm, example_inputs, name)
    return _FxConverter(gm, values, name).run()


def _in_place_name(name: str) -> bool:
    """``relu_``, ``add_``: torch's spelling of an op that changes its first argument."""
    return name.endswith("_") and not name.startswith("_")


#: Python's augmented assignments (``x += y``): on a tensor, they change it in place.
_AUGMENTED = {"__iadd__": operator.iadd, "__isub__": operator.isub, "__imul__": operator.imul,
              "__itruediv__": operator.itruediv, "__ifloordiv__": operator.ifloordiv, "__imod__": operator.imod,
              "__ipow__": operator.ipow, "__iand__": operator.iand, "__ior__": operator.ior,
              "__ixor__": operator.ixor}
#: Functions that change their first argument in place.
_IN_PLACE_FUNCTIONS = frozenset({*_AUGMENTED.values(), operator.setitem})


def _set_item(tensor: torch.Tensor, index: Any, value: Any) -> torch.Tensor:
    """``tensor[index] = value`` as a call with a result: the changed tensor."""
    tensor[index] = value
    return tensor


def mutated_by(n: torch.fx.Node, gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The fx node whose tensor the call ``n`` changes in place (its first argument), if any:
    ``x.relu_()``, ``torch.relu_(x)``, ``x += y``, ``F.hardtanh(x, inplace=True)``,
    ``nn.ReLU(inplace=True)(x)``."""
    first = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else None
    if first is None:
        return None
    if n.op == "call_method":
        in_place = _in_place_name(str(n.target))
    elif n.op == "call_function":
        in_place = (n.target in _IN_PLACE_FUNCTIONS or _in_place_name(getattr(n.target, "__name__", ""))
                    or n.kwargs.get("inplace") is True)
    elif n.op == "call_module":
        in_place = getattr(gm.get_submodule(str(n.target)), "inplace", False) is True
    else:
        in_place = False
    return first if in_place else None


# --- tracing ------------------------------------------------------------------------------
class _Proxy(torch.fx.Proxy):
    """fx's proxy, plus what fx leaves out and eager PyTorch does in place: ``x += y`` (which
    fx records as ``x = x + y``, leaving every other reader of ``x`` with the old value) and
    ``x[i] = y`` (which fx cannot record at all)."""

    def __setitem__(self, index: Any, value: Any) -> None:
        self.tracer.create_proxy("call_function", operator.setitem, (self, index, value), {})


def _augmented(function: Callable[[Any, Any], Any]) -> Callable[[_Proxy, Any], torch.fx.Proxy]:
    def method(self: _Proxy, other: Any) -> torch.fx.Proxy:
        return self.tracer.create_proxy("call_function", function, (self, other), {})
    return method


for _name, _function in _AUGMENTED.items():
    setattr(_Proxy, _name, _augmented(_function))


class _Tracer(torch.fx.Tracer):
    def __init__(self, leaves: tuple[type[nn.Module], ...]) -> None:
        super().__init__()
        self.leaves = leaves
        self.path: list[str] = []
        self.failed_in: str | None = None  # the innermost module being traced when tracing failed

    def proxy(self, node: torch.fx.Node) -> torch.fx.Proxy:
        return _Proxy(node, self)

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


def _hooked(module: nn.Module) -> bool:
    """Whether ``module`` has forward hooks (or pre-hooks), which a call runs and its ``forward`` does not."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


def _trace(module: nn.Module, leaves: tuple[type[nn.Module], ...]) -> torch.fx.GraphModule:
    if _hooked(module):
        raise UntraceableModuleError(
            f"torch.fx traces {type(module).__name__}.forward, not the forward hooks registered on "
            f"{type(module).__name__} itself, which would be left out: trace it with torch.export (tracer='auto' "
            f"or 'export'), or register them on a submodule")
    tracer = _Tracer(leaves)
    try:
        fx_graph = tracer.trace(module)
    except Exception as e:  # fx raises TraceError, TypeError, RuntimeError... for the same root causes
        where = tracer.failed_in or "the top-level forward"
        sub = module.get_submodule(where) if tracer.failed_in else module
        leaf = f"pass leaf_modules=[{type(sub).__name__}] to run that module opaquely, " if tracer.failed_in else ""
        raise UntraceableModuleError(
            f"torch.fx cannot trace {type(module).__name__}: in {where!r} ({type(sub).__name__}): "
            f"{type(e).__name__}: {e}. This usually means Python control flow or a Python call on "
            f"a tensor value (if/for on tensor data, len(), .item(), .tolist(), numpy). Fix: {leaf}use "
            f"torch.compile(model, backend='opsched'), which schedules the graphs between the places "
            f"where Python needs a tensor's value, rewrite the forward without data-dependent control "
            f"flow, or export the model to ONNX and use opsched.from_onnx()") from e
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
            rec.run(*[t.clone() for t in inputs])  # an in-place op of the model must not change the caller's inputs
        except Exception as e:
            raise FrontendError(f"running {name} on the example inputs failed: {type(e).__name__}: {e}") from e
    return rec.values


# --- conversion ---------------------------------------------------------------------------
#: Calls that give a tensor's metadata, not its values: what they give is fixed by the example
#: inputs' shapes, dtypes and devices, as the specialised graph is.
_METADATA_METHODS = frozenset({
    "size", "dim", "ndimension", "numel", "nelement", "stride", "element_size", "storage_offset", "is_contiguous",
    "is_floating_point", "is_complex", "is_signed", "get_device", "type", "__len__"})
_METADATA_FUNCTIONS = frozenset({
    getattr, len, isinstance, torch.numel, torch.is_tensor, torch.is_floating_point, torch.is_complex,
    torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel, torch.Tensor.stride, torch.Tensor.element_size,
    torch.Tensor.is_contiguous, torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default,
    torch.ops.aten.sym_stride.int, torch.ops.aten.sym_storage_offset.default})


def _reads_metadata(n: torch.fx.Node) -> bool:
    """Whether the call ``n`` reads only its tensor arguments' metadata (sizes, dtype, device)."""
    if n.op == "call_method":
        return str(n.target) in _METADATA_METHODS
    return n.op == "call_function" and n.target in _METADATA_FUNCTIONS


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else f"{text[:37]}..."


class _FxConverter:
    def __init__(self, gm: torch.fx.GraphModule, values: dict[torch.fx.Node, Any], name: str) -> None:
        self.gm = gm
        self.values = values
        self.ctx = ConversionContext(name)
        self.env: dict[torch.fx.Node, Value] = {}
        self.aliases = Aliases(gm, values, self.ctx, self._callable)

    def run(self) -> Graph:
        outputs: list[str] = []
        weights_written: list[str] = []  # the targets of weights changed in place
        read: set[str] = set()  # the nodes the outputs read, directly or not
        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                v = self.values[n]
                if not isinstance(v, torch.Tensor):
                    raise FrontendError(f"input {n.name!r} must be a tensor, got {type(v).__name__}")
                self.env[n] = self.ctx.b.input(n.name, tuple(v.shape), tensor_type(v).dtype)
                self.aliases.observe(n, None)
            elif n.op == "output":
                outputs = self._outputs(n.args[0])
                read = fx_ancestors([a for a in pytree.tree_leaves(n.args[0]) if isinstance(a, torch.fx.Node)])
            else:
                self.env[n] = self._convert(n)
                mutated = mutated_by(n, self.gm)
                if mutated is not None and (root := self.aliases.root.get(mutated, mutated)).op == "get_attr":
                    weights_written.append(str(root.target))
                self.aliases.observe(n, mutated)
                if mutated is not None and isinstance(self.env.get(mutated), str) and isinstance(self.env[n], str):
                    # functionalised: the op computed a new value; later readers of the tensor it
                    # changed in place, and of every view of its memory, read new values
                    self.aliases.rebind(n, mutated, self.env)
        # an input changed in place (itself or through a view of it) was rebound to its new value
        writes = [(n.name, value) for n in self.gm.graph.nodes
                  if n.op == "placeholder" and isinstance(value := self.env[n], str) and value != n.name]
        # a weight is read wherever a get_attr of it is, before the write or after
        readers = {str(n.target) for n in self.gm.graph.nodes if n.op == "get_attr" and n.name in read}
        buffers, params = dict(self.gm.named_buffers()), dict(self.gm.named_parameters())
        kind = {t: "buffer" if t in buffers else "parameter" if t in params else "tensor attribute"
                for t in weights_written}
        check_weight_writes(self.ctx.b.name, {f"{kind[t]} {t!r}": t in readers for t in dict.fromkeys(weights_written)})
        return self.ctx.b.build(outputs, writes)

    def _outputs(self, returned: Any) -> list[str]:
        """The graph's outputs: the tensors the model returns, in pytree order as
        :class:`opsched.module.OutputStructure` numbers them (:func:`canonical_order`), a node's
        own container (a split's pieces) expanded in place."""
        out: list[str] = []
        leaves, spec = pytree.tree_flatten(returned)
        for leaf in (leaves[k] for k in canonical_order(spec)):
            value = self.env[leaf] if isinstance(leaf, torch.fx.Node) else leaf
            for v in pytree.tree_leaves(value):
                if isinstance(leaf, torch.fx.Node) and self.ctx.holds(v):
                    out.append(v)
                elif not isinstance(v, (bool, int, float, complex, str, type(None), torch.dtype, torch.device)):
                    register = f", or register it: torch.export.register_dataclass({type(v).__name__})" \
                        if dataclasses.is_dataclass(v) else ""
                    raise FrontendError(f"{self.ctx.b.name} returns a {type(v).__name__}, whose tensors tracing "
                                        f"cannot see: return its tensors instead{register}")
        return out

    def _arg(self, a: Any) -> Value:
        if isinstance(a, torch.fx.Node):
            return self.env[a]
        if isinstance(a, (list, tuple)):
            return type(a)(self._arg(x) for x in a)
        return a

    def _convert(self, n: torch.fx.Node) -> Value:
        value = self.values[n]
        if n.op == "get_attr":
            if not isinstance(value, torch.Tensor):
                return value
            return self.ctx.add("constant", [], name=n.name, params=[self.ctx.param(str(n.target), value)])
        if n.target is operator.setitem:
            return self._opaque(n, like=self.values[n.args[0]])  # type: ignore[index]
        if not any(isinstance(v, torch.Tensor) for v in pytree.tree_leaves(value)):
            self._check_not_read_from_data(n, value)
            return value  # ints, shapes, dtypes, None: constants of this specialised graph
        args = [self._arg(a) for a in n.args]
        kwargs = {k: self._arg(v) for k, v in n.kwargs.items()}
        conv = self._converter_for(n)
        if conv is not None:
            try:
                return self.ctx.checked(lambda: conv(self, n, args, kwargs), value, f"{n.name} ({n.target})")
            except Unsupported:
                pass
        return self._opaque(n)

    def _check_not_read_from_data(self, n: torch.fx.Node, value: Any) -> None:
        """Refuse a number the model reads from a tensor's values (``.item()``, ``.tolist()``,
        ``torch.equal``) and goes on computing with: the specialised graph would hold the example
        inputs' number as a constant, and compute wrongly for inputs of other values. A number of
        a tensor's metadata (``x.size(0)``, ``x.shape``, ``len(x)``) is a constant of the graph's
        shapes, as intended."""
        if not n.users or not any(isinstance(v, (bool, int, float, complex)) for v in pytree.tree_leaves(value)):
            return
        read = [a for a in n.all_input_nodes if isinstance(self.values.get(a), torch.Tensor)]
        if not read or _reads_metadata(n):
            return
        _, target = self._callable(n)
        raise FrontendError(
            f"{self.ctx.b.name}: node {n.name!r} ({target}) reads the values of {read[0].name!r} into Python "
            f"({_short(value)} for the example inputs), which the model computes with: a graph specialised to the "
            f"example inputs would hold that number as a constant, wrong for inputs of other values; compute it "
            f"with tensor ops instead (torch.where, a comparison with the tensor itself), or use "
            f"torch.compile(model, backend='opsched'), which runs it between the graphs it schedules")

    def _converter_for(self, n: torch.fx.Node) -> Converter | None:
        """A converter for the call, its in-place form converted as its out-of-place one (the
        value it computes is the same; :meth:`run` rebinds the tensor it changed)."""
        if n.op == "call_module":
            module = self.gm.get_submodule(str(n.target))
            # its hooks change what it computes: it runs whole, as called (an opaque node)
            return None if _hooked(module) else MODULE_CONVERTERS.get(type(module))
        if n.op == "call_function":
            conv = FUNCTION_CONVERTERS.get(n.target)
            name = getattr(n.target, "__name__", "")
            if conv is None and _in_place_name(name) and hasattr(torch, name[:-1]):
                conv = FUNCTION_CONVERTERS.get(getattr(torch, name[:-1]))
            return conv
        if n.op == "call_method":
            name = str(n.target)
            return METHOD_CONVERTERS.get(name[:-1] if _in_place_name(name) else name)
        return None

    def _opaque(self, n: torch.fx.Node, like: Any = None) -> Value:
        """The call as opaque node(s) that run it: one for a tensor result; for a container (a
        tuple with a None, a dict), one per tensor in it, so that every traced tensor stays a
        graph value (none is frozen into a constant). ``like``: the result's example, where the
        recording has none (a ``setitem``)."""
        value = self.values[n] if like is None else like
        fn, target = self._callable(n)
        tensor_nodes = [a for a in n.all_input_nodes if isinstance(self.env.get(a), str)]
        consts = {a: self.values[a] for a in n.all_input_nodes if a not in tensor_nodes}
        # an in-place call works on a copy: the value is shared
        call = replaying(fn, n, tensor_nodes, consts, clone=mutated_by(n, self.gm) is not None)
        inputs = [self.env[a] for a in tensor_nodes]
        if isinstance(value, torch.Tensor):
            call.__qualname__ = target
            out = held_type(value, f"{self.ctx.b.name}: node {n.name!r} ({target})")
            return self.ctx.add("opaque", inputs, name=n.name, out=out, fn=call, target=target)
        leaves, spec = pytree.tree_flatten(value)
        names: list[Any] = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                names.append(leaf)
                continue

            def element(*tensors: torch.Tensor, i: int = i) -> torch.Tensor:
                out: torch.Tensor = pytree.tree_leaves(call(*tensors))[i]
                return out
            element.__qualname__ = f"{target}[{i}]"
            out = held_type(leaf, f"{self.ctx.b.name}: node {n.name!r} ({target}, output {i})")
            names.append(self.ctx.add("opaque", inputs, name=f"{n.name}_{i}", out=out, fn=element,
                                      target=f"{target}[{i}]"))
        return pytree.tree_unflatten(names, spec)

    def _callable(self, n: torch.fx.Node) -> tuple[Callable[..., Any], str]:
        """What an opaque node calls, and its name for reports."""
        if n.op == "call_module":
            module = self.gm.get_submodule(str(n.target))
            return module, f"{type(module).__name__} {n.target}"
        if n.op == "call_method":
            method = str(n.target)

            def fn(self_: Any, *a: Any, **k: Any) -> Any:
                return getattr(self_, method)(*a, **k)
            return fn, f"Tensor.{method}"
        if n.target is operator.setitem:
            return _set_item, "setitem"
        assert callable(n.target)
        return n.target, getattr(n.target, "__name__", str(n.target))

    # helpers for converters
    def module(self, n: torch.fx.Node, kind: type[M]) -> M:
        """The submodule a ``call_module`` node calls, which is a ``kind``."""
        m = self.gm.get_submodule(str(n.target))
        assert isinstance(m, kind), f"{n.target} is a {type(m).__name__}, not a {kind.__name__}"
        return m

    def out_type(self, n: torch.fx.Node) -> Any:
        return tensor_type(self.values[n])


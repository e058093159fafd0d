"""PyTorch import at the ATen level: a ``torch.export`` program, converted call by call.

:mod:`opsched.frontends.export_trace` traces the module with ``torch.export`` (Python control
flow included, on the example inputs' shapes) into a functional graph of ATen calls (in-place
calls and writes through views become out-of-place calls and scatters) that keeps operators
whole (``conv2d``, ``layer_norm``, ``scaled_dot_product_attention``). Each call then becomes

* an op of ours where one models it (:mod:`opsched.frontends.aten_ops`): convolutions, batch
  norms, activations, pools, sums, concatenations, reshapes, slices, ... so that batch norms
  fold, activations fuse and convolutions merge as they do from any frontend;
* a constant, where every tensor it reads is a weight or a constant (folded once, here);
* otherwise a generic ATen node (:mod:`opsched.ir.ops.aten`): it runs the overload itself, its
  type from fake-tensor propagation, its FLOPs from PyTorch's flop counter.

A region the model runs with autocast turned off (``with torch.autocast(..., enabled=False)``,
often around rotary embeddings and attention scores), or with gradients turned on or off, is
traced as a higher-order call on a graph of its own: its calls are converted in place of it,
as if the region were not there, since at inference, without autocast around the model, it
computes the same. Nothing becomes opaque but a control-flow operator (``torch.cond``: its
branches are graphs of their own) and a region autocast turns on (whose casts are the device's:
``autocast("cuda")`` casts CUDA tensors only), each of which runs whole, on torch, where the
graph runs. A number the model reads out of a tensor (``.item()``) is held only for its
assertions on it (``torch._check``, ``assert lengths.max().item() <= n``), which the graph leaves
out, as ONNX export does, since each would stop the device for the host to read the number (they
are logged, with where they stand); a call that computes a tensor from such a number is refused,
as one static graph cannot hold it. Nodes inside a ``torch.nn`` module are named after it
(``stem_0_conv``, as torch.fx names them), others as torch.export does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree
from torch.export.graph_signature import OutputKind

from opsched.errors import FrontendError
from opsched.frontends._common import (
    ConversionContext,
    Unsupported,
    check_weight_writes,
    fx_ancestors,
    held_type,
    log,
    replaying,
    symbolic,
    traced_flops,
)
from opsched.frontends.model_source import call_place, call_site
from opsched.frontends.read_numbers import ReadNumbers, data_sized
from opsched.ir import Graph, tensor_type
from opsched.ir.ops.aten import encode_args, generic_kind, target_of
from opsched.structure.trees import canonical_order

__all__ = ["Const", "ExportConverter"]


@dataclass(frozen=True, eq=False)
class Const:
    """A tensor known at import: a weight, a buffer, a lifted constant or a folded value."""

    tensor: torch.Tensor
    name: str


def _puts_back(new: Any, old: torch.Tensor) -> bool:
    """Whether a weight's new value is known at import (computed from weights alone) and equal to
    ``old`` in type, shape, device and every element: a write that changes nothing, at this call
    or, its sources unchanged, at any later one."""
    return (isinstance(new, Const) and new.tensor.dtype == old.dtype and new.tensor.shape == old.shape
            and new.tensor.device == old.device and torch.equal(new.tensor, old))


@dataclass(frozen=True, eq=False)
class _Pending:
    """A generic call with several results, each made a node when a ``getitem`` asks for it."""

    node: torch.fx.Node


@dataclass(frozen=True, eq=False)
class _DataDependent:
    """A number read out of a tensor (``.item()``) or computed from one: the graph holds it only
    for the model's assertions on it (``torch._check``, ``assert x.max() <= n``), which are
    dropped (module docstring); a call that computes a tensor from it is refused."""

    origin: torch.fx.Node  # the call that read it out of a tensor


def _target_text(n: torch.fx.Node) -> str:
    op = n.target
    return target_of(op) if isinstance(op, torch._ops.OpOverload) else getattr(op, "__name__", str(op))


def _transparent_body(n: torch.fx.Node) -> torch.fx.Node | None:
    """The graph a higher-order call runs where the call only sets a mode that leaves inference
    as it is (module docstring): gradients on or off, autocast off; None for any other."""
    hop = torch.ops.higher_order
    if n.target is getattr(hop, "wrap_with_set_grad_enabled", None):
        body = n.args[1]  # (enabled, body, *operands)
    elif n.target is getattr(hop, "wrap_with_autocast", None) and n.args[2] is False:
        body = n.args[4]  # (device, dtype, enabled, cache_enabled, body, *operands)
    else:
        return None
    return body if isinstance(body, torch.fx.Node) and body.op == "get_attr" else None


class ExportConverter:
    """One exported program's conversion (module docstring); converters get this as ``c``.

    ``fixed`` holds, by their place among the program's user inputs, the tensors whose values
    the graph is specialised to (:class:`~opsched.structure.InputStructure`'s fixed values): each
    is a constant, so what the model computes of it alone is folded here, numbers read out of it
    included (``grid_thw.tolist()``), and the sizes that follow from those numbers are known.
    With ``draft`` (a program :func:`torch.export.draft_export` made, which took each branch on a
    number read out of a tensor as the example's value did), a number read out of any other
    tensor is refused, even one only asserted on: the assertion guards that branch."""

    def __init__(self, program: torch.export.ExportedProgram, name: str,
                 fixed: Mapping[int, torch.Tensor] | None = None, *, draft: bool = False, root: str = "") -> None:
        self.program = program
        self.root = root  # the model's own path in the program's module (a wrapper's ``inner.``), left out of names
        self.ctx = ConversionContext(name)
        self.env: dict[torch.fx.Node, Any] = {}
        self.fixed = dict(fixed or {})
        self.draft = draft
        self.known = ReadNumbers()  # the numbers read out of fixed inputs, as folded
        self._constants: dict[int, str] = {}  # id(Const) -> its constant node
        self._module_names: dict[str, int] = {}
        self.dropped_assertions: list[str] = []  # where the model asserts on its tensors' values

    # --- the walk ---------------------------------------------------------------------------
    def run(self) -> Graph:
        sig = self.program.graph_signature
        weights = {**sig.inputs_to_parameters, **sig.inputs_to_buffers, **sig.inputs_to_lifted_tensor_constants}
        tables = {**self.program.state_dict, **self.program.constants}
        outputs: list[str] = []
        users = iter(range(len(sig.user_inputs)))
        for n in self.program.graph.nodes:
            if n.op == "placeholder":
                if n.name in weights:
                    self.env[n] = Const(tables[weights[n.name]], weights[n.name].removeprefix(self.root))
                elif (place := next(users)) in self.fixed:
                    self.env[n] = Const(self.fixed[place], n.name)
                else:
                    self.env[n] = self._input(n)
            elif n.op == "output":
                kinds = [spec.kind for spec in sig.output_specs]
                returned = [v for v, kind in zip(n.args[0], kinds) if kind == OutputKind.USER_OUTPUT]
                order = canonical_order(self.program.call_spec.out_spec)
                if len(order) != len(returned):  # OutputStructure numbers the model's outputs in this order
                    raise FrontendError(f"{self.ctx.b.name}: the program returns {len(returned)} values where its "
                                        f"output's structure holds {len(order)}; please report this with the model")
                outputs = self._outputs([returned[k] for k in order])
                writes = self._writes(n)
            elif n.op == "call_function":
                self.env[n] = self._call(n)
            elif n.op == "get_attr":  # a branch or body of a control-flow operator (torch.cond)
                self.env[n] = getattr(self.program.graph_module, str(n.target))
            else:
                raise FrontendError(f"{self.ctx.b.name}: unexpected {n.op} node {n.name!r} in the exported program")
        if sites := list(dict.fromkeys(self.dropped_assertions)):
            log.info("%s: the model's assertions on its tensors' values are left out of the graph, as ONNX export "
                     "leaves them out (each would stop the device to read a number back); they stand at %s",
                     self.ctx.b.name, "; ".join(sites))
        return self.ctx.b.build(outputs, writes)

    def _writes(self, output: torch.fx.Node) -> list[tuple[str, str]]:
        """What the model changes in place besides computing its outputs. Each input it writes
        becomes a write of the graph (the module copies the new value into the caller's tensor).
        Its weights are constants of the graph: see :func:`check_weight_writes` for those it writes."""
        specs = self.program.graph_signature.output_specs
        returned = output.args[0]
        assert isinstance(returned, (tuple, list))
        values = dict(zip((spec.arg.name for spec in specs), returned))
        writes: list[tuple[str, str]] = []
        for spec in specs:
            if spec.kind == OutputKind.USER_INPUT_MUTATION and self.env[values[spec.arg.name]] != spec.target:
                writes.append((str(spec.target), self.value(self.env[values[spec.arg.name]])))
        computed = (OutputKind.USER_OUTPUT, OutputKind.USER_INPUT_MUTATION)
        read = fx_ancestors([v for spec in specs
                             if spec.kind in computed and isinstance(v := values[spec.arg.name], torch.fx.Node)])
        sig = self.program.graph_signature
        placeholder = {target: name for name, target in {**sig.inputs_to_buffers, **sig.inputs_to_parameters}.items()}
        kind = {OutputKind.BUFFER_MUTATION: "buffer", OutputKind.PARAMETER_MUTATION: "parameter"}
        weight_writes = [s for s in specs if s.kind in kind]
        tables = {**self.program.state_dict, **self.program.constants}
        if all(_puts_back(self.env[values[s.arg.name]], tables[str(s.target)]) for s in weight_writes):
            weight_writes = []  # each write gives a weight the values it holds (CTRL's pos_encoding.to(dtype))
        check_weight_writes(self.ctx.b.name, {f"{kind[s.kind]} {s.target!r}": placeholder[str(s.target)] in read
                                              for s in weight_writes})
        return writes

    def _input(self, n: torch.fx.Node) -> Any:
        """A tensor argument is a graph input; any other (None, a flag) is a value fixed at export."""
        v = n.meta.get("val")
        if not isinstance(v, torch.Tensor):
            return v
        return self.ctx.b.input(n.name, tuple(int(d) for d in v.shape), tensor_type(v).dtype)

    def _outputs(self, returned: Any) -> list[str]:
        """The graph's outputs: the returned tensors in pytree order (the program's output leaves,
        put in :func:`~opsched.structure.trees.canonical_order` by :meth:`run`). A returned
        number, string or None is fixed (``OutputStructure`` keeps it from the model's own output)."""
        out: list[str] = []
        for leaf in pytree.tree_leaves(returned):
            if not isinstance(leaf, torch.fx.Node):  # a literal
                value = leaf
            elif isinstance(value := self.env[leaf], (str, Const)):
                out.append(self.value(value))
                continue
            elif isinstance(value, _DataDependent):
                raise FrontendError(f"{self.ctx.b.name} returns a number read out of a tensor (node "
                                    f"{value.origin.name!r}, {_target_text(value.origin)}), which a static graph "
                                    f"cannot hold: return the tensor, and read its number outside the model")
            if not isinstance(value, (bool, int, float, complex, str, type(None))):
                raise FrontendError(f"{self.ctx.b.name} returns a {type(value).__name__} where a tensor was expected")
        return out

    def _call(self, n: torch.fx.Node) -> Any:
        from opsched.frontends.aten_ops import ATEN_CONVERTERS, getitem

        if n.meta.get("val") is None:
            self._asserted(n)
            return None  # an assertion (_assert_scalar, _assert_tensor_metadata, ...): nothing to compute
        sized = data_sized(n.meta["val"])
        val = self._concrete(n)
        read = next((h for a in n.all_input_nodes if isinstance(h := self.env[a], _DataDependent)), None)
        tensors = any(isinstance(t, torch.Tensor) for t in pytree.tree_leaves(val))
        if (sized or symbolic(val)) and read is None and self._foldable(n):
            return self._fold(n)  # read out of a fixed input, or sized by such a number: known here
        if not tensors and symbolic(val):  # read out of a tensor, or computed from such a number
            return read or _DataDependent(n)
        if read is not None:  # a number known whatever the data (u0 >= 0, for a count), or a tensor: refused
            return self._computed_from(read, n) if tensors else val
        if n.target is getitem:
            return self._getitem(n)
        if isinstance(n.target, torch._ops.HigherOrderOperator):
            if (body := _transparent_body(n)) is not None:
                return self._inline(self.env[body], n.args[n.args.index(body) + 1:])
            return self.control_flow(n) if isinstance(val, torch.Tensor) else _Pending(n)
        if not tensors:
            return val  # a size, known for these shapes (or once numbers read out of a fixed input are)
        if not isinstance(n.target, torch._ops.OpOverload):
            raise FrontendError(f"{self.ctx.b.name}: node {n.name!r} calls {n.target!r}, not an ATen operator")
        if self._foldable(n):
            return self._fold(n)
        convert = ATEN_CONVERTERS.get(n.target)
        if convert is not None:
            args = [self._arg(a) for a in n.args]
            kwargs = {k: self._arg(v) for k, v in n.kwargs.items()}
            try:
                return self.ctx.checked(lambda: convert(self, n, args, kwargs), val,
                                        f"{n.name} ({target_of(n.target)})")
            except Unsupported:
                pass
        if isinstance(val, torch.Tensor):
            return self.generic(n)
        return _Pending(n)

    def _computed_from(self, read: _DataDependent, n: torch.fx.Node) -> Any:
        raise FrontendError(
            f"{self.ctx.b.name}: node {read.origin.name!r} ({_target_text(read.origin)}){call_place(read.origin)} "
            f"gives a value that depends on tensor data and node {n.name!r} ({_target_text(n)}){call_place(n)} "
            f"computes a tensor from it; a static graph cannot hold it")

    def _asserted(self, n: torch.fx.Node) -> None:
        """An assertion on a number read out of a tensor is dropped, and said where it stood; in a
        draft program (class docstring), refused: it guards a branch the example's value chose."""
        read = next((h for a in n.all_input_nodes if isinstance(h := self.env[a], _DataDependent)), None)
        if read is None:
            return
        if self.draft:
            raise FrontendError(
                f"{self.ctx.b.name}: node {read.origin.name!r} ({_target_text(read.origin)}) reads a number out of a "
                f"tensor that is not a fixed input, and the model branches on it at {call_site(n)}: one graph holds "
                f"one branch, right for this example's values only; fix the inputs it is read from (fixed_values=), or "
                f"use torch.compile(model, backend='opsched')")
        self.dropped_assertions.append(call_site(n))

    def _inline(self, body: torch.fx.GraphModule, operands: Sequence[Any]) -> tuple[Any, ...]:
        """``body``'s calls converted on ``operands``, in place of the higher-order call that
        runs it; its results, as that call's."""
        bound = iter(operands)
        for n in body.graph.nodes:
            if n.op == "placeholder":
                self.env[n] = self._arg(next(bound))
                self._concrete(n)
            elif n.op == "get_attr":  # a region within the region
                self.env[n] = getattr(body, str(n.target))
            elif n.op == "call_function":
                self.env[n] = self._call(n)
            elif n.op == "output":
                return tuple(self._arg(n.args[0]))
        raise FrontendError(f"{self.ctx.b.name}: a region's graph has no output node")

    def _getitem(self, n: torch.fx.Node) -> Any:
        source, index = n.args
        assert isinstance(source, torch.fx.Node) and isinstance(index, int)
        held = self.env[source]
        if isinstance(held, _Pending) and isinstance(source.target, torch._ops.HigherOrderOperator):
            return self.control_flow(source, index=index)
        if isinstance(held, _Pending) or held[index] is None:
            return self.generic(source, index=index)
        return held[index]

    def _arg(self, a: Any) -> Any:
        return torch.fx.node.map_arg(a, lambda x: self.env[x])

    # --- constants --------------------------------------------------------------------------
    def _foldable(self, n: torch.fx.Node) -> bool:
        """Every tensor and number it reads is known (a weight, a fixed input, what was computed
        of them alone), and it draws no random numbers."""
        op = n.target
        if isinstance(op, torch._ops.OpOverload) and torch.Tag.nondeterministic_seeded in op.tags:
            return False
        if isinstance(op, torch._ops.HigherOrderOperator):
            return False
        return all(isinstance(held := self.env[a], Const) or
                   (isinstance(held, (bool, int, float)) and not symbolic(held)) for a in n.all_input_nodes)

    def _fold(self, n: torch.fx.Node) -> Any:
        def real(a: torch.fx.Node) -> Any:
            held = self.env[a]
            return held.tensor if isinstance(held, Const) else held
        assert callable(n.target)
        with torch.no_grad():
            out = n.target(*torch.fx.node.map_arg(n.args, real), **torch.fx.node.map_arg(n.kwargs, real))
        self.known.bind(n, out)
        leaves, spec = pytree.tree_flatten(out)
        return pytree.tree_unflatten([Const(t, n.name) if isinstance(t, torch.Tensor) else t for t in leaves], spec)

    def _concrete(self, n: torch.fx.Node) -> Any:
        """``n``'s traced value with the numbers read out of fixed inputs substituted
        (:meth:`ReadNumbers.concrete`), its meta rewritten so, for the converters that read it."""
        val = n.meta.get("val")
        if self.known and (symbolic(val) or data_sized(val)):
            n.meta["val"] = val = self.known.concrete(val)
        return val

    def param(self, c: Any) -> str:
        """A known tensor as a parameter (a converter's weight)."""
        if not isinstance(c, Const):
            raise Unsupported  # a computed weight: the call stays generic
        return self.ctx.param(c.name, c.tensor)

    def value(self, v: Any) -> str:
        """A converter's tensor operand as a graph value (a known tensor via a constant node)."""
        if isinstance(v, str):
            return v
        if isinstance(v, Const):
            if id(v) not in self._constants:
                self._constants[id(v)] = self.ctx.add("constant", [], name=v.name.replace(".", "_"),
                                                      params=[self.param(v)])
            return self._constants[id(v)]
        raise Unsupported

    # --- generic nodes ----------------------------------------------------------------------
    def generic(self, n: torch.fx.Node, index: int | None = None) -> str:
        """The call as a generic ATen node (its ``index``-th result, for a call with several)."""
        op = n.target
        assert isinstance(op, torch._ops.OpOverload)
        inputs: list[str] = []
        params: list[str] = []
        markers: dict[int, tuple[str, int]] = {}

        def mark(a: torch.fx.Node) -> Any:
            held = self.env[a]
            if isinstance(held, Const):
                params.append(self.param(held))
                return _Marker(("p", len(params) - 1))
            if isinstance(held, (bool, int, float)) and not symbolic(held):  # read out of a fixed input
                return held
            if not isinstance(held, str):
                raise FrontendError(f"{self.ctx.b.name}: node {n.name!r} ({target_of(op)}) reads {a.name!r}, "
                                    f"which is not one tensor")
            inputs.append(held)
            return _Marker(("t", len(inputs) - 1))

        args = torch.fx.node.map_arg(n.args, mark)
        kwargs = torch.fx.node.map_arg(n.kwargs, mark)
        for m in pytree.tree_leaves((args, kwargs)):
            if isinstance(m, _Marker):
                markers[id(m)] = m.code
        val = n.meta["val"] if index is None else n.meta["val"][index]
        out = held_type(val, f"{self.ctx.b.name}: node {n.name!r} ({target_of(op)}){call_place(n)}")
        attrs = {"target": target_of(op), "args": encode_args(tuple(args), markers)[1],
                 "kwargs": tuple((k, encode_args(v, markers)) for k, v in kwargs.items()),
                 "flops": traced_flops(n, index)}
        if index is not None:
            attrs["index"] = index
        return self.ctx.add(generic_kind(op), inputs, name=self.name(n) if index is None else f"{n.name}_{index}",
                            params=params, out=out, **attrs)

    def control_flow(self, n: torch.fx.Node, index: int | None = None) -> str:
        """A control-flow operator (``torch.cond``, ``while_loop``: their branches are graphs of
        their own) as an opaque node that calls it (its ``index``-th result, for several): it
        runs on torch, whole, and cuts an ONNX Runtime segment where it stands."""
        op = n.target
        assert isinstance(op, torch._ops.HigherOrderOperator)
        tensors = [a for a in n.all_input_nodes if isinstance(self.env[a], str)]
        fixed = {a: self.env[a].tensor if isinstance(self.env[a], Const) else self.env[a]
                 for a in n.all_input_nodes if a not in tensors}
        whole = replaying(op, n, tensors, fixed)

        def call(*values: torch.Tensor) -> Any:
            return whole(*values) if index is None else whole(*values)[index]

        target = op.__name__
        call.__qualname__ = target
        val = n.meta["val"] if index is None else n.meta["val"][index]
        out = held_type(val, f"{self.ctx.b.name}: node {n.name!r} ({target}){call_place(n)}")
        return self.ctx.add("opaque", [self.env[a] for a in tensors], name=n.name if index is None else
                            f"{n.name}_{index}", out=out, fn=call, target=target)

    # --- helpers for converters ---------------------------------------------------------------
    def name(self, n: torch.fx.Node) -> str:
        """The node's name: its ``torch.nn`` module's path where it is the first call of that
        module (``stem.0.conv`` -> ``stem_0_conv``), torch.export's name otherwise."""
        stack = n.meta.get("nn_module_stack") or {}
        if stack:
            path, kind = list(stack.values())[-1]
            path = "" if path == self.root.rstrip(".") else path.removeprefix(self.root)
            kind = kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}"
            if path and kind.startswith("torch.nn.modules.") and not kind.startswith("torch.nn.modules.container."):
                key = path.replace(".", "_")
                self._module_names[key] = self._module_names.get(key, 0) + 1
                if self._module_names[key] == 1:
                    return str(key)
        return n.name

    def out_type(self, n: torch.fx.Node) -> Any:
        return tensor_type(n.meta["val"])


class _Marker:
    """A tensor argument's place, while a generic node's arguments are encoded."""

    __slots__ = ("code",)

    def __init__(self, code: tuple[str, int]) -> None:
        self.code = code

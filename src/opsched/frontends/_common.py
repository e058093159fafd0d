"""What both frontends share: the conversion context, the report of opaque nodes, and a traced
call's FLOPs."""

from __future__ import annotations

import contextlib
import functools
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from opsched.errors import FrontendError, ShapeMismatchError, StatefulModelError
from opsched.ir import Graph, GraphBuilder, TensorType, tensor_type
from opsched.ir.ops.aten import encode_args, generic_kind, target_of
from opsched.ir.types import DTYPE_BYTES

__all__ = ["Unsupported", "ConversionContext", "In", "held_type", "report_opaque", "fx_ancestors",
           "check_weight_writes", "replaying", "quieted", "symbolic", "traced_flops"]

log = logging.getLogger("opsched.frontends")


class Unsupported(Exception):
    """Raised by a converter for a configuration it does not handle (internal signal)."""


@dataclass(frozen=True)
class In:
    """Among the arguments given to :meth:`ConversionContext.aten`: the node's ``k``-th input."""

    k: int


class ConversionContext:
    """A :class:`GraphBuilder` plus parameter de-duplication, handed to every converter."""

    def __init__(self, name: str) -> None:
        self.b = GraphBuilder(name)
        # id() of a source tensor -> (name, the tensor): holding the tensor keeps its id unique
        self._param_ids: dict[int, tuple[str, torch.Tensor]] = {}

    def param(self, name: str, tensor: torch.Tensor) -> str:
        """Register a parameter once per tensor object (shared weights stay shared)."""
        key = id(tensor)
        if key in self._param_ids:
            return self._param_ids[key][0]
        name = name if name not in self.b.params else self.b.fresh(name)
        self.b.param(name, tensor)
        self._param_ids[key] = (name, tensor)
        return name

    def add(self, op: str, inputs: Sequence[str], *, name: str | None = None, params: Sequence[str] = (),
            out: TensorType | None = None, fn: Callable[..., Any] | None = None, **attrs: Any) -> str:
        if name is not None and self.b.holds(name):
            name = self.b.fresh(name)
        return self.b.add(op, inputs, name=name, params=params, out=out, fn=fn, **attrs)

    def type(self, value: str) -> TensorType:
        return self.b.type(value)

    def holds(self, value: object) -> bool:
        """Whether ``value`` names a value of the graph (not a string the model computes)."""
        return isinstance(value, str) and self.b.holds(value)

    def checked(self, convert: Callable[[], Any], val: Any, what: str) -> Any:
        """What ``convert()`` makes of a call that gave ``val`` in torch. Where it raises
        :class:`Unsupported`, or types its value otherwise than torch did (a family's shape rule
        that disagrees) or not at all (one narrower than torch's: a pool of an unbatched
        ``(C, H, W)`` image, which torch takes), the nodes it added are taken back and
        :class:`Unsupported` raised: the call stays generic, typed by torch."""
        mark = self.b.mark()
        try:
            try:
                made = convert()
            except ShapeMismatchError as e:
                log.debug("%s: %s cannot be typed by its family: %s", self.b.name, what, e)
                raise Unsupported from e
            if isinstance(made, str) and isinstance(val, torch.Tensor) and self.type(made) != tensor_type(val):
                log.debug("%s: %s typed %s by its family, %s by torch", self.b.name, what, self.type(made),
                          tensor_type(val))
                raise Unsupported
        except Unsupported:
            self.b.undo(mark)
            # weights registered meanwhile: forgotten (keyed by their source tensors, of which the
            # builder holds detached copies)
            for key in [k for k, (name, _) in self._param_ids.items() if name not in self.b.params]:
                del self._param_ids[key]
            raise
        return made

    def aten(self, op: torch._ops.OpOverload, inputs: Sequence[str], args: Sequence[Any],
             kwargs: Mapping[str, Any] | None = None, *, name: str, flops: int = 0) -> str:
        """A generic ATen node (:mod:`opsched.ir.ops.aten`) calling ``op`` on ``args`` and
        ``kwargs``, where :class:`In` marks the node's inputs (top-level arguments only); its
        output type from running ``op`` on meta tensors of the inputs' types."""
        metas = [torch.empty(t.shape, dtype=getattr(torch, t.dtype), device="meta") for t in map(self.type, inputs)]

        def bound(a: Any) -> Any:
            return metas[a.k] if isinstance(a, In) else a
        call_args, call_kwargs = [bound(a) for a in args], {k: bound(v) for k, v in (kwargs or {}).items()}
        out = held_type(op(*call_args, **call_kwargs), f"node {name!r} ({target_of(op)})")
        marks = {id(m): ("t", k) for k, m in enumerate(metas)}
        return self.add(generic_kind(op), inputs, name=name, out=out, target=target_of(op),
                        args=encode_args(tuple(call_args), marks)[1],
                        kwargs=tuple((k, encode_args(v, marks)) for k, v in call_kwargs.items()), flops=flops)


def held_type(value: Any, what: str) -> TensorType:
    """The type of a traced ``value`` that ``what`` (a model, node and op) gives, or a
    :class:`FrontendError` where opsched cannot hold it: not a tensor, or of a dtype it has no
    type for (complex numbers, say)."""
    dtype = str(getattr(value, "dtype", type(value).__name__)).removeprefix("torch.")
    if not isinstance(value, torch.Tensor) or dtype not in DTYPE_BYTES:
        raise FrontendError(f"{what} gives {getattr(value, 'dtype', type(value).__name__)}, which opsched does not "
                            f"hold (it holds tensors of {', '.join(DTYPE_BYTES)})")
    unknown = [str(d) for d in value.shape if isinstance(d, torch.SymInt) and not _known(d)]
    if unknown:
        raise FrontendError(f"{what} gives a tensor whose size ({', '.join(unknown)}) depends on the values it reads "
                            f"(as nonzero's or a boolean mask's does); a static graph cannot hold it: compute it "
                            f"outside the model, keep its module whole with leaf_modules, or use "
                            f"torch.compile(model, backend='opsched'), which runs it between the graphs it "
                            f"schedules")
    return tensor_type(value)


def _known(size: torch.SymInt) -> bool:
    """Whether a traced size is a number, not one that depends on tensor data."""
    try:
        int(size)
    except Exception:  # noqa: BLE001 (torch raises its guard errors for a data-dependent size)
        return False
    return True


def symbolic(val: Any) -> bool:
    """Whether a traced value holds a number that depends on tensor data (torch.export's ``u0``)."""
    return any(isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) for v in pytree.tree_leaves(val))


def report_opaque(graph: Graph, source: str) -> None:
    opaque = [n for n in graph.nodes if n.op == "opaque"]
    if opaque:
        listing = ", ".join(f"{n.name} ({n.attr('target')})" for n in opaque)
        log.warning("%s: %d call(s) have no converter and run as opaque nodes (they execute the "
                    "original callable but cannot be merged or costed analytically): %s",
                    source, len(opaque), listing)


def replaying(fn: Callable[..., Any], n: torch.fx.Node, tensors: Sequence[torch.fx.Node],
              fixed: Mapping[torch.fx.Node, Any], clone: bool = False) -> Callable[..., Any]:
    """What an opaque node runs: ``fn`` called with the arguments of the traced call ``n``, the
    values of ``tensors`` given by position at each call, every other node's value ``fixed``
    (with ``clone``, copies of the given: an in-place call must not change a value others read)."""
    args, kwargs = n.args, n.kwargs

    def call(*values: torch.Tensor) -> Any:
        given = dict(zip(tensors, (v.clone() if clone else v for v in values)))

        def look(a: torch.fx.Node) -> Any:
            return given[a] if a in given else fixed[a]
        return fn(*torch.fx.node.map_arg(args, look), **torch.fx.node.map_arg(kwargs, look))
    return call


@contextlib.contextmanager
def quieted(*loggers: str) -> Iterator[None]:
    """PyTorch's ``loggers`` at errors only, for the duration (torch.export's notes on sizes it
    specialised, or the traceback it logs before raising)."""
    held = [(log_, log_.level) for log_ in map(logging.getLogger, loggers)]
    for log_, _ in held:
        log_.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for log_, level in held:
            log_.setLevel(level)


def fx_ancestors(nodes: Sequence[torch.fx.Node]) -> set[str]:
    """The names of ``nodes`` and of every node they read, directly or not."""
    seen: set[str] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if n.name not in seen:
            seen.add(n.name)
            stack.extend(n.all_input_nodes)
    return seen


def check_weight_writes(model: str, written: Mapping[str, bool]) -> None:
    """A frontend imports weights and buffers as constants. ``written`` holds those the model's
    forward changes in place (``"buffer 'n'"``), each with whether its outputs read it: then
    each call depends on the calls before (a stateful model), which is refused; a write nothing
    reads (a call counter) is left undone, with a warning."""
    if stateful := [w for w, read in written.items() if read]:
        training = any(w.rstrip("'").endswith(("running_mean", "running_var")) for w in stateful)
        fix = ("its batch norms run in training mode: export the model after model.eval()" if training else
               "keep the state outside the model (pass it as an input and return its new value)")
        raise StatefulModelError(
            f"{model} is stateful: its forward changes {', '.join(stateful)} in place and its outputs read "
            f"{'it' if len(stateful) == 1 else 'them'}, so each call depends on the calls before; opsched imports "
            f"weights and buffers as constants; {fix}")
    if written:
        log.warning("%s changes %s in place in forward; the scheduled module computes the same outputs but leaves "
                    "%s as it was", model, ", ".join(written), "it" if len(written) == 1 else "them")


#: FLOPs per element where PyTorch's flop counter has no rule: of the output (elementwise), of
#: the first input (reductions, norms: a few passes over it).
_PER_OUTPUT = {"elementwise": 1, "activation": 4}
_PER_INPUT = {"reduce": 1, "pool": 1, "norm": 5}


@functools.cache
def _counted_by_torch(op: torch._ops.OpOverload) -> bool:
    """Whether PyTorch's flop counter can count ``op``: it has a rule for it, or ``op`` decomposes
    (as the counter decomposes it: its CompositeImplicitAutograd kernel) into calls that may have
    one. Any other call the counter only runs, on fake tensors, to count nothing: skipped, since
    running it cost a millisecond a node (TimesFM 2.5's 27,365 nodes: 21 s of a 170 s import)."""
    from torch.utils.flop_counter import flop_registry

    implicit = torch._C.DispatchKey.CompositeImplicitAutograd
    return (op.overloadpacket in flop_registry or implicit in op.py_kernels
            or torch._C._dispatch_has_kernel_for_dispatch_key(op._name, implicit))


def traced_flops(n: torch.fx.Node, index: int | None = None) -> int:
    """A traced ATen call's FLOPs (its ``index``-th result's, for a call with several) by
    PyTorch's own rules (its flop counter, run on the fake tensors, so nothing is computed);
    where it has none, a count per element by category."""
    from torch.utils.flop_counter import FlopCounterMode

    from opsched.ir.ops.aten import category_of

    op = n.target
    assert isinstance(op, torch._ops.OpOverload)

    def fake(a: torch.fx.Node) -> Any:
        return a.meta.get("val")
    counted = 0
    if _counted_by_torch(op):
        try:
            with FlopCounterMode(display=False) as counter:
                op(*torch.fx.node.map_arg(n.args, fake), **torch.fx.node.map_arg(n.kwargs, fake))
            counted = int(counter.get_total_flops())
        except Exception:  # noqa: BLE001 (an estimate: no rule, then the count below)
            pass
    if counted:
        return counted
    category = category_of(op)
    if op._schema.name == "aten::scaled_dot_product_attention":  # Q K^T and P V; the CPU kernel has no rule
        q, k, v = (a.meta["val"] for a in n.args[:3])  # type: ignore[union-attr]
        return int(2 * q.numel() * k.shape[-2] + 2 * q.shape[:-1].numel() * k.shape[-2] * v.shape[-1])
    out = n.meta["val"] if index is None else n.meta["val"][index]
    first = next((a.meta["val"] for a in n.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)), out)
    return int(_PER_OUTPUT.get(category, 0) * out.numel() + _PER_INPUT.get(category, 0) * first.numel())

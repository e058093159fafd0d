"""The reference interpreter: run a graph in topological order, one kernel at a time.

It is the numeric oracle every executor is compared with, and the simplest complete runtime:
values are freed after their last use, and every failure names the node and op.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Collection, Mapping, Sequence

import torch

from opsched._text import not_a_tensor
from opsched.errors import ExecutionError, InputMismatchError, OpschedError
from opsched.ir import Graph, random_inputs
from opsched.ir.ops import Kernel, torch_kernel

__all__ = ["Interpreter", "run_graph", "check_inputs", "drawn_well", "stage_inputs"]


def check_inputs(graph: Graph, inputs: Sequence[torch.Tensor]) -> None:
    """Raise :class:`InputMismatchError` unless ``inputs`` match the graph's inputs exactly."""
    if len(inputs) != len(graph.inputs):
        raise InputMismatchError(f"graph {graph.name!r} takes {len(graph.inputs)} inputs "
                                 f"({', '.join(i.name for i in graph.inputs)}), got {len(inputs)}")
    for spec, t in zip(graph.inputs, inputs):
        if not isinstance(t, torch.Tensor):
            raise InputMismatchError(f"input {spec.name!r} of graph {graph.name!r} must be a tensor, "
                                     f"{not_a_tensor(t)}")
        shape, dtype = tuple(t.shape), str(t.dtype).removeprefix("torch.")
        if shape == spec.type.shape and dtype != spec.type.dtype:
            again = (f", or optimize again with dtype={dtype!r} for a graph in that precision"
                     if t.is_floating_point() and getattr(torch, spec.type.dtype).is_floating_point else "")
            raise InputMismatchError(
                f"input {spec.name!r} of graph {graph.name!r}: expected {spec.type} ({spec.type.dtype}), got "
                f"{dtype} values of that shape; the graph (and any schedule for it) runs in the types it was "
                f"made for: pass the input as tensor.to(torch.{spec.type.dtype}){again}")
        if shape != spec.type.shape or dtype != spec.type.dtype:
            raise InputMismatchError(
                f"input {spec.name!r} of graph {graph.name!r}: expected {spec.type} "
                f"(shape {spec.type.shape}, {spec.type.dtype}), got shape {shape}, {dtype}; "
                f"the graph (and any schedule for it) is specialised to that shape: import or "
                f"optimize again with example inputs of the new shape (opsched.optimize_per_shape, or "
                f"torch.compile(model, backend='opsched'), schedules a model for each input shape it meets; "
                f"opsched.load(model, schedule, inputs, retarget=True) runs this schedule at the new shape, with "
                f"no search)")


class Interpreter:
    """Kernels bound once; ``__call__`` runs the graph on a list of input tensors."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.kernels: list[Kernel] = [torch_kernel(graph, n) for n in graph.nodes]
        # value name -> index of the node after which it is dead (never, for graph outputs)
        last: dict[str, int] = {}
        for i, n in enumerate(graph.nodes):
            for v in n.inputs:
                last[v] = i
        for v in graph.outputs:
            last[v] = len(graph.nodes)
        self._free_after: list[list[str]] = [[] for _ in graph.nodes]
        for v, i in last.items():
            if i < len(graph.nodes):
                self._free_after[i].append(v)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return self.run(inputs)[0]

    @torch.no_grad()
    def run(self, inputs: Sequence[torch.Tensor], keep: Collection[str] = ()
            ) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
        """The outputs, and the values named in ``keep`` (kept past their last use)."""
        graph, keep = self.graph, frozenset(keep)
        check_inputs(graph, inputs)
        env: dict[str, torch.Tensor] = {i.name: t for i, t in zip(graph.inputs, inputs)}
        kept = {v: env[v] for v in keep if v in env}
        for i, (node, kernel) in enumerate(zip(graph.nodes, self.kernels)):
            try:
                env[node.name] = kernel(*(env[v] for v in node.inputs))
            except OpschedError:
                raise
            except Exception as e:
                raise ExecutionError(f"graph {graph.name!r}: node {node.name!r} ({node.op}) failed: "
                                     f"{type(e).__name__}: {e}") from e
            if node.name in keep:
                kept[node.name] = env[node.name]
            for v in self._free_after[i]:
                del env[v]
        return [env[v] for v in graph.outputs], kept


def run_graph(graph: Graph, inputs: Sequence[torch.Tensor] | Mapping[str, torch.Tensor]) -> list[torch.Tensor]:
    """``graph``'s outputs on ``inputs``, node by node: what the model returns, then the new
    values of the inputs it changes in place (:attr:`Graph.writes`); ``inputs`` are not changed.
    ``inputs`` are in the graph's order, or by name (``{"input_ids": ids}``, as ONNX Runtime
    takes a file's)."""
    if isinstance(inputs, Mapping):
        names = [i.name for i in graph.inputs]
        if set(inputs) != set(names):
            raise InputMismatchError(f"graph {graph.name!r} takes the inputs {', '.join(map(repr, names))}, got "
                                     f"{', '.join(map(repr, inputs)) or 'none'}")
        inputs = [inputs[n] for n in names]
    return Interpreter(graph)(inputs)


#: Per graph, the integer and boolean values it computes from :func:`random_inputs` (see
#: :func:`stage_inputs`); made on first need, dropped with the graph (which a scheduled module
#: keeps: so values over :data:`_KEPT_ELEMENTS` elements, a large mask, are drawn instead).
_COMPUTED: weakref.WeakKeyDictionary[Graph, dict[str, torch.Tensor]] = weakref.WeakKeyDictionary()
_COMPUTED_LOCK = threading.Lock()
_KEPT_ELEMENTS = 1 << 20


def stage_inputs(graph: Graph, sub: Graph, device: str | torch.device = "cpu") -> list[torch.Tensor]:
    """Inputs to time ``sub``, a stage cut out of ``graph``, with: :func:`random_inputs`'s draws,
    except for the integer and boolean values that ``graph`` computes (indices, offsets, masks),
    which are what it computes from its own drawn inputs. Drawn, they are zeros, which do not
    agree with one another: Qwen2-MoE writes the inverse of its experts' sort order through the
    order (``inv = empty_like(perm); inv[perm] = arange``); through zeros, all but one entry of
    ``inv`` keep what its memory held, which the next gather reads as indices, out of range."""
    drawn = random_inputs(sub, device)
    if not any(i.name in graph.index and not drawn_well(i.type.dtype) for i in sub.inputs):
        return drawn  # no integer value the graph computes: nothing to run it for
    with _COMPUTED_LOCK:
        values = _COMPUTED.get(graph)
        if values is None:
            keep = [n.name for n in graph.nodes if not drawn_well(n.out.dtype) and n.out.numel <= _KEPT_ELEMENTS]
            _, values = Interpreter(graph).run(random_inputs(graph, device), keep)
            _COMPUTED[graph] = values
    return [values[i.name].to(device) if i.name in values else t for i, t in zip(sub.inputs, drawn)]


def drawn_well(dtype: str) -> bool:
    """Whether a drawn value of ``dtype`` stands for a computed one: floats and complex numbers."""
    kind: torch.dtype = getattr(torch, dtype)
    return kind.is_floating_point or kind.is_complex

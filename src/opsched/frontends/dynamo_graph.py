"""A graph TorchDynamo captured, as a model the torch frontend imports.

Dynamo hands a backend an ``fx.GraphModule`` whose placeholders are the call's tensors, the
weights it lifted out of the model (parameters and buffers) and integer sizes, side by side.
:func:`frozen_module` makes it a module of the call's tensors alone, its weights frozen in as
buffers and its integers as the values they have, which :func:`opsched.optimize` imports like any
model; :func:`is_lifted_weight` tells the weights apart, and :func:`weights_written` finds the
weights the graph changes in place (a model's state, which a schedule cannot hold as constants).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch
from torch import fx, nn

__all__ = ["frozen_module", "is_lifted_weight", "weights_written"]


def is_lifted_weight(value: Any) -> bool:
    """Whether Dynamo passes ``value`` as a weight: a parameter or buffer it lifted."""
    return isinstance(value, torch.Tensor) and (isinstance(value, nn.Parameter)
                                                or getattr(value, "_dynamo_static_input_type", None) is not None)


def frozen_module(gm: fx.GraphModule, args: Sequence[Any], tensors: Sequence[int], name: str) -> fx.GraphModule:
    """The captured graph as a module of its dynamic tensors alone, which :func:`opsched.optimize`
    imports like any model: each weight a buffer (read by ``get_attr``), each integer argument
    the value it has in ``args``."""
    root = nn.Module()
    for target in {str(n.target) for n in gm.graph.nodes if n.op in ("get_attr", "call_module")}:
        *path, leaf = target.split(".")
        owner = root
        for atom in path:
            if not hasattr(owner, atom):
                owner.add_module(atom, nn.Module())
            owner = getattr(owner, atom)
        value = operator.attrgetter(target)(gm)  # a dotted path, looked up attribute by attribute
        if isinstance(value, nn.Module):
            owner.add_module(leaf, value)
        elif isinstance(value, torch.Tensor):
            owner.register_buffer(leaf, value)
        else:
            setattr(owner, leaf, value)
    graph = fx.Graph()
    mapped: dict[fx.Node, Any] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, node in enumerate(placeholders):
        if i in tensors:
            mapped[node] = graph.placeholder(node.name)
        elif isinstance(args[i], torch.Tensor):
            root.register_buffer(f"_weight{i}", args[i].detach())
            mapped[node] = graph.get_attr(f"_weight{i}")
        else:
            mapped[node] = args[i]
    graph.output(graph.graph_copy(gm.graph, mapped))
    return fx.GraphModule(root, graph, class_name=name)


def weights_written(gm: fx.GraphModule, weights: Sequence[int]) -> tuple[str, ...]:
    """The weights (parameters, buffers) whose memory an in-place call of ``gm`` writes, itself or
    through a view, told by the storages of the fake tensors Dynamo recorded; by placeholder name."""
    from torch.multiprocessing.reductions import StorageWeakRef

    from opsched.frontends.torch_fx import mutated_by

    def storage(n: fx.Node) -> StorageWeakRef | None:
        value = n.meta.get("example_value")
        if not isinstance(value, torch.Tensor):
            return None
        return StorageWeakRef(value.untyped_storage())  # type: ignore[no-untyped-call]  # torch's, unannotated

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    held = {s: p.name for i, p in enumerate(placeholders) if i in weights and (s := storage(p)) is not None}
    written = [held[s] for n in gm.graph.nodes if (m := mutated_by(n, gm)) is not None
               and (s := storage(m)) is not None and s in held]
    return tuple(dict.fromkeys(written))

"""What the call and the return structures share: a graph value's place among a tree's leaves,
and pickling a tree spec as plain data."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection, Mapping, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

#: A call, bound: its positional and keyword arguments.
Call = tuple[tuple[Any, ...], dict[str, Any]]


class Pickled:
    """Pickles a structure's ``spec`` as plain data: torch 2.13 warns on every leaf of a pickled
    tree spec when it is loaded (its ``LeafSpec`` is deprecated)."""

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["spec"] = _spec_state(state["spec"])
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, spec=_spec_from_state(state["spec"]))


def _spec_state(spec: pytree.TreeSpec) -> Any:
    return None if spec.is_leaf() else (spec.type, spec.context, [_spec_state(c) for c in spec.children()])


def _spec_from_state(state: Any) -> pytree.TreeSpec:
    if state is None:
        return pytree.tree_structure(0)  # the leaf
    kind, context, children = state
    return pytree.TreeSpec(kind, context, [_spec_from_state(c) for c in children])


def canonical_order(spec: pytree.TreeSpec) -> list[int]:
    """The positions of ``spec``'s leaves, in the order in which a model's output is numbered the
    same however it was made: a Hugging Face ``ModelOutput`` (a dataclass that is a mapping) holds
    its fields in the order the model set them, and a model may set them in another order while
    traced (Mistral3's vision output sets its pooled features before its hidden states when
    compiling, after them when eager), so its children count in the order of its class's fields.
    Every other node keeps its own order."""
    if spec.is_leaf():
        return [0]
    blocks, start = [], 0
    for child in spec.children():
        blocks.append([start + k for k in canonical_order(child)])
        start += child.num_leaves
    kind = spec.type
    if isinstance(kind, type) and dataclasses.is_dataclass(kind) and issubclass(kind, Mapping) and \
            isinstance(spec.context, list):
        rank = {f.name: k for k, f in enumerate(dataclasses.fields(kind))}
        keyed = sorted(zip(spec.context, blocks), key=lambda item: rank.get(item[0], len(rank)))
        blocks = [block for _, block in keyed]
    return [k for block in blocks for k in block]


def leaf_slots(leaves: Sequence[Any], fixed: Collection[int] = ()
               ) -> tuple[tuple[int | None, ...], tuple[Any, ...]]:
    """Per leaf, the graph value it is (tensors, numbered in order) or None, and the leaf itself
    where it is not a tensor (None where it is); a tensor numbered in ``fixed`` is a value too,
    copied (the graph is specialised to its values, which the caller may change later)."""
    numbers = itertools.count()
    value = [not isinstance(x, torch.Tensor) or k in fixed for k, x in enumerate(leaves)]
    slots = tuple(None if v else next(numbers) for v in value)
    return slots, tuple((x.detach().clone() if isinstance(x, torch.Tensor) else x) if v else None
                        for x, v in zip(leaves, value))

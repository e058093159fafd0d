"""What the call and the return structures share: a graph value's place among a tree's leaves,
and pickling a tree spec as plain data."""

from __future__ import annotations

import itertools
from collections.abc import Collection, Sequence
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

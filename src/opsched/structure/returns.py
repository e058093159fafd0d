"""What a model returns: the structure around a graph's flat outputs, and what of its arguments
the model hands back.

A graph returns a flat list of tensors; a model returns tuples, dicts or dataclass outputs.
:class:`OutputStructure` maps the graph's outputs back onto what the model returns, handing back
the caller's own tensors and objects where the model returns what it was given.
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from opsched.structure.trees import Call, Pickled, canonical_order, leaf_slots

__all__ = ["OutputStructure"]

log = logging.getLogger("opsched")

#: Mappings of an output, each where it is and its keys in order.
Ordered = tuple[tuple[pytree.KeyPath, tuple[Any, ...]], ...]


@dataclass(frozen=True)
class OutputStructure(Pickled):
    """How a model's outputs nest (tuples, lists, dicts, dataclass outputs: its pytree), which of
    its leaves are the graph's outputs, in order, and what the others are (constants such as None).

    What the model hands back of what it was given is the caller's own: ``passed`` lists the
    graph outputs that are input tensors themselves (``x.mul_(2); return x``), and ``returned`` the
    arguments the model returns as themselves, changed (a Hugging Face decoder called with
    ``past_key_values=cache`` appends to that cache and returns it). The graph computes the new
    contents; :meth:`build` returns the caller's tensor (its new value already written into it)
    and the caller's object, its contents replaced by the rebuilt one's, so that a loop which
    keeps passing one cache sees it grow or fill as it does in eager."""

    spec: pytree.TreeSpec
    slots: tuple[int | None, ...]  # per leaf: the graph output it is, or None for a constant
    constants: tuple[Any, ...]     # per leaf: the constant (None where the leaf is a graph output)
    passed: tuple[tuple[int, int], ...] = ()  # (graph output, graph input it is)
    returned: tuple[tuple[pytree.KeyPath, pytree.KeyPath], ...] = ()  # (where in the output, where in the call)
    ordered: Ordered = ()  # (where in the output, the keys of a mapping there in the model's order)

    @classmethod
    def of(cls, example: Any, call: Call | None = None, inputs: Sequence[torch.Tensor] = ()) -> OutputStructure:
        """The structure of a model's output ``example`` (its tensors are the graph's outputs).
        Where it came from ``call`` (canonical, as :meth:`InputStructure.call` makes it) whose
        tensors are ``inputs``, what it hands back of them is noted."""
        leaves, spec = pytree.tree_flatten(example)
        order = canonical_order(spec)  # the graph's outputs are numbered so, whichever order the trace met
        numbered, held = leaf_slots([leaves[k] for k in order])
        slots: list[int | None] = [None] * len(leaves)
        constants: list[Any] = [None] * len(leaves)
        for k, slot, constant in zip(order, numbered, held):
            slots[k], constants[k] = slot, constant
        given = {id(t): k for k, t in enumerate(inputs)}
        passed = tuple((s, given[id(leaf)]) for leaf, s in zip(leaves, slots) if s is not None and id(leaf) in given)
        return cls(spec, tuple(slots), tuple(constants), passed, _returned(example, call) if call is not None else (),
                   _reordered(example, pytree.tree_unflatten(leaves, spec)))

    @classmethod
    def flat(cls, n: int) -> OutputStructure:
        """One tensor, or (for ``n`` other than 1) a tuple of ``n``: a graph's outputs as they are."""
        dummy = torch.empty(0)
        return cls.of(dummy if n == 1 else tuple(dummy for _ in range(n)))

    @property
    def tensors(self) -> int:
        return sum(s is not None for s in self.slots)

    def build(self, outputs: Sequence[torch.Tensor], inputs: Sequence[torch.Tensor] = (),
              call: Call | None = None) -> Any:
        """What the model returns, from the graph's ``outputs``, handing back the caller's own
        ``inputs`` and arguments (from ``call``, canonical) where the model does."""
        if self.passed and inputs:
            outputs = list(outputs)
            for out, given in self.passed:
                outputs[out] = inputs[given]
        if self._plain is not None:  # one tensor, or a tuple of them in order: no tree to rebuild
            return outputs[0] if self._plain else tuple(outputs)
        leaves = [c if s is None else outputs[s] for s, c in zip(self.slots, self.constants)]
        built = pytree.tree_unflatten(leaves, self.spec)
        for where, keys in self.ordered:
            _in_order(_at(built, where), keys)
        if not self.returned or call is None:
            return built
        theirs = {}
        for where, argument in self.returned:
            rebuilt, original = _at(built, where), _at(call, argument)
            _adopt(original, rebuilt)
            theirs[id(rebuilt)] = original
        leaves, spec = pytree.tree_flatten(built, is_leaf=lambda x: id(x) in theirs)
        return pytree.tree_unflatten([theirs.get(id(x), x) for x in leaves], spec)

    @functools.cached_property
    def _plain(self) -> bool | None:
        """True where the output is the one graph output, False where it is a tuple of every graph
        output in order, None where the tree must be rebuilt (a call costs microseconds less)."""
        in_order = self.slots == tuple(range(len(self.slots))) and not self.returned and not self.ordered
        if in_order and self.spec.is_leaf():
            return True
        if in_order and self.spec.type is tuple and all(c.is_leaf() for c in self.spec.children()):
            return False
        return None


def _returned(output: Any, call: Call) -> tuple[tuple[pytree.KeyPath, pytree.KeyPath], ...]:
    """Where ``output`` holds an argument of ``call`` itself (the outermost such node, where its
    contents can be replaced), and where in the call that argument is."""
    arguments: dict[int, Any] = {}

    def note(node: Any) -> bool:  # visits every node of the call; leaves are tensors and fixed values
        if not pytree.tree_is_leaf(node) and _adoptable(node):
            arguments[id(node)] = node
        return False

    pytree.tree_flatten(call, is_leaf=note)
    arguments.pop(id(call), None)
    for part in call:
        arguments.pop(id(part), None)  # the call's own args tuple and kwargs dict
    if not arguments:
        return ()
    paths = pytree.tree_flatten_with_path(call, is_leaf=lambda x: id(x) in arguments)[0]
    places = {id(node): path for path, node in paths if id(node) in arguments}
    try:
        found = pytree.tree_flatten_with_path(output, is_leaf=lambda x: id(x) in places)[0]
    except ValueError as e:  # a pytree node type registered without key paths
        log.warning("cannot tell whether the model returns any of its arguments as itself (%s): a container it "
                    "returns is rebuilt, not the caller's own", e)
        return ()
    returned = tuple((where, places[id(node)]) for where, node in found if id(node) in places)
    for _, argument in returned:
        log.info("the model returns its argument %s as itself, changed: the module does too", pytree.keystr(argument))
    return returned


def _reordered(output: Any, rebuilt: Any, where: pytree.KeyPath = ()) -> Ordered:
    """Where a mapping of ``output``, ``rebuilt`` from its leaves, holds its keys in another order,
    and the order it had. A Hugging Face ``ModelOutput`` is rebuilt in its fields' order, and a
    model may set a field after the others (InternVL's vision output, its pooled features last):
    ``out[1]``, ``to_tuple()`` and iteration follow the order the model gave."""
    found = []
    if isinstance(output, Mapping) and list(output) != list(rebuilt):
        found.append((where, tuple(output)))
    if pytree.tree_is_leaf(output):
        return tuple(found)
    try:
        children, again = _children(output), _children(rebuilt)
    except ValueError:  # a node type registered without key paths: as rebuilt
        return tuple(found)
    for key, child in children.items():
        found += _reordered(child, again[key], (*where, key))
    return tuple(found)


def _children(node: Any) -> dict[Any, Any]:
    """A pytree node's children by their keys."""
    def below(x: Any) -> bool:
        return x is not node
    return {path[0]: child for path, child in pytree.tree_flatten_with_path(node, is_leaf=below)[0]}


def _in_order(node: Any, keys: tuple[Any, ...]) -> None:
    """Put ``node``'s keys in the order ``keys`` (past a subclass's guards: a ModelOutput refuses
    deletion)."""
    if isinstance(node, OrderedDict):
        for key in keys:
            OrderedDict.move_to_end(node, key)
    else:
        items = [(key, node[key]) for key in keys]
        dict.clear(node)
        dict.update(node, items)


def _adoptable(node: Any) -> bool:
    """Whether a container's contents can be replaced in place: lists, dicts, objects with attributes."""
    return isinstance(node, (list, dict)) or hasattr(node, "__dict__")


def _adopt(original: Any, rebuilt: Any) -> None:
    """Give ``original`` the contents of ``rebuilt``, a new object of its type."""
    if isinstance(original, list):
        original[:] = rebuilt
    if isinstance(original, dict):
        dict.clear(original)  # past a subclass's guards (a ModelOutput refuses deletion)
        dict.update(original, rebuilt)
    if hasattr(original, "__dict__"):
        vars(original).clear()
        vars(original).update(vars(rebuilt))


def _at(tree: Any, path: pytree.KeyPath) -> Any:
    for key in path:
        tree = key.get(tree)
    return tree

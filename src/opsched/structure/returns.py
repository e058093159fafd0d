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
    keeps passing one cache sees it grow or fill as it does in eager.

    What the model returns as views shares memory as it does in eager: ``views`` lists the graph
    outputs that are views of an input (``x.view(-1)``: the caller's tensor, seen so) and those
    that are views of another output (DINOv2's ``pooler_output``, ``last_hidden_state[:, 0]``), so
    that a change made in place to one afterwards (code between the graphs ``torch.compile``
    captures writes into a tensor one of them returned) shows in the other, as in eager."""

    spec: pytree.TreeSpec
    slots: tuple[int | None, ...]  # per leaf: the graph output it is, or None for a constant
    constants: tuple[Any, ...]     # per leaf: the constant (None where the leaf is a graph output)
    passed: tuple[tuple[int, int], ...] = ()  # (graph output, graph input it is)
    returned: tuple[tuple[pytree.KeyPath, pytree.KeyPath], ...] = ()  # (where in the output, where in the call)
    ordered: Ordered = ()  # (where in the output, the keys of a mapping there in the model's order)
    views: tuple[View, ...] = ()  # graph outputs that view an input's or another output's memory

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
        outputs = {s: leaf for leaf, s in zip(leaves, slots) if s is not None}
        return cls(spec, tuple(slots), tuple(constants), passed, _returned(example, call) if call is not None else (),
                   _reordered(example, pytree.tree_unflatten(leaves, spec)),
                   _views([outputs[s] for s in range(len(outputs))], inputs, {s for s, _ in passed}))

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
        if self.views:
            outputs = list(outputs)
            for v in self.views:
                if v.of_input and not inputs:  # no caller's tensors to view: the module's own, of their values
                    continue
                made = v.made(inputs[v.base] if v.of_input else outputs[v.base])
                if made is not None:
                    base, outputs[v.output] = made
                    if not v.of_input:
                        outputs[v.base] = base
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


@dataclass(frozen=True)
class View:
    """Graph output ``output`` as the model returns it: ``size`` and ``stride`` over the memory of
    ``base`` (a graph input where ``of_input``, else another graph output), ``offset`` elements
    past where ``base`` starts in it; ``base_size`` and ``base_stride`` are what the view was
    taken of. A module's output laid out otherwise is laid out so first; a caller's input laid
    out otherwise (a transposed tensor of the example's shape) is not the model's memory to
    view: the output is then the module's own tensor, of the same values."""

    output: int
    base: int
    of_input: bool
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    base_size: tuple[int, ...]
    base_stride: tuple[int, ...]

    def made(self, base: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The base, laid out as the model's (a module's output copied so where it is not), and
        the view of it as the model took it; None for a caller's input laid out otherwise."""
        if tuple(base.shape) != self.base_size or base.stride() != self.base_stride:
            if self.of_input:
                return None
            base = torch.empty_strided(self.base_size, self.base_stride, dtype=base.dtype,
                                       device=base.device).copy_(base)
        return base, base.as_strided(self.size, self.stride, base.storage_offset() + self.offset)


def _views(outputs: Sequence[Any], inputs: Sequence[torch.Tensor], passed: set[int]) -> tuple[View, ...]:
    """Which of the model's ``outputs`` (per graph output, as returned on ``inputs``) view the
    memory of an input, or of another output whose elements cover theirs, the widest such (the
    first of equals): :attr:`OutputStructure.views`, those of inputs first. An output whose
    elements lie outside every other's (two slices of a tensor the model does not return) is left
    a tensor of its own."""
    def storage(t: torch.Tensor) -> int:
        return t.untyped_storage().data_ptr()

    def span(t: torch.Tensor) -> tuple[int, int]:  # the elements it reaches, from its storage's start
        first = int(t.storage_offset())
        return first, first + sum((int(n) - 1) * int(st) for n, st in zip(t.shape, t.stride()))

    def within(t: torch.Tensor, base: torch.Tensor) -> bool:
        (a, b), (lo, hi) = span(t), span(base)
        return storage(t) == storage(base) and lo <= a and b <= hi

    def width(t: torch.Tensor) -> int:
        lo, hi = span(t)
        return hi - lo

    def layout(t: torch.Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return tuple(map(int, t.shape)), tuple(map(int, t.stride()))

    tensors = {k: t for k, t in enumerate(outputs) if isinstance(t, torch.Tensor) and t.numel() and k not in passed}
    of_inputs, of_outputs = [], []
    for k, out in tensors.items():
        of = next((j for j, t in enumerate(inputs) if t.numel() and within(out, t)), None)
        if of is not None:
            of_inputs.append(View(k, of, True, *layout(out), int(out.storage_offset() - inputs[of].storage_offset()),
                                  *layout(inputs[of])))
            continue
        covering = [j for j, t in tensors.items() if j != k and within(out, t)]
        base = min(covering, key=lambda j: (-width(tensors[j]), j), default=None)
        if base is not None and (width(tensors[base]), -base) > (width(out), -k):
            b = tensors[base]
            of_outputs.append(View(k, base, False, *layout(out), int(out.storage_offset() - b.storage_offset()),
                                   *layout(b)))
    return (*of_inputs, *of_outputs)


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

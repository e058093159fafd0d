"""How a model is called: the structure around a graph's flat inputs.

A graph takes a flat list of tensors. A model is called with positional and keyword arguments
(``model(**tokenizer(text, return_tensors="pt"))``), some of them containers of tensors, some
fixed values (``None``, a flag). :class:`InputStructure` maps a call onto the graph's inputs.
"""

from __future__ import annotations

import functools
import inspect
import keyword
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

from opsched._text import not_a_tensor, value_name
from opsched.errors import FrontendError, InputMismatchError
from opsched.structure.fixed import FixedInput
from opsched.structure.shown import Named, cache_hint, describe_call, short, values
from opsched.structure.trees import Call, Pickled, leaf_slots

__all__ = ["InputStructure", "ExampleInputs", "bind_example", "split_example"]

log = logging.getLogger("opsched")

#: What a user gives as example inputs: one tensor, the positional arguments, or the keyword
#: arguments (a tokenizer's output, say).
ExampleInputs = torch.Tensor | Sequence[Any] | Mapping[str, Any]


@dataclass(frozen=True)
class InputStructure(Pickled):
    """How a model is called: its arguments bound to the parameters of its ``forward`` (so that a
    tensor given by position or by name is the same input), the tensors among their leaves being
    the graph's inputs, in order, and every other leaf a value the graph was specialised to:
    a non-tensor argument, or a tensor named in ``fixed`` (a vision tower's ``grid_thw``, whose
    values set its sizes), which a call must then pass with the same values.

    Arguments are kept in a canonical form: bound to the signature, positional where they can
    be, and left out where a non-tensor one equals its parameter's default (``attention_mask=None``
    is the call without it)."""

    signature: inspect.Signature | None  # None: positional arguments only
    spec: pytree.TreeSpec                 # of the canonical ``(args, kwargs)``
    slots: tuple[int | None, ...]         # per leaf: the graph input it is, or None for a fixed value
    constants: tuple[Any, ...]            # per leaf: the fixed value (None where the leaf is a tensor)
    places: tuple[str, ...]               # per leaf: where it sits in the call (``input_ids``, ``xs[1]``)

    @classmethod
    def of(cls, forward: Callable[..., Any], example: ExampleInputs, fixed: Collection[str] = ()) -> InputStructure:
        """The structure of calling ``forward`` with ``example``: one tensor, a sequence of
        positional arguments or a mapping of keyword arguments; the tensors that ``fixed`` names
        (an argument, or a place within one: ``"grid_thw"``, ``"xs[1]"``) are values of the call."""
        try:
            signature: inspect.Signature | None = inspect.signature(forward)
        except (TypeError, ValueError):  # a builtin or an extension's forward: positional only
            signature = None
        args, kwargs = split_example(example)
        try:
            structure = cls._of(signature, *_canonical(signature, args, kwargs), fixed=fixed)
        except TypeError as e:  # the signature refuses the example
            shown = describe_call(pytree.tree_flatten((args, kwargs))[1], pytree.tree_leaves((args, kwargs)))
            where = getattr(forward, "__qualname__", "forward")
            raise FrontendError(f"{where}{signature or '(...)'} cannot be called as {shown} with the example "
                                f"inputs: {e}") from None
        if unmatched := [f for f in fixed if not any(_within(place, f) for place in structure.fixed_places)]:
            tensors = ", ".join(repr(p) for p, s in zip(structure.places, structure.slots) if s is not None)
            raise InputMismatchError(f"fixed_values names {', '.join(map(repr, unmatched))}, which the example call "
                                     f"does not pass as a tensor; its tensors are {tensors or 'none'}")
        return structure

    @classmethod
    def positional(cls, names: Sequence[str], fixed: Sequence[FixedInput] = ()) -> InputStructure:
        """A graph's own inputs, by position or (where every name is a Python identifier, as ONNX
        Runtime's feeds are keyed) by name; and the model's inputs ``fixed`` at a value, which a
        call may pass too, by name, or by position where they follow every input it must pass
        (:class:`FixedInput`)."""
        signature = None
        every = [*names, *(f.name for f in fixed)]
        if all(n.isidentifier() and not keyword.iskeyword(n) for n in every) and len(set(every)) == len(every):
            signature = _signature(names, fixed)
        example = tuple(torch.empty(0) for _ in names)
        return cls._of(signature, example, {})

    @classmethod
    def _of(cls, signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any],
            fixed: Collection[str] = ()) -> InputStructure:
        paths, spec = pytree.tree_flatten_with_path((args, kwargs))
        places = tuple(_place(path, signature) for path, _ in paths)
        held = [k for k, place in enumerate(places) if any(_within(place, f) for f in fixed)]
        slots, constants = leaf_slots([leaf for _, leaf in paths], held)
        return cls(signature, spec, slots, constants, places)

    @functools.cached_property
    def fixed(self) -> tuple[int, ...]:
        """The leaves that are tensors the graph is specialised to (fixed values), by number."""
        return tuple(k for k, c in enumerate(self.constants) if isinstance(c, torch.Tensor))

    @functools.cached_property
    def fixed_places(self) -> tuple[str, ...]:
        """Where each fixed tensor sits in the call."""
        return tuple(self.places[k] for k in self.fixed)

    def inputs_within(self, names: Collection[str]) -> tuple[int, ...]:
        """The graph inputs (by number) at or within the places ``names`` name (``fixed`` does)."""
        return tuple(k for k, place in enumerate(self.names) if any(_within(place, f) for f in names))

    @functools.cached_property
    def names(self) -> tuple[str, ...]:
        """Per graph input, where it sits in the call."""
        return tuple(p for p, s in zip(self.places, self.slots) if s is not None)

    @functools.cached_property
    def plain(self) -> bool:
        """Whether the call is the graph's inputs as positional tensors and nothing else."""
        return self.spec == pytree.tree_flatten((tuple(range(len(self.names))), {}))[1]

    @functools.cached_property
    def _arguments(self) -> tuple[int, tuple[str, ...]] | None:
        """Where every leaf is a whole argument of the canonical call: how many are positional,
        and each one's parameter; None where some argument nests (a tuple of tensors) or a
        positional one has no name of its own (``*args``)."""
        if self.signature is None:
            return None
        args_spec, kwargs_spec = self.spec.children()
        if not all(c.is_leaf() for c in (*args_spec.children(), *kwargs_spec.children())):
            return None
        params = self.signature.parameters.values()
        named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if args_spec.num_children > len(named):
            return None
        return args_spec.num_children, (*named[:args_spec.num_children], *kwargs_spec.context)

    def _direct(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[Any] | None:
        """The call's leaves in canonical order where it passes exactly the canonical call's
        arguments, positionally up to where that call does, and any input fixed at a value
        (:class:`FixedInput`) with that value (a dictionary lookup each, against microseconds
        to bind a signature); None where it must be bound to know."""
        known = self._arguments
        if known is None:
            return None
        if self._fixed_inputs and (len(args) > known[0] or not kwargs.keys().isdisjoint(self._fixed_inputs)):
            trailing = args[known[0]:]
            if len(trailing) > len(self._positional_fixed) or any(
                    fixed.name in kwargs or not fixed.holds(v) for fixed, v in zip(self._positional_fixed, trailing)):
                return None
            named = {k: v for k, v in kwargs.items() if k not in self._fixed_inputs}
            if any(not self._fixed_inputs[k].holds(v) for k, v in kwargs.items() if k not in named):
                return None
            args, kwargs = args[:known[0]], named
        if len(args) > known[0] or len(args) + len(kwargs) != len(known[1]):
            return None
        leaves = list(args)
        for name in known[1][len(args):]:
            if name not in kwargs:
                return None
            leaves.append(kwargs[name])
        for leaf, slot, constant in zip(leaves, self.slots, self.constants):
            if not isinstance(leaf, torch.Tensor) if slot is not None else not _holds(leaf, constant):
                return None
        return leaves

    @functools.cached_property
    def _fixed_inputs(self) -> dict[str, FixedInput]:
        """The inputs fixed at a value a call may pass, by parameter name."""
        params = () if self.signature is None else self.signature.parameters.values()
        return {p.name: p.default for p in params if isinstance(p.default, FixedInput)}

    @functools.cached_property
    def _positional_fixed(self) -> tuple[FixedInput, ...]:
        """Those a call may pass by position, in order, after the canonical call's arguments."""
        params = () if self.signature is None else self.signature.parameters.values()
        return tuple(p.default for p in params
                     if isinstance(p.default, FixedInput) and p.kind == p.POSITIONAL_OR_KEYWORD)

    def tensors(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
        """The graph's inputs in a call with ``args`` and ``kwargs``; raises
        :class:`InputMismatchError` where the call is not one the graph was made for."""
        if self.plain and not kwargs and len(args) == len(self.names):
            return tuple(args)  # the common case, at no cost: the graph checks the tensors
        direct = self._direct(args, kwargs)
        if direct is not None:
            return tuple(leaf for leaf, slot in zip(direct, self.slots) if slot is not None)
        kwargs = self._respelled(kwargs)
        try:
            leaves, spec = pytree.tree_flatten(_canonical(self.signature, tuple(args), dict(kwargs)))
        except TypeError as e:  # the signature refuses the call
            raise InputMismatchError(f"this module is called as {self.describe()}: {e}") from None
        if spec != self.spec:
            self._refuse_other_values(args, kwargs)
            raise InputMismatchError(f"this module is called as {self.describe()}, got "
                                     f"{describe_call(spec, leaves)}{self._difference(spec, leaves)}: the model was "
                                     f"traced for that call; optimize again with example inputs of the new form")
        for leaf, slot, constant, place in zip(leaves, self.slots, self.constants, self.places):
            if slot is None and not _holds(leaf, constant):
                if isinstance(constant, torch.Tensor):
                    raise InputMismatchError(f"input {place!r} is fixed to {values(constant)} (fixed_values=), and "
                                             f"this module computes for those values alone; got {values(leaf)}: "
                                             f"optimize again with example inputs that pass it")
                raise InputMismatchError(f"argument {place} was {constant!r} when the model was traced, and this "
                                         f"module computes what it computed then; got {short(leaf)}: optimize "
                                         f"again with example inputs that pass it")
            if slot is not None and not isinstance(leaf, torch.Tensor):
                raise InputMismatchError(f"input {place!r} must be a tensor, {not_a_tensor(leaf)}")
        return tuple(leaf for leaf, slot in zip(leaves, self.slots) if slot is not None)

    def _refuse_other_values(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raises where a call passes an input the graph was made for one value of
        (:class:`FixedInput`) with another."""
        if not self._fixed_inputs:
            return
        assert self.signature is not None  # it holds them
        for name, value in self.signature.bind(*args, **kwargs).arguments.items():
            fixed = self._fixed_inputs.get(name)
            if fixed is not None and not fixed.holds(value):
                raise InputMismatchError(
                    f"input {name!r} was fixed at {values(fixed.value)} where the graph was made (input_values=), "
                    f"and this module computes for that value alone; got {values(value)}: make a module for that "
                    f"value from from_onnx(path, input_values={{{name!r}: ...}}) (or opsched optimize FILE "
                    f"--input-value {name}=...)")

    def canonical(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Call:
        """A call as :meth:`call` makes it (bound to the signature, defaults left out), where
        :meth:`tensors` has accepted it."""
        return _canonical(self.signature, tuple(args), dict(self._respelled(kwargs)))

    def _respelled(self, kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
        """``kwargs`` with each name the signature lacks but takes as a graph value's name
        (:func:`~opsched._text.value_name`) renamed: a module made from an ONNX file is called
        with the file's own names too, as ONNX Runtime's feeds (``input.1`` for ``input_1``)."""
        if self.signature is None or all(k in self.signature.parameters for k in kwargs):
            return kwargs
        params = self.signature.parameters
        renamed = {value_name(k) if k not in params and value_name(k) in params else k: v for k, v in kwargs.items()}
        return renamed if len(renamed) == len(kwargs) else kwargs  # two names made one: binding refuses them

    def _difference(self, spec: pytree.TreeSpec, leaves: list[Any]) -> str:
        """The parameters one call passes and the other leaves at their defaults, for messages."""
        if self.signature is None:
            return ""
        args, kwargs = self.call([Named(n) for n in self.names])
        mine = self.signature.bind(*args, **kwargs).arguments
        args, kwargs = pytree.tree_unflatten(leaves, spec)
        theirs = self.signature.bind(*args, **kwargs).arguments
        parts = [f"{name} is left at its default, traced as {short(mine[name])}" if name in mine else
                 f"{name} is given, left at its default when traced" for name in self.signature.parameters
                 if (name in mine) != (name in theirs)]
        parts += self._reshaped(spec)
        return f" ({'; '.join(parts)})" if parts else ""

    def _reshaped(self, spec: pytree.TreeSpec) -> list[str]:
        """The arguments both calls pass that nest otherwise in ``spec``, for messages (a Hugging
        Face cache holds no tensors until a call of the model fills it)."""
        assert self.signature is not None
        (mine_args, mine_kwargs), (their_args, their_kwargs) = self.spec.children(), spec.children()
        params = self.signature.parameters.values()
        named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        pairs = [(named[k] if k < len(named) else f"args[{k}]", a, b)
                 for k, (a, b) in enumerate(zip(mine_args.children(), their_args.children()))]
        theirs = dict(zip(their_kwargs.context, their_kwargs.children()))
        pairs += [(name, a, theirs[name]) for name, a in zip(mine_kwargs.context, mine_kwargs.children())
                  if name in theirs]
        return [f"{name} holds {b.num_leaves} values, {a.num_leaves} when traced{cache_hint(b)}"
                if a.num_leaves != b.num_leaves else f"{name} nests otherwise than when traced"
                for name, a, b in pairs if a != b]

    def call(self, tensors: Sequence[Any]) -> Call:
        """The positional and keyword arguments of the call whose graph inputs are ``tensors``."""
        args, kwargs = pytree.tree_unflatten(self._leaves(tensors), self.spec)
        return tuple(args), dict(kwargs)

    def describe(self) -> str:
        """The call's form, for messages, its tensors by name: ``forward(ids, mask, return_dict=False)``;
        an input fixed at a value with it (``forward(x, sr=16000)``: :class:`FixedInput`)."""
        args, kwargs = pytree.tree_unflatten(self._leaves([Named(n) for n in self.names]), self.spec)
        kwargs = {**kwargs, **self._fixed_inputs}
        leaves, spec = pytree.tree_flatten((tuple(args), kwargs))
        return describe_call(spec, leaves)

    def _leaves(self, tensors: Sequence[Any]) -> list[Any]:
        return [c if s is None else tensors[s] for s, c in zip(self.slots, self.constants)]


def bind_example(forward: Callable[..., Any], example: ExampleInputs, fixed: Collection[str] = ()
                 ) -> tuple[InputStructure, tuple[torch.Tensor, ...]]:
    """The structure of calling ``forward`` with ``example`` (:meth:`InputStructure.of`, ``fixed``
    its), and the example's tensors: the graph's inputs, each a copy where it shares memory with
    an earlier one (:func:`_unaliased`)."""
    structure = InputStructure.of(forward, example, fixed)
    return structure, _unaliased(structure.tensors(*split_example(example)), structure.names)


def _unaliased(tensors: tuple[torch.Tensor, ...], names: Sequence[str]) -> tuple[torch.Tensor, ...]:
    """``tensors``, each that shares memory with an earlier one copied. A graph follows the path
    its example took, and a model may take another where two inputs are one tensor:
    ``MultiheadAttention(x, x, x)`` asks ``query is key`` and projects once, so a graph traced
    on the one tensor would be wrong for any other three."""
    seen: dict[Any, str] = {}
    out = []
    for name, t in zip(names, tensors):
        try:
            address = t.untyped_storage().data_ptr()
        except (RuntimeError, NotImplementedError):  # a tensor without storage (fake, functional)
            address = 0
        memory: Any = (t.device, address) if address else id(t)
        if memory in seen:
            log.info("example input %r shares memory with %r: traced on a copy, so the graph holds for any inputs",
                     name, seen[memory])
            t = t.clone()
        else:
            seen[memory] = name
        out.append(t)
    return tuple(out)


def split_example(example: ExampleInputs) -> Call:
    """Example inputs as positional and keyword arguments."""
    if isinstance(example, torch.Tensor):
        return (example,), {}
    if isinstance(example, Mapping):
        if not all(isinstance(k, str) for k in example):
            raise InputMismatchError(f"example inputs given as a mapping are keyword arguments: its keys must be "
                                     f"parameter names, got {sorted(map(repr, example))[:5]}")
        return (), dict(example)
    if isinstance(example, (str, bytes)) or not isinstance(example, Sequence):
        raise InputMismatchError(f"example inputs must be a tensor, a sequence of positional arguments or a mapping "
                                 f"of keyword arguments, got {type(example).__name__}")
    return tuple(example), {}


def _canonical(signature: inspect.Signature | None, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Call:
    """``args`` and ``kwargs`` bound to ``signature``: positional where they can be, in the
    parameters' order, non-tensor values equal to their defaults left out (raises TypeError
    where the signature refuses them)."""
    if signature is None:
        if kwargs:
            raise TypeError(f"it takes positional arguments only, got keywords {', '.join(kwargs)}")
        return args, {}
    bound = signature.bind(*args, **kwargs)
    for name, value in list(bound.arguments.items()):
        param = signature.parameters[name]
        if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY) and _same(value, param.default):
            del bound.arguments[name]
    return tuple(bound.args), dict(bound.kwargs)


def _signature(names: Sequence[str], fixed: Sequence[FixedInput]) -> inspect.Signature:
    """A graph's inputs ``names`` as parameters, each a call must pass, among the inputs
    ``fixed`` at values, each a parameter whose default is its value: positional where it
    follows every input a call must pass, else keyword-only (a parameter with a default cannot
    precede one without)."""
    Parameter = inspect.Parameter
    order: list[str | FixedInput] = list(names)
    for f in sorted(fixed, key=lambda f: f.position):
        order.insert(f.position, f)
    last = max((k for k, p in enumerate(order) if isinstance(p, str)), default=-1)
    params = [Parameter(p, Parameter.POSITIONAL_OR_KEYWORD) if isinstance(p, str) else
              Parameter(p.name, Parameter.POSITIONAL_OR_KEYWORD if k > last else Parameter.KEYWORD_ONLY, default=p)
              for k, p in enumerate(order)]
    return inspect.Signature(sorted(params, key=lambda p: p.kind == Parameter.KEYWORD_ONLY))


def _same(value: Any, fixed: Any) -> bool:
    """Whether a non-tensor argument equals a value the graph was specialised to (tensors never
    do), or a fixed input's value (:class:`FixedInput`) is the one given."""
    if value is fixed:
        return True
    if isinstance(fixed, FixedInput):
        return fixed.holds(value)
    if isinstance(value, torch.Tensor) or isinstance(fixed, torch.Tensor) or type(value) is not type(fixed):
        return False
    try:
        return bool(value == fixed)
    except Exception:  # an object whose equality is not a bool
        return False


def _holds(value: Any, fixed: Any) -> bool:
    """Whether an argument equals the value the graph was specialised to: a fixed tensor's
    dtype, shape and every element (read back from its device), or as :func:`_same`."""
    if not isinstance(fixed, torch.Tensor):
        return _same(value, fixed)
    return (isinstance(value, torch.Tensor) and value.dtype == fixed.dtype and value.shape == fixed.shape
            and torch.equal(value.detach().to(fixed.device), fixed))


def _within(place: str, name: str) -> bool:
    """Whether a leaf's ``place`` in a call is ``name``'s, or lies within it (``xs[1]`` in ``xs``)."""
    return place == name or (place.startswith(name) and place[len(name)] in "[.")


def _place(path: tuple[Any, ...], signature: inspect.Signature | None) -> str:
    """A leaf's place in a call: the parameter it is (positional ones by the signature's names),
    then its keys within that argument."""
    where, key, *rest = path  # (args | kwargs, position | name, keys within the argument...)
    if where.idx == 1:
        name = str(key.key)
    else:
        params = [] if signature is None else list(signature.parameters.values())
        named = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        rest_of = next((p.name for p in params if p.kind == p.VAR_POSITIONAL), "args")
        name = named[key.idx] if key.idx < len(named) else f"{rest_of}[{key.idx - len(named)}]"
    return name + "".join(str(k) for k in rest)

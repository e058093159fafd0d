"""Tracing a model with some of its tensor arguments' values fixed (``fixed_values=``).

A vision tower reads its image's grid of patches (``grid_thw.tolist()``, a cumulative sum, a
``torch.arange`` of a count) and sizes its tensors by the numbers: torch.export meets numbers it
cannot know, and refuses. With the grid's values fixed, what the model computes of the grid alone
can be computed for real while it is traced, as Python computes a flag's consequences:

* each fixed tensor is handed to the model as a :class:`FixedValue`, a tensor subclass that
  holds the real tensor;
* a call that reads fixed values and no traced tensor runs on the real tensors, outside the
  trace, and gives fixed values again (numbers read out of them are Python's own);
* a tensor made of Python's values alone (``torch.tensor(lengths)``, ``torch.arange(rows *
  columns)``: :data:`_OF_VALUES`) is a fixed value too, since those numbers may have been read
  out of one;
* a call that mixes them with traced tensors gets the real tensors, which the trace holds as
  constants; one that would write traced values into a fixed value in place (a buffer of zeros
  that an ``index_add_`` fills) is refused, since the real tensor would not hold them.

:class:`FixedValues` does this where torch functions are called (``torch.arange(count)`` takes a
tensor where a number is expected, which reaches no subclass), and
:meth:`FixedValue.__torch_dispatch__` where a fixed value meets PyTorch below them (a number read
in C++). What is left is one static program with the fixed values' consequences as constants: no
number the trace cannot know. :func:`opsched.frontends.export_trace.export_graph` tries this
first, and :func:`torch.export.draft_export` where it fails.

A model's own numbers kept in buffers (:func:`scalar_buffers`: Mimi's convolutions keep their
stride and kernel size as integer tensors and size their padding by them) are inputs of unknown
value to torch.export too; :class:`WithFixedValues` holds them as fixed values while the model
runs, which is how :func:`~opsched.frontends.export_trace.export_graph` traces such a model.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Collection, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import _disable_current_modes

__all__ = ["FixedValue", "FixedValues", "WithFixedValues", "scalar_buffers"]


class FixedValue(torch.Tensor):
    """A fixed tensor argument while the model is traced: a wrapper around its real tensor."""

    held: torch.Tensor  # the real tensor

    @staticmethod
    def __new__(cls, real: torch.Tensor) -> FixedValue:
        made = torch.Tensor._make_wrapper_subclass(cls, real.shape, dtype=real.dtype, device=real.device,
                                                   strides=real.stride(), storage_offset=real.storage_offset())
        made.held = real
        return made

    def __repr__(self) -> str:  # type: ignore[override]
        return f"FixedValue({self.held!r})"

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        return _call(func, args, kwargs or {})

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Sequence[Any] = (),  # type: ignore[override]
                           kwargs: Any = None) -> Any:
        with _disable_current_modes():
            return _fixed(func(*_real(args), **_real(kwargs or {})))


class FixedValues(TorchFunctionMode):
    """Routes every torch function call that reads a :class:`FixedValue` to :func:`_call`, and
    makes a tensor of Python's values (``torch.tensor(lengths)``, of numbers read out of fixed
    values, say) a fixed value too."""

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        leaves = pytree.tree_leaves((args, kwargs))
        if any(isinstance(t, FixedValue) for t in leaves) or \
                (func in _OF_VALUES and not any(isinstance(t, torch.Tensor) for t in leaves)):
            return _call(func, args, kwargs)
        return func(*args, **kwargs)


#: Tensors made of the values given, or of sizes (not ``empty``'s memory, nor random draws): where
#: those are Python's, the tensor is known (``torch.arange(rows * columns)`` of numbers read out of
#: a grid, whose entries a mask then picks).
_OF_VALUES = frozenset({torch.tensor, torch.as_tensor, torch.arange, torch.zeros, torch.ones, torch.full,
                        torch.linspace, torch.eye})


def scalar_buffers(module: nn.Module) -> list[str]:
    """The qualified names of ``module``'s buffers that hold one integer or flag: numbers the model
    keeps as tensors (Mimi's and EnCodec's convolutions keep their stride and kernel size so, and
    size their padding by them), which torch.export sees as inputs of unknown value."""
    return [name for name, b in module.named_buffers()
            if b.dim() == 0 and not (b.is_floating_point() or b.is_complex())]


class WithFixedValues(nn.Module):
    """``inner`` called as it is, but for the leaves of its call numbered in ``fixed``: this
    module takes None there (:attr:`call`), and passes ``inner`` those leaves' fixed values; and
    the buffers of ``inner`` named in ``buffers``, which it holds as fixed values while ``inner``
    runs (their values as they are now: the scheduled module holds the weights it was made with).
    It takes its arguments by ``inner.forward``'s signature, so that torch.export names the
    graph's inputs as it names the model's; its submodule is ``inner``, a prefix the converter
    leaves out of node names (:attr:`ROOT`)."""

    ROOT = "inner."

    def __init__(self, inner: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], fixed: Collection[int],
                 buffers: Collection[str] = ()) -> None:
        super().__init__()
        self.inner = inner
        leaves, self._spec = pytree.tree_flatten((tuple(args), dict(kwargs)))
        self._fixed = {k: FixedValue(leaves[k].detach().clone()) for k in fixed}  # the model may write into them
        args, kwargs = pytree.tree_unflatten([None if k in self._fixed else x for k, x in enumerate(leaves)],
                                             self._spec)
        self.call = (tuple(args), dict(kwargs))
        # read now: while torch.export traces, the module's buffers are its stand-ins of unknown value
        held = [(inner.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2], inner.get_buffer(name))
                for name in buffers]
        self._held_buffers = [(owner, key, FixedValue(real.detach().clone())) for owner, key, real in held]

        def forward(*args: Any, **kwargs: Any) -> Any:
            leaves, spec = pytree.tree_flatten((args, kwargs))
            fixed_in = [self._fixed.get(k, x) for k, x in enumerate(leaves)]
            args, kwargs = pytree.tree_unflatten(fixed_in, spec)
            traced = [(owner, key, owner._buffers[key]) for owner, key, _ in self._held_buffers]
            for owner, key, value in self._held_buffers:
                owner._buffers[key] = value
            try:
                with FixedValues():
                    return _real(self.inner(*args, **kwargs))
            finally:
                for owner, key, stand_in in traced:
                    owner._buffers[key] = stand_in

        forward.__signature__ = inspect.signature(inner.forward)  # type: ignore[attr-defined]
        self.forward = forward


def _call(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """``func`` on fixed values alone: run for real, outside the trace, its tensors fixed values
    again; with traced tensors too, or where it draws random numbers (ViLT's ``multinomial``
    choice of patches, of a mask made in its forward): traced, the fixed values' real tensors as
    constants, so that each call draws anew, as the model's does."""
    reads_traced = any(isinstance(t, torch.Tensor) and not isinstance(t, FixedValue)
                       for t in pytree.tree_leaves((args, kwargs)))
    if reads_traced or _draws(func):
        if _writes(func, args, kwargs):
            raise RuntimeError(f"{getattr(func, '__name__', func)} writes traced values into a fixed value in place, "
                               f"which the trace cannot follow")
        with torch._C.DisableTorchFunctionSubclass():
            return func(*_real(args), **_real(kwargs))
    with torch._C.DisableTorchFunction(), _disable_current_modes():
        return _fixed(func(*_real(args), **_real(kwargs)))


def _draws(func: Any) -> bool:
    """Whether the torch function ``func`` may draw random numbers: an ATen operator of its name
    has an overload that does (``torch.multinomial``, ``Tensor.uniform_``, ``torch.randperm``)."""
    return _draws_named(getattr(func, "__name__", ""))


@functools.cache
def _draws_named(name: str) -> bool:
    """:func:`_draws` by a function's name, looked up once: every call a trace meets asks."""
    packet = getattr(torch.ops.aten, name, None)
    return isinstance(packet, torch._ops.OpOverloadPacket) and any(
        torch.Tag.nondeterministic_seeded in getattr(packet, name).tags
        for name in packet.overloads())  # type: ignore[no-untyped-call]


def _writes(func: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> bool:
    """Whether ``func`` writes into a fixed value: an in-place method (``index_add_``), an item
    assignment, or its ``out=``."""
    name = getattr(func, "__name__", "")
    into = isinstance(args[0], FixedValue) if args else False
    return (into and (name.endswith("_") and not name.startswith("__") or name == "__setitem__")) or \
        isinstance(kwargs.get("out"), FixedValue)


def _real(tree: Any) -> Any:
    return pytree.tree_map_only(FixedValue, lambda t: t.held, tree)


def _fixed(tree: Any) -> Any:
    return pytree.tree_map(lambda t: FixedValue(t) if type(t) is torch.Tensor else t, tree)

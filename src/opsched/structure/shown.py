"""How a call and the values in it are shown in messages: a call's form with its tensors by
name or by shape (``forward(ids, mask, return_dict=False)``), a fixed value by its numbers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree

__all__ = ["Named", "cache_hint", "describe_call", "short", "values"]


@dataclass(frozen=True)
class Named:
    """A tensor in a call's description, shown by its input name."""

    name: str

    def __repr__(self) -> str:
        return self.name


def describe_call(spec: pytree.TreeSpec, leaves: Sequence[Any]) -> str:
    """The call of ``leaves`` in the form ``spec``: ``forward(<tensor 1x16 int64>, mask=None)``."""
    args, kwargs = pytree.tree_unflatten(list(leaves), spec)
    shown = [short(a) for a in args] + [f"{k}={short(v)}" for k, v in kwargs.items()]
    return f"forward({', '.join(shown)})"


def short(value: Any) -> str:
    """A value of a call: a tensor by its shape and dtype, a container by its members."""
    if isinstance(value, torch.Tensor):
        return f"<tensor {'x'.join(map(str, value.shape))} {str(value.dtype).removeprefix('torch.')}>"
    if isinstance(value, (tuple, list)):
        inner = ", ".join(short(v) for v in value)
        return f"({inner})" if isinstance(value, tuple) else f"[{inner}]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k!r}: {short(v)}" for k, v in value.items()) + "}"
    return repr(value)


def values(value: Any) -> str:
    """A fixed tensor's values for messages: every one where they are few, else its form."""
    if isinstance(value, torch.Tensor) and value.numel() <= 16:
        return f"{value.tolist()} ({str(value.dtype).removeprefix('torch.')})"
    return short(value)


def cache_hint(spec: pytree.TreeSpec) -> str:
    """A hint where an argument is a Hugging Face cache, which the model fills on its first call."""
    if not (isinstance(spec.type, type) and spec.type.__name__.endswith("Cache")):
        return ""
    return (f": a {spec.type.__name__} holds its tensors once a call of the model has filled it; trace with one "
            f"as it will be passed (call the model with it once, then cache.reset())")

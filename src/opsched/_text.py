"""Small helpers for messages, reports and names."""

from __future__ import annotations

import re

__all__ = ["count", "first_line", "not_a_tensor", "size", "value_name"]


def count(n: int, noun: str) -> str:
    """``3 lanes``, ``1 lane``: a number and its noun, plural where it must be."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def first_line(e: BaseException) -> str:
    """An exception's first line, at most 300 characters (its type where it says nothing)."""
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def not_a_tensor(value: object) -> str:
    """What a call passed where a tensor belongs, with the way to a tensor from a NumPy array
    (``got ndarray (torch.from_numpy(array) shares its memory)``)."""
    hint = " (torch.from_numpy(array) shares its memory)" if type(value).__module__ == "numpy" else ""
    return f"got {type(value).__name__}{hint}"


def size(nbytes: float) -> str:
    """``12.3 MiB``, ``52.0 KiB``, ``600 B``: a size in bytes, as reports give it (in KiB below a
    MiB, so that a small model's activations do not all read 0.0 MiB)."""
    if nbytes >= 2**20:
        return f"{nbytes / 2**20:.1f} MiB"
    return f"{nbytes / 2**10:.1f} KiB" if nbytes >= 2**10 else f"{nbytes:.0f} B"


_UNSAFE = re.compile(r"[^A-Za-z0-9_]")


def value_name(name: str) -> str:
    """``name`` as a graph value's name: each character other than a letter, a digit or ``_``
    becomes ``_`` (ONNX names such as ``input.1`` or ``serving_default_x:0``)."""
    return _UNSAFE.sub("_", name) or "v"

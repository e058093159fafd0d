"""Small helpers for messages and reports."""

from __future__ import annotations

__all__ = ["count", "mib"]


def count(n: int, noun: str) -> str:
    """``3 lanes``, ``1 lane``: a number and its noun, plural where it must be."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def mib(nbytes: float) -> str:
    """``12.3 MiB``: a size in bytes, as reports give it."""
    return f"{nbytes / 2**20:.1f} MiB"

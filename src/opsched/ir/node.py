"""The frozen IR node."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opsched.ir.types import FrozenAttrs, TensorType

__all__ = ["Node"]


@dataclass(frozen=True)
class Node:
    """One operator application.

    ``inputs`` are names of values (other nodes or graph inputs), in the order the op expects;
    ``params`` are names of parameter tensors kept beside the nodes in :attr:`Graph.params`
    (a convolution's weight then bias). Everything else about a node (its FLOPs, whether it
    can merge, its users) is derived by functions, never stored here.
    """

    name: str
    op: str
    inputs: tuple[str, ...]
    out: TensorType
    attrs: FrozenAttrs = field(default_factory=FrozenAttrs)
    params: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not isinstance(self.attrs, FrozenAttrs):
            object.__setattr__(self, "attrs", FrozenAttrs(self.attrs))
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "params", tuple(self.params))

    def attr(self, key: str, default: Any = None) -> Any:
        return self.attrs.get(key, default)

    def replace(self, **changes: Any) -> Node:
        fields = {f: getattr(self, f) for f in ("name", "op", "inputs", "out", "attrs", "params")}
        fields.update(changes)
        return Node(**fields)

"""In-place calls on tensors that share memory, made functional.

An opsched graph is functional: every value is computed once and never changed. A model is
not: ``y = x.transpose(2, 3); y.relu_()`` changes ``x`` too, through the view, and
``b = a[:, :2]; a.relu_()`` changes ``b``. The frontend converts an in-place call as its
out-of-place form; :class:`Aliases` then gives every tensor the call changed a new value, which
later readers read instead of the old one:

* the tensor the call names: the call's own result;
* the tensor that owns the memory (``x``, ``a``), its *root*: a **write-back** node that
  copies the root and writes the new value into the copy through the same chain of views;
* every other view of that memory that is read later: a **re-view** node that takes its
  chain of views again, from the new root.

What shares memory is read off the recording run (tensors on one storage), so a view is
whatever eager PyTorch made a view on the example inputs (``reshape``, ``contiguous`` and
``nn.Identity`` included). Both kinds of node are opaque: they run the model's own view calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx
import torch.utils._pytree as pytree

from opsched.frontends._common import ConversionContext
from opsched.ir import tensor_type

__all__ = ["Aliases"]

CallableOf = Callable[[torch.fx.Node], tuple[Callable[..., Any], str]]


def _storages(value: Any) -> frozenset[int]:
    """The memory a value's tensors live in (0 is no memory: an empty tensor's)."""
    return frozenset(p for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)
                     for p in (t.untyped_storage().data_ptr(),) if p)


class Aliases:
    """The roots and view chains of a traced program's tensors, and the functional rebinding of
    an in-place call (module docstring). ``observe`` every node in order, then ``rebind`` after
    converting an in-place call."""

    def __init__(self, gm: torch.fx.GraphModule, values: dict[torch.fx.Node, Any], ctx: ConversionContext,
                 callable_of: CallableOf) -> None:
        self.values = values
        self.ctx = ctx
        self.callable_of = callable_of
        self.order = {n: i for i, n in enumerate(gm.graph.nodes)}
        self.root: dict[torch.fx.Node, torch.fx.Node] = {}
        self.parent: dict[torch.fx.Node, torch.fx.Node] = {}  # a view's node -> the node it views
        self.chain: dict[torch.fx.Node, tuple[torch.fx.Node, ...]] = {}  # root -> ... -> node, root excluded
        self.members: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # root -> every node on its memory

    def observe(self, n: torch.fx.Node, mutated: torch.fx.Node | None) -> None:
        """Place ``n`` among the memories: a view of the input whose memory it shares, the same
        tensor as the one it changes in place, or a root of its own."""
        memory = _storages(self.values.get(n))
        if not memory:
            return
        if mutated is not None and mutated in self.root:
            self._join(n, self.root[mutated], self.chain[mutated])
            return
        for a in n.all_input_nodes:
            if a in self.root and memory & _storages(self.values[a]):
                if self.root[a] is a and not isinstance(self.values[a], torch.Tensor):
                    break  # one piece of a multi-result call (sort's values): its own memory
                self.parent[n] = a
                self._join(n, self.root[a], (*self.chain[a], n))
                return
        self._join(n, n, ())

    def _join(self, n: torch.fx.Node, root: torch.fx.Node, chain: tuple[torch.fx.Node, ...]) -> None:
        self.root[n], self.chain[n] = root, chain
        self.members.setdefault(root, []).append(n)

    def rebind(self, n: torch.fx.Node, mutated: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> None:
        """After the in-place call ``n`` on ``mutated`` was converted to ``env[n]``: give
        ``mutated``, its root and its root's other views read after ``n`` their new values."""
        env[mutated] = env[n]
        if mutated not in self.root:
            return
        root = self.root[mutated]
        later = [m for m in self.members[root]
                 if m is not n and m is not mutated and any(self.order[u] > self.order[n] for u in m.users)]
        if not later:
            return
        if self.chain[mutated]:
            env[root] = self._write_back(root, self.chain[mutated], env[root], env[n], n)
        else:
            env[root] = env[n]
        for m in later:
            if m is root:
                continue
            env[m] = env[n] if self.chain[m] == self.chain[mutated] else self._re_view(m, env[root], n)

    def _view(self, chain: tuple[torch.fx.Node, ...], root_value: Any) -> Any:
        """Take the chain of view calls again, from ``root_value``."""
        current = root_value
        for step in chain:
            fn, _ = self.callable_of(step)
            parent = self.parent[step]

            def look(a: torch.fx.Node, parent: torch.fx.Node = parent, current: Any = current) -> Any:
                return current if a is parent else self.values[a]  # other arguments: shapes, indices
            current = fn(*torch.fx.node.map_arg(step.args, look), **torch.fx.node.map_arg(step.kwargs, look))
        return current

    def _write_back(self, root: torch.fx.Node, chain: tuple[torch.fx.Node, ...], root_name: str, new_name: str,
                    call: torch.fx.Node) -> str:
        names = " -> ".join(s.name for s in chain)

        def write_back(root_value: torch.Tensor, new_value: torch.Tensor) -> torch.Tensor:
            copy = root_value.clone()  # strides kept: the view calls make the same views of it
            view = self._view(chain, copy)
            if not isinstance(view, torch.Tensor) or view.untyped_storage().data_ptr() != \
                    copy.untyped_storage().data_ptr():
                raise RuntimeError(f"{names} no longer makes a view of {root.name}, so the in-place "
                                   f"{call.name} cannot be written back into it")
            view.copy_(new_value)
            return copy
        target = f"write-back of {call.name} into {root.name} through {names}"
        write_back.__qualname__ = target
        return self.ctx.add("opaque", [root_name, new_name], name=f"{root.name}_after_{call.name}",
                            out=tensor_type(self.values[root]), fn=write_back, target=target)

    def _re_view(self, m: torch.fx.Node, root_name: str, call: torch.fx.Node) -> Any:
        chain = self.chain[m]
        leaves, spec = pytree.tree_flatten(self.values[m])
        names: list[Any] = []
        for i, leaf in enumerate(leaves):
            if not isinstance(leaf, torch.Tensor):
                names.append(leaf)
                continue

            def re_view(root_value: torch.Tensor, i: int = i) -> torch.Tensor:
                out: torch.Tensor = pytree.tree_leaves(self._view(chain, root_value))[i]
                return out
            suffix = "" if isinstance(self.values[m], torch.Tensor) else f"[{i}]"
            target = f"{m.name}{suffix} again after {call.name}"
            re_view.__qualname__ = target
            names.append(self.ctx.add("opaque", [root_name], name=f"{m.name}{suffix.strip('[]')}_after_{call.name}",
                                      out=tensor_type(leaf), fn=re_view, target=target))
        return pytree.tree_unflatten(names, spec)

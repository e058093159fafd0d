"""In-place calls of a ``torch.export`` program made out of place where no memory is shared.

``torch.export.export`` records a model's in-place calls as they are (``aten.relu_`` of
``nn.ReLU(inplace=True)``, ``aten.add_`` of ``x += residual``), and the ATen-level import takes
functional programs only. :meth:`~torch.export.ExportedProgram.run_decompositions` with an empty
table makes any program functional, views and all, by tracing it again, in more time than the
export itself took: for the 23 of 94 corpus models whose programs write in place, 0.3-3.1 s
against 0.1-3.0 s (``benchmarks/functionalise.py``). 19 of them need it no longer: export and
rewrite take 2.2-3.2x less time than export and retrace (2.7x in geomean).

Most of those writes change a tensor nothing else shares memory with: one a call made fresh (a
convolution's output, a sum), of which no view is ever taken. Such a write is its out-of-place
form, read by every later reader of the tensor, and :func:`made_out_of_place` rewrites it so,
in the program's own graph; a ``detach_`` (of a constant, DeBERTa's), which changes no value
in a graph traced without grad, it drops. A write whose tensor is an input, a weight, an output or a view, or
one of which a view is taken (``shifted[:, 1:] = ids[:, :-1]``, a copy into a slice), changes
what other tensors read through their shared memory; where the program holds any such write,
nothing is rewritten, and functionalisation's retrace does what it must.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

__all__ = ["made_out_of_place"]


def made_out_of_place(program: torch.export.ExportedProgram) -> bool:
    """Rewrite every in-place call of ``program`` (an ATen operator whose schema writes its first
    argument) as its out-of-place form, later readers of the written tensor reading its result,
    and say True; where any write may be seen through shared memory (module docstring), or has
    no out-of-place form, leave the writes as they are and say False (a ``detach_`` is dropped
    either way).

    An in-place call returns the tensor it wrote, so a tensor written twice has three names in
    the graph (what made it and each write): each write's result is read, after it, for all of
    them."""
    graph = program.graph
    dropped = [n for n in graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.detach_.default
               and all(u.op != "output" for u in n.users)]
    for n in dropped:
        n.replace_all_uses_with(n.args[0])  # a write that changes no value (autograd's bookkeeping alone)
        graph.erase_node(n)
    if dropped:
        program.graph_module.recompile()
    order = {n: i for i, n in enumerate(graph.nodes)}
    writes = [n for n in graph.nodes if n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
              and n.target._schema.is_mutable]
    plain = [_out_of_place(n.target) for n in writes]
    names: dict[torch.fx.Node, list[torch.fx.Node]] = {}  # a tensor's maker -> its names, the maker's first
    of: dict[torch.fx.Node, torch.fx.Node] = {}  # a write -> the maker of the tensor it writes
    for n, target in zip(writes, plain, strict=True):
        written = n.args[0] if n.args else None
        if target is None or not isinstance(written, torch.fx.Node):
            return False
        maker = of.get(written, written)
        group = names.setdefault(maker, [maker])
        readers = [u for m in group for u in m.users]
        # an output that reads an earlier name would read this write's result: the program's
        # signature names what its outputs read
        if not _fresh(maker) or any(_shares(u) or u.op == "output" for u in readers):
            return False
        group.append(n)
        of[n] = maker
    for n, target in zip(writes, plain, strict=True):
        n.target = target
        for m in names[of[n]]:
            if m is n:
                break
            for u in [u for u in m.users if order[u] > order[n]]:
                u.replace_input_with(m, n)
    if writes:
        program.graph_module.recompile()
    return True


def _out_of_place(op: torch._ops.OpOverload) -> torch._ops.OpOverload | None:
    """The out-of-place overload of the in-place ``op`` (``aten.add.Tensor`` of
    ``aten.add_.Tensor``): the same arguments, the first written and returned; None where ``op``
    writes another argument, or has no such twin."""
    schema = op._schema
    arguments = schema.arguments
    if not arguments or not _writes(arguments[0]) or any(_writes(a) for a in arguments[1:]) \
            or len(schema.returns) != 1 or not op._overloadpacket.__name__.endswith("_"):
        return None
    packet = getattr(torch.ops.aten, op._overloadpacket.__name__[:-1], None)
    twin = getattr(packet, op._overloadname, None) if packet is not None else None
    if not isinstance(twin, torch._ops.OpOverload) or twin._schema.is_mutable or _aliases(twin) \
            or [a.name for a in twin._schema.arguments] != [a.name for a in arguments]:
        return None
    return twin


def _fresh(tensor: torch.fx.Node) -> bool:
    """Whether ``tensor`` was made in memory of its own: by an ATen call whose results share no
    argument's (or one of several such results)."""
    maker = tensor.args[0] if tensor.target is operator.getitem else tensor
    return isinstance(maker, torch.fx.Node) and maker.op == "call_function" \
        and isinstance(maker.target, torch._ops.OpOverload) and not maker.target._schema.is_mutable \
        and not _aliases(maker.target)


def _shares(reader: torch.fx.Node) -> bool:
    """Whether ``reader`` may make a tensor sharing memory with what it reads: a view (``view``,
    ``transpose``, ``contiguous``, ``to``) or a call that is no ATen operator. A write is not one:
    the tensor it returns is the one it writes, whose own names are checked."""
    if reader.op == "output":
        return False
    if not isinstance(reader.target, torch._ops.OpOverload):
        return True
    return _aliases(reader.target) and not reader.target._schema.is_mutable


def _writes(argument: torch._C.Argument) -> bool:
    return argument.alias_info is not None and argument.alias_info.is_write


def _aliases(op: torch._ops.OpOverload) -> bool:
    """Whether a result of ``op`` may share memory with an argument (a view, ``contiguous``, ``to``)."""
    return any(r.alias_info is not None for r in op._schema.returns)

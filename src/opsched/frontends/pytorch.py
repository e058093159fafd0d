""":func:`from_torch`: a PyTorch module into a graph, by torch.export or, failing that, torch.fx.

torch.export (:mod:`opsched.frontends.torch_export`) sees the ATen operators a module runs:
every one becomes an op of ours or a generic ATen node, nothing is opaque, and in-place calls
are functionalised by PyTorch itself. torch.fx (:mod:`opsched.frontends.torch_fx`) traces
modules torch.export refuses, at the cost of opaque nodes for calls without a converter; it is
also the tracer that keeps ``leaf_modules`` whole.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

import torch
from torch import nn

from opsched.errors import FrontendError, StatefulModelError
from opsched.frontends._common import report_opaque
from opsched.frontends.torch_export import export_graph
from opsched.frontends.torch_fx import fx_graph
from opsched.ir import Graph
from opsched.structure import ExampleInputs, InputStructure, bind_example
from opsched.transforms import canonicalize

__all__ = ["from_torch", "TRACERS", "Tracer"]

Tracer = Literal["auto", "export", "fx"]
TRACERS: tuple[str, ...] = ("auto", "export", "fx")


def from_torch(module: nn.Module, example_inputs: ExampleInputs, *, name: str | None = None,
               leaf_modules: Iterable[type[nn.Module]] = (), canonical: bool = True, tracer: Tracer = "auto") -> Graph:
    """Import ``module`` as a :class:`~opsched.ir.Graph` specialised to ``example_inputs``: one
    tensor, the positional arguments, or a mapping of keyword arguments (a tokenizer's output).
    The graph's inputs are the tensors among them, in the order of ``forward``'s parameters
    (:class:`~opsched.structure.InputStructure`); other arguments (``None``, flags) are fixed.

    ``tracer``: ``"export"`` (torch.export, ATen level), ``"fx"`` (torch.fx) or ``"auto"``:
    torch.export, and torch.fx where torch.export cannot trace the module (an error gives both
    reasons when neither can). ``leaf_modules`` are submodule types to keep whole (opaque)
    instead of tracing into them, the fix for a submodule torch.fx cannot trace; they imply
    torch.fx. With ``canonical`` (default), batch norms are folded and activations fused
    (:func:`opsched.transforms.canonicalize`).
    """
    if tracer not in TRACERS:
        raise FrontendError(f"tracer must be one of {', '.join(TRACERS)}, got {tracer!r}")
    structure, inputs = bind_example(module.forward, example_inputs)
    name = name or type(module).__name__
    leaves = tuple(leaf_modules)
    if leaves and tracer == "export":
        raise FrontendError("leaf_modules are kept whole by torch.fx; torch.export cannot: pass tracer='fx' "
                            "(or 'auto')")
    graph = _trace(module, structure, inputs, name, leaves, "fx" if leaves else tracer).verify()
    if canonical:
        graph = canonicalize(graph)
    report_opaque(graph, f"from_torch({name})")
    return graph


def _trace(module: nn.Module, structure: InputStructure, inputs: tuple[torch.Tensor, ...], name: str,
           leaves: tuple[type[nn.Module], ...], tracer: str) -> Graph:
    if tracer == "fx":
        return _fx(module, structure, inputs, name, leaves)
    try:
        return export_graph(module, *structure.call(inputs), name)
    except FrontendError as export_error:
        if tracer == "export" or isinstance(export_error, StatefulModelError):  # torch.fx would not change that
            raise
        try:
            return _fx(module, structure, inputs, name, leaves)
        except FrontendError as fx_error:  # both reasons, as the type torch.fx's says
            raise type(fx_error)(f"{export_error}; and {fx_error}") from fx_error


def _fx(module: nn.Module, structure: InputStructure, inputs: tuple[torch.Tensor, ...], name: str,
        leaves: tuple[type[nn.Module], ...]) -> Graph:
    if not structure.plain:
        raise FrontendError(f"torch.fx traces {name} called with positional tensors only, not as "
                            f"{structure.describe()}")
    return fx_graph(module, inputs, name, leaves)

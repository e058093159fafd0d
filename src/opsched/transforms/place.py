"""Placement: a graph's parameters on a device, in a precision and a memory layout.

``place(graph, "cuda", dtype="float16", channels_last=True)`` returns the graph an executor on
that device runs: floating parameters cast and moved, the floating value types rewritten (so
the structural hash, and with it every schedule and profile-store entry, is specialised to the
precision), 4-D weights in channels-last layout. Integer and boolean values keep their types.

An ``opaque`` node (a call the frontend had no converter for) keeps running its original
Python callable where the model lives: its inputs are copied back to the model's device and
precision and its output forward again. That is correct but synchronises the host, so a plan
with an opaque node cannot be captured into a CUDA graph (the CUDA executor says so once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from opsched.errors import OpschedError
from opsched.ir import Graph, GraphInput, TensorType

__all__ = ["place", "FLOATING", "PRECISIONS", "dtype_name"]

FLOATING = frozenset({"float32", "float16", "bfloat16", "float64"})
#: The precisions a graph can be placed in, by name.
PRECISIONS: dict[str, torch.dtype] = {"float32": torch.float32, "float16": torch.float16,
                                      "bfloat16": torch.bfloat16, "float64": torch.float64}
_ALIASES = {"fp32": "float32", "fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp64": "float64"}


def dtype_name(dtype: str | torch.dtype) -> str:
    """``torch.float16``, ``"fp16"`` or ``"float16"`` -> ``"float16"``; anything else is refused."""
    name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else _ALIASES.get(dtype, dtype)
    if name not in PRECISIONS:
        raise OpschedError(f"precision {dtype!r} is not supported; expected one of "
                           f"{', '.join(PRECISIONS)} (or fp32, fp16, bf16)")
    return name


def _retype(t: TensorType, dtype: str | None) -> TensorType:
    return TensorType(t.shape, dtype) if dtype is not None and t.dtype in FLOATING else t


def _opaque_bridge(fn: Callable[..., Any], home: torch.device, home_dtypes: tuple[torch.dtype, ...],
                   device: torch.device, out_dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    def bridged(*tensors: torch.Tensor) -> torch.Tensor:
        back = [t.to(home, d) for t, d in zip(tensors, home_dtypes)]
        out: torch.Tensor = fn(*back)
        return out.to(device, out_dtype)
    bridged.__qualname__ = getattr(fn, "__qualname__", "opaque")
    return bridged


def place(graph: Graph, device: str | torch.device = "cpu", dtype: str | torch.dtype | None = None,
          channels_last: bool = False) -> Graph:
    """``graph`` with its parameters on ``device``, in ``dtype`` (floating values only) and, with
    ``channels_last``, with 4-D parameters in channels-last layout. Returns ``graph`` itself when
    nothing changes."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else device
    name = dtype_name(dtype) if dtype is not None else None
    home = next((p.device for p in graph.params.values()), torch.device("cpu"))
    if name is None and not channels_last and device == home:
        return graph

    def move(t: torch.Tensor) -> torch.Tensor:
        target = PRECISIONS[name] if name is not None and t.is_floating_point() else t.dtype
        t = t.to(device, target)
        return t.contiguous(memory_format=torch.channels_last) if channels_last and t.dim() == 4 else t

    try:
        params = {k: move(v) for k, v in graph.params.items()}
    except (RuntimeError, AssertionError) as e:  # no such device, or torch built without it
        raise OpschedError(f"cannot place graph {graph.name!r} on {device}: {e}") from e
    types = graph.types
    callables: dict[str, Callable[..., Any]] = {}
    for node in graph.nodes:
        if node.name in graph.callables:
            fn = graph.callables[node.name]
            if device == home and name is None:
                callables[node.name] = fn
            else:
                ins = tuple(getattr(torch, types[v].dtype) for v in node.inputs)
                out = getattr(torch, _retype(node.out, name).dtype)
                callables[node.name] = _opaque_bridge(fn, home, ins, device, out)
    nodes = tuple(n.replace(out=_retype(n.out, name)) for n in graph.nodes)
    inputs = tuple(GraphInput(i.name, _retype(i.type, name)) for i in graph.inputs)
    return graph.replace(inputs=inputs, nodes=nodes, params=params, callables=callables).verify()

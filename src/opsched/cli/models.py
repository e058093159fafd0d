"""What the CLI accepts as MODEL: a zoo name, an .onnx file, or ``package.module:factory``."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

import torch
from torch import nn

from opsched.errors import OpschedError
from opsched.ir import Graph

__all__ = ["LoadedModel", "load_model"]


@dataclass
class LoadedModel:
    name: str
    graph: Graph
    inputs: tuple[torch.Tensor, ...]
    module: nn.Module | None  # None for ONNX files


def load_model(spec: str, batch: int = 1, input_shape: tuple[int, ...] | None = None) -> LoadedModel:
    from opsched.frontends import from_onnx, from_torch
    from opsched.models import MODELS, example_inputs, get_model

    if spec in MODELS:
        module, inputs = get_model(spec), example_inputs(spec, batch)
        return LoadedModel(spec, from_torch(module, inputs, name=spec), inputs, module)
    if spec.endswith(".onnx"):
        graph = from_onnx(spec)
        gen = torch.Generator().manual_seed(0)
        inputs = tuple(torch.randn(i.type.shape, generator=gen) for i in graph.inputs)
        return LoadedModel(graph.name, graph, inputs, None)
    if ":" in spec:
        mod_name, _, attr = spec.partition(":")
        try:
            factory = getattr(importlib.import_module(mod_name), attr)
        except (ImportError, AttributeError) as e:
            raise OpschedError(f"cannot load {spec!r}: {e}") from None
        module = factory().eval()
        shape = input_shape or getattr(module, "example_input_shape", None)
        if shape is None:
            raise OpschedError(f"{spec}: give the input shape with --input-shape (e.g. 1,3,224,224) or an "
                               f"example_input_shape attribute on the module")
        inputs = (torch.randn(*shape),)
        return LoadedModel(attr, from_torch(module, inputs, name=attr), inputs, module)
    raise OpschedError(f"{spec!r} is not a zoo model ({', '.join(MODELS)}), an .onnx file or package.module:factory")

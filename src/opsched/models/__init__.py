"""The benchmark zoo: the networks of the IOS paper plus common references, as ordinary
``nn.Module``s with seeded random weights, in eval mode, found by name.

>>> from opsched.models import get_model, list_models
>>> "inception_v3" in list_models()
True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from opsched.errors import ModelNotFoundError
from opsched.models._blocks import calibrate, randomize
from opsched.models.googlenet import GoogLeNet
from opsched.models.inception import InceptionV3
from opsched.models.nasnet import NASNetA
from opsched.models.randwire import RandWire
from opsched.models.resnet import ResNet18, ResNet50
from opsched.models.squeezenet import SqueezeNet

__all__ = ["ModelSpec", "MODELS", "get_model", "list_models", "example_inputs", "model_spec"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    factory: Callable[[], nn.Module]
    image_size: int
    description: str

    def input_shape(self, batch: int = 1) -> tuple[int, int, int, int]:
        return (batch, 3, self.image_size, self.image_size)


MODELS: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec("inception_v3", InceptionV3, 299, "Inception V3 (IOS benchmark)"),
    ModelSpec("squeezenet1_0", lambda: SqueezeNet("1_0"), 224, "SqueezeNet 1.0 (IOS benchmark family)"),
    ModelSpec("squeezenet1_1", lambda: SqueezeNet("1_1"), 224, "SqueezeNet 1.1"),
    ModelSpec("randwire_large", RandWire, 224, "RandWire, IOS large configuration: C=154, WS(16|32,4,0.75)"),
    ModelSpec("randwire_small", lambda: RandWire(channels=32, nodes=(8, 8, 8, 8)), 224,
              "RandWire, small: C=32, four WS(8,4,0.75) stages"),
    ModelSpec("nasnet_mobile", NASNetA, 224, "NASNet-A mobile 4@1056"),
    ModelSpec("nasnet_large", lambda: NASNetA(6, 168, 96), 331, "NASNet-A large 6@4032 (IOS benchmark)"),
    ModelSpec("resnet50", ResNet50, 224, "ResNet-50 (reference, little branching)"),
    ModelSpec("resnet18", ResNet18, 224, "ResNet-18 (reference, PartitionTuner's evaluation)"),
    ModelSpec("googlenet", GoogLeNet, 224, "GoogLeNet / Inception v1 (reference)"),
)}


def list_models() -> list[str]:
    return list(MODELS)


def model_spec(name: str) -> ModelSpec:
    try:
        return MODELS[name]
    except KeyError:
        raise ModelNotFoundError(f"no zoo model {name!r}; available: {', '.join(MODELS)}") from None


def get_model(name: str, seed: int = 0) -> nn.Module:
    """A fresh instance of zoo model ``name`` with seeded random weights, in eval mode.

    Batch norms are calibrated on a seeded random image so activations stay near unit scale.
    """
    spec = model_spec(name)
    model = randomize(spec.factory(), seed)
    gen = torch.Generator().manual_seed(seed + 1)
    return calibrate(model, torch.randn(spec.input_shape(1), generator=gen))


def example_inputs(name: str, batch: int = 1, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(model_spec(name).input_shape(batch), generator=gen),)

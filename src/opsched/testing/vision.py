"""Vision models as users bring them: torchvision's and timm's own definitions, whole (no shrunk
configurations), with random weights and no downloads.

These are the models an inter-operator scheduler is for: Inception's and NASNet's branches,
DenseNet's concatenations, HRNet's parallel resolutions, Res2Net's and DPN's split paths,
ResNeSt's and SKNet's split attention, CrossViT's two token streams, next to the plain chains
(VGG, MobileNet) and the vision transformers (ViT, Swin, MaxViT) that give it little to do.
Each entry is a :class:`~opsched.testing.corpus.CorpusModel` named ``torchvision/NAME`` or
``timm/NAME``, at the input size its library gives it (224 pixels for most), its weights random
but made to look trained (no zeroed head; batch-norm statistics of the model's own activations,
away from 0 and 1).

:func:`vision_corpus` lists the models of whichever of the two libraries import. Neither does on
this repository's CPU development machine: the torchvision wheels built for its torch pin are
CUDA builds, whose compiled ops do not load on the CPU build of torch, and timm needs torchvision.
The tests that use it (``tests/test_vision_corpus.py``) then skip; the lent GPU machine's image has
both (``benchmarks/gpu_session.sh``'s ``vision`` stages).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from opsched.testing.corpus import CorpusModel
from opsched.testing.weights import trained_looking

__all__ = ["TIMM", "TORCHVISION", "vision_available", "vision_corpus"]

#: torchvision's models: (builder name, input shape without the batch, slow). Every classifier
#: family once (its smallest member), three segmentation heads and three video models.
TORCHVISION: tuple[tuple[str, tuple[int, ...], bool], ...] = (
    *((name, (3, 224, 224), False) for name in (
        "alexnet", "convnext_tiny", "densenet121", "efficientnet_b0", "efficientnet_v2_s", "googlenet", "maxvit_t",
        "mnasnet0_5", "mobilenet_v2", "mobilenet_v3_small", "regnet_x_400mf", "regnet_y_400mf", "resnet18",
        "resnext50_32x4d", "shufflenet_v2_x0_5", "squeezenet1_1", "swin_t", "swin_v2_t", "vgg11_bn", "vit_b_32",
        "wide_resnet50_2")),
    ("inception_v3", (3, 299, 299), False),
    *((name, (3, 160, 160), False) for name in (
        "fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large")),
    ("r3d_18", (3, 16, 112, 112), False),
    ("r2plus1d_18", (3, 16, 112, 112), False),
    ("mvit_v1_b", (3, 16, 224, 224), True),
)

#: timm's models, at the input size of their pretrained configuration: the branchy families
#: first, then one of each other kind (convolutional, hybrid, attention, MLP), slow ones marked.
TIMM: tuple[tuple[str, bool], ...] = (
    *((name, False) for name in (
        "inception_v4", "inception_resnet_v2", "hrnet_w18_small", "dpn68", "res2net50_14w_8s", "skresnet18", "dla34",
        "resnest14d", "selecsls42b", "vovnet39a", "xception41", "crossvit_tiny_240", "ghostnet_100", "rexnet_100",
        "mixnet_s", "cspresnet50", "cspdarknet53", "repvgg_a0", "nfnet_l0", "regnetz_b16", "efficientformer_l1",
        "levit_128s", "poolformer_s12", "coat_lite_tiny", "mobilevit_xxs", "edgenext_xx_small", "fastvit_t8",
        "tiny_vit_5m_224", "efficientvit_b0", "gcvit_xxtiny", "deit_tiny_patch16_224", "eva02_tiny_patch14_224",
        "caformer_s18", "hgnetv2_b0", "convnext_atto", "mobilenetv4_conv_small", "lcnet_050")),
    ("nasnetalarge", True),
    ("pnasnet5large", True),
)


def _importable(name: str) -> bool:
    """Whether ``name`` imports (torchvision's CUDA wheel is found but fails to load on a CPU torch)."""
    if importlib.util.find_spec(name) is None:
        return False
    try:
        importlib.import_module(name)
    except (ImportError, RuntimeError, OSError):
        return False
    return True


def vision_available() -> bool:
    """Whether torchvision imports (timm's models are listed where timm imports as well)."""
    return _importable("torchvision")


def _image(shape: tuple[int, ...]) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randn(1, *shape),)


def _batch(shape: tuple[int, ...]) -> torch.Tensor:
    """The batch whose activations set a model's batch-norm statistics: two random images."""
    return torch.randn(2, *shape)


def _torchvision(name: str, shape: tuple[int, ...]) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import torchvision

        # weights=None everywhere, the backbone's too: a segmentation model's default backbone is pretrained
        extra: dict[str, Any] = {"weights_backbone": None} if name in _SEGMENTATION else {}
        return trained_looking(torchvision.models.get_model(name, weights=None, **extra), _batch(shape))
    return make


def _timm(name: str, shape: tuple[int, ...]) -> Callable[[], nn.Module]:
    def make() -> nn.Module:
        import timm

        return trained_looking(timm.create_model(name, pretrained=False), _batch(shape))
    return make


_SEGMENTATION = frozenset({"fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"})


def vision_corpus() -> dict[str, CorpusModel]:
    """The models of torchvision and timm that import here, by name (empty where neither does;
    those the installed versions do not have are left out)."""
    entries: list[CorpusModel] = []
    if vision_available():
        import torchvision

        known = set(torchvision.models.list_models())  # an older torchvision lacks the newer models
        entries += [CorpusModel(f"torchvision/{name}", f"torchvision.models.{name}", _torchvision(name, shape),
                                _image(shape), slow) for name, shape, slow in TORCHVISION if name in known]
    if _importable("timm"):
        import timm

        for name, slow in TIMM:
            if not timm.is_model(name):  # an older timm
                continue
            cfg = timm.models.get_pretrained_cfg(name)
            shape = tuple(cfg.input_size) if cfg is not None else (3, 224, 224)
            entries.append(CorpusModel(f"timm/{name}", f"timm.create_model({name!r})", _timm(name, shape),
                                       _image(shape), slow))
    return {e.name: e for e in entries}

"""A corpus of real third-party models: Hugging Face ``transformers`` architectures built from
config objects, with random weights and no downloads.

Nobody here wrote these definitions, so they exercise what the zoo does not: attention, layer
norms, embeddings, ``ModelOutput`` containers, Python control flow, in-place updates through
views, functional batch norms, same-padding convolutions. Configurations are shrunk (fewer,
narrower layers; 64-pixel images; 16 tokens) so that every scheduler x backend check of a model
takes seconds on a CPU; the architecture (its operators and branches) is the library's own.

``transformers`` is an optional dependency (``pip install opsched[test]``);
:func:`corpus` raises :class:`ImportError` naming it when it is missing.
"""

from __future__ import annotations

import io
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    import onnx

__all__ = ["CorpusModel", "corpus", "corpus_available", "export_onnx"]


@dataclass(frozen=True)
class CorpusModel:
    """One corpus entry: ``build()`` gives the model (eval mode, seeded weights) and its inputs."""

    name: str
    architecture: str  #: the ``transformers`` class, e.g. ``"BertModel"``
    make: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    slow: bool = False  #: too slow for every scheduler x backend in CI

    def build(self, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        torch.manual_seed(seed)
        with _quiet():
            model = self.make().eval()
        return model, self.inputs()


def corpus_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def corpus() -> dict[str, CorpusModel]:
    """The corpus, by name (see the module docstring)."""
    try:
        import transformers as hf
    except ImportError as e:
        raise ImportError("the model corpus needs Hugging Face transformers: pip install transformers") from e

    def image(size: int = 64, channels: int = 3) -> Callable[[], tuple[torch.Tensor, ...]]:
        return lambda: (torch.randn(1, channels, size, size),)

    def tokens(n: int = 16, vocab: int = 100) -> Callable[[], tuple[torch.Tensor, ...]]:
        return lambda: (torch.randint(0, vocab, (1, n)),)

    layers: dict[str, Any] = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
    text: dict[str, Any] = {"vocab_size": 100, **layers}
    vision: dict[str, Any] = {"image_size": 64, "patch_size": 16, "hidden_size": 64, **layers}
    labels: dict[str, Any] = {"num_labels": 4}
    every_stage: dict[str, Any] = {"out_features": ["stage1", "stage2", "stage3", "stage4"]}
    stages: dict[str, Any] = {"embedding_size": 16, "hidden_sizes": [16, 32, 64, 128], "depths": [1, 1, 1, 1]}
    entries = [
        CorpusModel("bert", "BertModel", lambda: hf.BertModel(hf.BertConfig(hidden_size=64, **text)), tokens()),
        # position ids from the token ids: a cast and an int32 cumsum that ATen promotes to int64
        CorpusModel("roberta", "RobertaModel", lambda: hf.RobertaModel(hf.RobertaConfig(hidden_size=64, **text)),
                    tokens()),
        CorpusModel("gpt2", "GPT2Model", lambda: hf.GPT2Model(hf.GPT2Config(
            vocab_size=100, n_embd=64, n_layer=2, n_head=4, use_cache=False)), tokens()),
        # a decoder LM as users load them: rotary embeddings computed under no_grad, RMS norms,
        # grouped-query attention, a gated MLP; no key-value cache (the hint torch.export's error gets)
        CorpusModel("llama", "LlamaForCausalLM", lambda: hf.LlamaForCausalLM(hf.LlamaConfig(
            hidden_size=64, num_key_value_heads=2, max_position_embeddings=64, use_cache=False, **text)), tokens()),
        # token mixing by a 2-D Fourier transform: complex intermediates, run on torch kernels
        CorpusModel("fnet", "FNetModel", lambda: hf.FNetModel(hf.FNetConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, intermediate_size=128)), tokens()),
        CorpusModel("vit", "ViTModel", lambda: hf.ViTModel(hf.ViTConfig(**vision)), image()),
        CorpusModel("deit", "DeiTModel", lambda: hf.DeiTModel(hf.DeiTConfig(**vision)), image()),
        CorpusModel("swin", "SwinModel", lambda: hf.SwinModel(hf.SwinConfig(
            image_size=64, patch_size=4, embed_dim=32, depths=[1, 1], num_heads=[2, 4], window_size=4)), image()),
        CorpusModel("convnext", "ConvNextModel", lambda: hf.ConvNextModel(hf.ConvNextConfig(
            hidden_sizes=stages["hidden_sizes"], depths=stages["depths"])), image()),
        CorpusModel("resnet", "ResNetModel", lambda: hf.ResNetModel(hf.ResNetConfig(**stages)), image()),
        CorpusModel("regnet", "RegNetModel", lambda: hf.RegNetModel(hf.RegNetConfig(**stages, groups_width=8)),
                    image()),
        CorpusModel("convnextv2", "ConvNextV2Model", lambda: hf.ConvNextV2Model(hf.ConvNextV2Config(
            hidden_sizes=stages["hidden_sizes"], depths=stages["depths"])), image()),
        CorpusModel("dinov2", "Dinov2Model", lambda: hf.Dinov2Model(hf.Dinov2Config(
            image_size=64, patch_size=16, hidden_size=64, num_hidden_layers=2, num_attention_heads=4)), image()),
        CorpusModel("poolformer", "PoolFormerModel", lambda: hf.PoolFormerModel(hf.PoolFormerConfig(
            depths=stages["depths"], hidden_sizes=stages["hidden_sizes"])), image()),
        # branchy: a pyramid of stages whose outputs are all upsampled and concatenated
        CorpusModel("segformer", "SegformerForSemanticSegmentation",
                    lambda: hf.SegformerForSemanticSegmentation(hf.SegformerConfig(
                        depths=[1, 1, 1, 1], hidden_sizes=stages["hidden_sizes"], num_attention_heads=[1, 2, 4, 8],
                        decoder_hidden_size=64, **labels)), image()),
        CorpusModel("upernet", "UperNetForSemanticSegmentation",
                    lambda: hf.UperNetForSemanticSegmentation(hf.UperNetConfig(
                        backbone_config=hf.ConvNextConfig(hidden_sizes=stages["hidden_sizes"], depths=stages["depths"],
                                                          **every_stage),
                        hidden_size=32, auxiliary_in_channels=64, **labels)), image()),
        CorpusModel("mobilevit", "MobileViTModel", lambda: hf.MobileViTModel(hf.MobileViTConfig(image_size=64)),
                    image()),
        CorpusModel("levit", "LevitModel", lambda: hf.LevitModel(hf.LevitConfig(image_size=64)), image()),
        CorpusModel("mobilenet_v2", "MobileNetV2Model",
                    lambda: hf.MobileNetV2Model(hf.MobileNetV2Config(image_size=64)), image()),
        CorpusModel("efficientnet", "EfficientNetModel",
                    lambda: hf.EfficientNetModel(hf.EfficientNetConfig(image_size=64)), image(), slow=True),
    ]
    return {e.name: e for e in entries}


def export_onnx(model: nn.Module, inputs: tuple[torch.Tensor, ...],
                opset: int | None = None) -> tuple[onnx.ModelProto, str]:
    """``model`` exported as users export it: ``torch.onnx.export`` with its default (dynamo)
    exporter, else the TorchScript one (which some models need: Swin's decompositions fail in
    the first), at the exporter's default opset or ``opset``. Returns the model and which
    exporter made it; raises the last exporter's error."""
    import onnx

    with _quiet():
        try:
            program = torch.onnx.export(model, inputs, dynamo=True, verbose=False, opset_version=opset)
            assert program is not None
            return program.model_proto, "dynamo"
        except Exception:  # noqa: BLE001 (the exporter raises many types; the fallback reports its own)
            buf = io.BytesIO()
            # called with positional inputs only: the TorchScript exporter would fill in every
            # default argument positionally, which Hugging Face forward wrappers refuse
            torch.onnx.export(_Positional(model), inputs, buf, dynamo=False,  # type: ignore[arg-type]  # a file
                              opset_version=opset)
            return onnx.load_model_from_string(buf.getvalue()), "torchscript"


class _Positional(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.model(*inputs)


class _quiet:
    """Silence transformers' construction chatter (random-init notices) for the build only."""

    def __enter__(self) -> None:
        self._level = logging.getLogger("transformers").level
        logging.getLogger("transformers").setLevel(logging.ERROR)
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: Any) -> None:
        self._warnings.__exit__(*exc)
        logging.getLogger("transformers").setLevel(self._level)

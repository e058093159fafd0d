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

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from opsched.testing.export import quiet
from opsched.testing.weights import trained_looking

__all__ = ["CorpusModel", "corpus", "wide_corpus", "corpus_available"]


@dataclass(frozen=True)
class CorpusModel:
    """One corpus entry: ``build()`` gives the model (eval mode, seeded weights) and its inputs."""

    name: str
    architecture: str  #: the ``transformers`` class, e.g. ``"BertModel"``
    make: Callable[[], nn.Module]
    inputs: Callable[[], tuple[torch.Tensor, ...]]
    slow: bool = False  #: too slow for every scheduler x backend in CI

    def build(self, seed: int = 0) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
        """The model, made to look trained (:func:`trained_looking`, its batch norms' statistics
        of a batch of its example inputs and seven more drawn alike), and its example inputs."""
        torch.manual_seed(seed)
        with quiet():
            model = self.make().eval()
        inputs = self.inputs()
        batch = tuple(torch.cat(parts) for parts in zip(inputs, *(self.inputs() for _ in range(CALIBRATION - 1))))
        return trained_looking(model, *batch), inputs


#: The samples whose activations set a corpus model's batch-norm statistics: with two, a new
#: sample's deviation from them compounded through LeViT's residual blocks (its output 6.6e20).
CALIBRATION = 8


def corpus_available() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


def _transformers() -> Any:
    try:
        import transformers
    except ImportError as e:
        raise ImportError("the model corpus needs Hugging Face transformers: pip install transformers") from e
    return transformers


def _image(size: int = 64, channels: int = 3) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randn(1, channels, size, size),)


def _tokens(n: int = 16, vocab: int = 100) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randint(0, vocab, (1, n)),)


def _shaped(*shape: int) -> Callable[[], tuple[torch.Tensor, ...]]:
    return lambda: (torch.randn(*shape),)


#: Every stage of a backbone, for the heads that read them all.
_STAGES = ["stage1", "stage2", "stage3", "stage4"]
#: The shrunk sizes both corpora share: two layers of four heads, 64-pixel images in 16-pixel patches.
_LAYERS: dict[str, Any] = {"num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 128}
_VISION: dict[str, Any] = {"image_size": 64, "patch_size": 16, "hidden_size": 64, **_LAYERS}


def corpus() -> dict[str, CorpusModel]:
    """The corpus, by name (see the module docstring)."""
    hf = _transformers()
    image, tokens, layers, vision = _image, _tokens, _LAYERS, _VISION
    text: dict[str, Any] = {"vocab_size": 100, **layers}
    labels: dict[str, Any] = {"num_labels": 4}
    every_stage: dict[str, Any] = {"out_features": _STAGES}
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


def wide_corpus() -> dict[str, CorpusModel]:
    """More architectures, each a model family of its own (encoders, decoders, state-space
    models, speech, video, time series; detection, segmentation, depth and super-resolution
    heads), shrunk the same way: too many to run every scheduler x backend on in CI, so the
    sweep (``benchmarks/sweep.py``) and the tests under ``--runslow`` run each through
    ``optimize()`` and through its ``torch.onnx`` exports."""
    hf = _transformers()
    image, shaped, layers, vision = _image, _shaped, _LAYERS, _VISION
    tokens = _tokens()
    text: dict[str, Any] = {"vocab_size": 100, "hidden_size": 64, **layers}
    decoder: dict[str, Any] = {**text, "num_key_value_heads": 2, "use_cache": False}
    four: dict[str, Any] = {"depths": [1, 1, 1, 1], "hidden_sizes": [16, 32, 64, 128]}
    stages: dict[str, Any] = {"embedding_size": 16, **four}
    labels: dict[str, Any] = {"num_labels": 3}
    entries = [
        CorpusModel("distilbert", "DistilBertModel", lambda: hf.DistilBertModel(hf.DistilBertConfig(
            vocab_size=100, dim=64, n_layers=2, n_heads=4, hidden_dim=128)), tokens),
        CorpusModel("albert", "AlbertModel", lambda: hf.AlbertModel(hf.AlbertConfig(embedding_size=32, **text)),
                    tokens),
        CorpusModel("electra", "ElectraModel", lambda: hf.ElectraModel(hf.ElectraConfig(embedding_size=32, **text)),
                    tokens),
        CorpusModel("convbert", "ConvBertModel", lambda: hf.ConvBertModel(hf.ConvBertConfig(
            embedding_size=64, **text)), tokens),
        CorpusModel("squeezebert", "SqueezeBertModel", lambda: hf.SqueezeBertModel(hf.SqueezeBertConfig(
            embedding_size=64, **text)), tokens),
        CorpusModel("mpnet", "MPNetModel", lambda: hf.MPNetModel(hf.MPNetConfig(**text)), tokens),
        CorpusModel("deberta_v2", "DebertaV2Model", lambda: hf.DebertaV2Model(hf.DebertaV2Config(**text)), tokens),
        # local (sliding-window) attention in most layers, global attention every second one
        CorpusModel("modernbert", "ModernBertModel", lambda: hf.ModernBertModel(hf.ModernBertConfig(
            global_attn_every_n_layers=2, local_attention=8, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            cls_token_id=1, sep_token_id=2, max_position_embeddings=64, **text)), tokens),
        # characters hashed into buckets, downsampled by a strided convolution, upsampled by repetition
        CorpusModel("canine", "CanineModel", lambda: hf.CanineModel(hf.CanineConfig(
            hidden_size=64, downsampling_rate=4, num_hash_buckets=64, **layers)), _tokens(32, 1000)),
        CorpusModel("funnel", "FunnelModel", lambda: hf.FunnelModel(hf.FunnelConfig(
            vocab_size=100, d_model=64, n_head=4, d_head=16, d_inner=128, block_sizes=[1, 1])), tokens),
        CorpusModel("t5_encoder", "T5EncoderModel", lambda: hf.T5EncoderModel(hf.T5Config(
            vocab_size=100, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)), tokens),
        CorpusModel("bart", "BartModel", lambda: hf.BartModel(hf.BartConfig(
            vocab_size=100, d_model=64, encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, use_cache=False)), tokens),
        CorpusModel("opt", "OPTModel", lambda: hf.OPTModel(hf.OPTConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, ffn_dim=128,
            word_embed_proj_dim=64, use_cache=False)), tokens),
        CorpusModel("bloom", "BloomModel", lambda: hf.BloomModel(hf.BloomConfig(
            vocab_size=100, hidden_size=64, n_layer=2, n_head=4, use_cache=False)), tokens),
        CorpusModel("gpt_neox", "GPTNeoXModel", lambda: hf.GPTNeoXModel(hf.GPTNeoXConfig(use_cache=False, **text)),
                    tokens),
        CorpusModel("phi", "PhiModel", lambda: hf.PhiModel(hf.PhiConfig(use_cache=False, **text)), tokens),
        CorpusModel("qwen2", "Qwen2Model", lambda: hf.Qwen2Model(hf.Qwen2Config(**decoder)), tokens),
        CorpusModel("mistral", "MistralModel", lambda: hf.MistralModel(hf.MistralConfig(**decoder)), tokens),
        CorpusModel("gemma", "GemmaModel", lambda: hf.GemmaModel(hf.GemmaConfig(head_dim=16, **decoder)), tokens),
        # queries and keys normalised per head before the rotary embedding
        CorpusModel("qwen3", "Qwen3Model", lambda: hf.Qwen3Model(hf.Qwen3Config(head_dim=16, **decoder)), tokens),
        # attention and the MLP in parallel on one layer norm (no bias), the rotary embedding interleaved
        CorpusModel("cohere", "CohereModel", lambda: hf.CohereModel(hf.CohereConfig(**decoder)), tokens),
        # mixtures of experts: each token routed to its top two of four experts (top-k, a one-hot
        # mask, experts gathered and their outputs scattered back), Qwen2's beside a shared expert
        CorpusModel("mixtral", "MixtralModel", lambda: hf.MixtralModel(hf.MixtralConfig(
            num_local_experts=4, num_experts_per_tok=2, **decoder)), tokens),
        CorpusModel("qwen2_moe", "Qwen2MoeModel", lambda: hf.Qwen2MoeModel(hf.Qwen2MoeConfig(
            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
            **decoder)), tokens),
        # logits soft-capped by tanh; local (sliding-window) and global attention layers alternating
        CorpusModel("gemma2", "Gemma2Model", lambda: hf.Gemma2Model(hf.Gemma2Config(head_dim=16, **decoder)),
                    tokens),
        # local and global layers, each with a rotary embedding of its own base
        CorpusModel("gemma3_text", "Gemma3TextModel", lambda: hf.Gemma3TextModel(hf.Gemma3TextConfig(
            head_dim=16, **decoder)), tokens),
        CorpusModel("phi3", "Phi3Model", lambda: hf.Phi3Model(hf.Phi3Config(pad_token_id=0, **decoder)), tokens),
        CorpusModel("stablelm", "StableLmModel", lambda: hf.StableLmModel(hf.StableLmConfig(**decoder)), tokens),
        # attention and the MLP in parallel on the same normalised input: a branch per block
        CorpusModel("falcon", "FalconModel", lambda: hf.FalconModel(hf.FalconConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, use_cache=False)), tokens),
        CorpusModel("gptj", "GPTJModel", lambda: hf.GPTJModel(hf.GPTJConfig(
            vocab_size=100, n_embd=64, n_layer=2, n_head=4, rotary_dim=8, use_cache=False)), tokens),
        # two-stream relative attention over permutations (einsum-heavy)
        CorpusModel("xlnet", "XLNetModel", lambda: hf.XLNetModel(hf.XLNetConfig(
            vocab_size=100, d_model=64, n_layer=2, n_head=4, d_inner=128, use_mems_eval=False)), tokens),
        # bottleneck layers around narrow attention, and an elementwise "NoNorm"
        CorpusModel("mobilebert", "MobileBertModel", lambda: hf.MobileBertModel(hf.MobileBertConfig(
            embedding_size=32, intra_bottleneck_size=32, true_hidden_size=32, **{**text, "intermediate_size": 64})),
                    tokens),
        CorpusModel("mamba", "MambaModel", lambda: hf.MambaModel(hf.MambaConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, state_size=8, use_cache=False)), tokens),
        # its chunked scan permutes and transposes by dimensions counted from the end
        CorpusModel("mamba2", "Mamba2Model", lambda: hf.Mamba2Model(hf.Mamba2Config(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, state_size=8, num_heads=4, head_dim=32, n_groups=1,
            chunk_size=8, use_cache=False)), tokens),
        CorpusModel("rwkv", "RwkvModel", lambda: hf.RwkvModel(hf.RwkvConfig(
            vocab_size=100, hidden_size=64, num_hidden_layers=2, attention_hidden_size=64, intermediate_size=128,
            use_cache=False)), tokens),
        CorpusModel("clip_vision", "CLIPVisionModel", lambda: hf.CLIPVisionModel(hf.CLIPVisionConfig(**vision)),
                    image()),
        # pooled by attention: a learned probe token attends to every patch
        CorpusModel("siglip_vision", "SiglipVisionModel",
                    lambda: hf.SiglipVisionModel(hf.SiglipVisionConfig(**vision)), image()),
        # learned group tokens take the image tokens by a hard (argmax) assignment, stage by stage
        CorpusModel("groupvit_vision", "GroupViTVisionModel", lambda: hf.GroupViTVisionModel(hf.GroupViTVisionConfig(
            image_size=64, patch_size=16, hidden_size=64, depths=[1, 1, 1], num_group_tokens=[8, 4, 0],
            num_output_groups=[8, 4, 4], num_attention_heads=4, intermediate_size=128)), image()),
        # two towers, text and image, and two inputs of different batch sizes (two captions, one image)
        CorpusModel("clip", "CLIPModel", lambda: hf.CLIPModel(hf.CLIPConfig(
            text_config={"vocab_size": 100, "hidden_size": 64, **layers}, vision_config=vision, projection_dim=32)),
                    lambda: (torch.randint(0, 100, (2, 8)), torch.randn(1, 3, 64, 64))),
        # a fixed set of latents cross-attending to the input
        CorpusModel("perceiver", "PerceiverModel", lambda: hf.PerceiverModel(hf.PerceiverConfig(
            num_latents=16, d_latents=32, d_model=64, num_blocks=1, num_self_attends_per_block=2,
            num_self_attention_heads=4, num_cross_attention_heads=4)), shaped(1, 16, 64)),
        # windowed attention with relative positions, and global attention every other block
        CorpusModel("sam_vision", "SamVisionModel", lambda: hf.SamVisionModel(hf.SamVisionConfig(
            hidden_size=32, output_channels=32, num_hidden_layers=2, num_attention_heads=4, image_size=64,
            patch_size=16, window_size=2, global_attn_indexes=[1], mlp_dim=64)), image()),
        # separable self-attention (linear in the tokens) over unfolded patches
        CorpusModel("mobilevitv2", "MobileViTV2Model", lambda: hf.MobileViTV2Model(hf.MobileViTV2Config(
            image_size=64, width_multiplier=0.5)), image()),
        CorpusModel("beit", "BeitModel", lambda: hf.BeitModel(hf.BeitConfig(**vision)), image()),
        CorpusModel("data2vec_vision", "Data2VecVisionModel",
                    lambda: hf.Data2VecVisionModel(hf.Data2VecVisionConfig(**vision)), image()),
        CorpusModel("yolos", "YolosModel", lambda: hf.YolosModel(hf.YolosConfig(
            image_size=[64, 64], patch_size=16, hidden_size=64, num_detection_tokens=10, **layers)), image()),
        CorpusModel("dpt", "DPTForDepthEstimation", lambda: hf.DPTForDepthEstimation(hf.DPTConfig(
            image_size=64, patch_size=16, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
            intermediate_size=128, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 32, 64, 64],
            fusion_hidden_size=32)), image()),
        CorpusModel("mobilenet_v1", "MobileNetV1Model",
                    lambda: hf.MobileNetV1Model(hf.MobileNetV1Config(image_size=64)), image()),
        # a text detector's backbone: 3x3, 1x3 and 3x1 convolutions side by side, summed
        CorpusModel("textnet", "TextNetModel", lambda: hf.TextNetModel(hf.TextNetConfig()), image()),
        # stages whose blocks concatenate every layer's output, RT-DETRv2's and D-FINE's backbone
        CorpusModel("hgnet_v2", "HGNetV2Backbone", lambda: hf.HGNetV2Backbone(hf.HGNetV2Config(
            out_features=_STAGES)), image()),
        # weight-standardised convolutions: a batch norm in training mode on each weight
        CorpusModel("bit", "BitModel", lambda: hf.BitModel(hf.BitConfig(num_groups=8, embedding_size=16, **four)),
                    image()),
        CorpusModel("cvt", "CvtModel", lambda: hf.CvtModel(hf.CvtConfig()), image()),
        CorpusModel("pvt", "PvtModel", lambda: hf.PvtModel(hf.PvtConfig(
            image_size=64, num_attention_heads=[1, 2, 4, 8], **four)), image()),
        # overlapping patch embeddings, and a depthwise convolution inside each MLP
        CorpusModel("pvt_v2", "PvtV2Model", lambda: hf.PvtV2Model(hf.PvtV2Config(
            depths=[1, 1, 1, 1], hidden_sizes=[16, 32, 80, 128])), image()),
        # cosine attention, relative positions from a small MLP over log-spaced offsets
        CorpusModel("swinv2", "Swinv2Model", lambda: hf.Swinv2Model(hf.Swinv2Config(
            image_size=64, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4)), image()),
        # a plain ViT as a detection backbone: relative positions decomposed along height and width
        CorpusModel("vitdet", "VitDetModel", lambda: hf.VitDetModel(hf.VitDetConfig(
            pretrain_image_size=64, **vision)), image()),
        # matting: a ViTDet backbone and a convolutional detail stream of the image and its trimap
        CorpusModel("vitmatte", "VitMatteForImageMatting", lambda: hf.VitMatteForImageMatting(hf.VitMatteConfig(
            backbone_config=hf.VitDetConfig(num_channels=4, pretrain_image_size=64, **vision), hidden_size=64,
            convstream_hidden_sizes=[16, 32, 64], fusion_hidden_sizes=[64, 32, 16, 8])), image(channels=4)),
        CorpusModel("swiftformer", "SwiftFormerModel", lambda: hf.SwiftFormerModel(hf.SwiftFormerConfig(
            depths=[1, 1, 1, 1], embed_dims=[16, 32, 64, 128])), image()),
        CorpusModel("focalnet", "FocalNetModel", lambda: hf.FocalNetModel(hf.FocalNetConfig(
            image_size=64, embed_dim=16, depths=[1, 1], hidden_sizes=[16, 32])), image()),
        CorpusModel("glpn", "GLPNForDepthEstimation", lambda: hf.GLPNForDepthEstimation(hf.GLPNConfig(
            num_attention_heads=[1, 2, 4, 8], decoder_hidden_size=32, **four)), image()),
        CorpusModel("hiera", "HieraModel", lambda: hf.HieraModel(hf.HieraConfig(
            image_size=[64, 64], embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 4], query_stride=[2, 2],
            masked_unit_size=[8, 8], patch_stride=[4, 4])), image()),
        # detection: a convolutional backbone, a transformer encoder-decoder and learned queries
        CorpusModel("detr", "DetrModel", lambda: hf.DetrModel(hf.DetrConfig(
            use_timm_backbone=False, use_pretrained_backbone=False, backbone_config=hf.ResNetConfig(
                out_features=["stage4"], **stages), d_model=32, encoder_layers=1, decoder_layers=1,
            encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
            num_queries=10)), image()),
        # real-time detection: a hybrid encoder over three scales and deformable attention in the decoder
        CorpusModel("rt_detr", "RTDetrModel", lambda: hf.RTDetrModel(hf.RTDetrConfig(
            backbone_config=hf.RTDetrResNetConfig(out_features=_STAGES[1:], **stages), encoder_hidden_dim=32,
            d_model=32, decoder_layers=1, num_queries=10, encoder_ffn_dim=64, decoder_ffn_dim=64,
            encoder_in_channels=[32, 64, 128], decoder_in_channels=[32, 32, 32], num_feature_levels=3)), image()),
        # conditional spatial queries: each decoder query's reference point, embedded in sines
        CorpusModel("conditional_detr", "ConditionalDetrModel", lambda: hf.ConditionalDetrModel(
            hf.ConditionalDetrConfig(use_timm_backbone=False, use_pretrained_backbone=False,
                                     backbone_config=hf.ResNetConfig(out_features=["stage4"], **stages), d_model=32,
                                     encoder_layers=1, decoder_layers=1, encoder_attention_heads=4,
                                     decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
                                     num_queries=10)), image()),
        # depth from a DINOv2 backbone's four stages through a DPT-style neck and head
        CorpusModel("depth_anything", "DepthAnythingForDepthEstimation",
                    lambda: hf.DepthAnythingForDepthEstimation(hf.DepthAnythingConfig(
                        backbone_config=hf.Dinov2Config(image_size=56, patch_size=14, hidden_size=32,
                                                        num_hidden_layers=4, num_attention_heads=4,
                                                        intermediate_size=64, out_features=_STAGES,
                                                        reshape_hidden_states=False),
                        neck_hidden_sizes=[16, 32, 64, 64], fusion_hidden_size=32, head_hidden_size=16,
                        reassemble_hidden_size=32)), image(56)),
        # a pixel decoder of multi-scale deformable attention: grid sampling at learned offsets
        CorpusModel("mask2former", "Mask2FormerModel", lambda: hf.Mask2FormerModel(hf.Mask2FormerConfig(
            backbone_config=hf.SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[1, 1, 1, 1],
                                          num_heads=[1, 1, 2, 2], window_size=2, out_features=_STAGES),
            feature_size=32, mask_feature_size=32, hidden_dim=32, encoder_feedforward_dim=64, dim_feedforward=64,
            num_queries=10, encoder_layers=1, decoder_layers=2, num_attention_heads=4,
            use_pretrained_backbone=False)), image()),
        # a feature pyramid over a Swin backbone's four stages, and mask queries on its finest level
        CorpusModel("maskformer", "MaskFormerModel", lambda: hf.MaskFormerModel(hf.MaskFormerConfig(
            backbone_config=hf.SwinConfig(image_size=64, embed_dim=16, depths=[1, 1, 1, 1], num_heads=[1, 1, 2, 2],
                                          window_size=2, out_features=_STAGES),
            decoder_config=hf.DetrConfig(d_model=32, decoder_layers=1, decoder_attention_heads=4,
                                         decoder_ffn_dim=64), fpn_feature_size=32, mask_feature_size=32,
            num_queries=10)), image()),
        # super-resolution: windowed attention, then a convolutional upsampler by pixel shuffle
        CorpusModel("swin2sr", "Swin2SRModel", lambda: hf.Swin2SRModel(hf.Swin2SRConfig(
            image_size=32, embed_dim=32, depths=[1, 1], num_heads=[2, 2], window_size=4)), image(32)),
        CorpusModel("wav2vec2", "Wav2Vec2Model", lambda: hf.Wav2Vec2Model(hf.Wav2Vec2Config(
            hidden_size=64, conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3),
            num_conv_pos_embeddings=16, num_conv_pos_embedding_groups=4, **layers)), shaped(1, 4000)),
        # the feature encoder's output squeezed (pooled) before the transformer, upsampled after it
        CorpusModel("sew", "SEWModel", lambda: hf.SEWModel(hf.SEWConfig(
            hidden_size=64, conv_dim=(32, 32), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4, **layers)), shaped(1, 1600)),
        # a neural audio codec: a convolutional encoder with an LSTM, residual vector quantisation
        # (each code the nearest codebook entry, by argmin) and a transposed-convolution decoder
        CorpusModel("encodec", "EncodecModel", lambda: hf.EncodecModel(hf.EncodecConfig(
            num_filters=8, hidden_size=32, upsampling_ratios=[4, 2], codebook_size=64)), shaped(1, 1, 800)),
        CorpusModel("whisper_encoder", "WhisperForAudioClassification",
                    lambda: hf.WhisperForAudioClassification(hf.WhisperConfig(
                        d_model=64, encoder_layers=2, encoder_attention_heads=4, encoder_ffn_dim=128, num_mel_bins=16,
                        max_source_positions=50, **labels)), shaped(1, 16, 100)),
        CorpusModel("ast", "ASTModel", lambda: hf.ASTModel(hf.ASTConfig(
            hidden_size=64, num_mel_bins=32, max_length=64, **layers)), shaped(1, 64, 32)),
        # a time series cut into patches along its time axis (an unfold of dimension -2)
        CorpusModel("patchtst", "PatchTSTModel", lambda: hf.PatchTSTModel(hf.PatchTSTConfig(
            num_input_channels=3, context_length=32, patch_length=8, patch_stride=8, d_model=32, num_hidden_layers=2,
            num_attention_heads=4, ffn_dim=64)), shaped(1, 32, 3)),
        CorpusModel("videomae", "VideoMAEModel", lambda: hf.VideoMAEModel(hf.VideoMAEConfig(
            image_size=32, patch_size=16, num_frames=4, tubelet_size=2, hidden_size=64, **layers)),
                    shaped(1, 4, 3, 32, 32)),
        # divided space-time attention: each patch attends over time, then over space
        CorpusModel("timesformer", "TimesformerModel", lambda: hf.TimesformerModel(hf.TimesformerConfig(
            num_frames=2, **vision)), shaped(1, 2, 3, 64, 64)),
        # tubelets embedded by a 3-D convolution
        CorpusModel("vivit", "VivitModel", lambda: hf.VivitModel(hf.VivitConfig(
            num_frames=4, tubelet_size=[2, 16, 16], **vision)), shaped(1, 4, 3, 64, 64)),
    ]
    return {e.name: e for e in entries}

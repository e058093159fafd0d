"""Every architecture Hugging Face ``transformers`` registers (``AutoModel``'s mapping, about 600,
and the few dozen it registers with a task's auto class alone: PP-OCRv5's text detectors, ZoeDepth,
ViTPose, UperNet) through ``opsched.optimize``, each built from its default config shrunk by one
generic rule: no config written for it, as a user's model comes.

The rule (:data:`SMALL`) sets whichever of the usual size fields a config has (layers, widths,
heads, experts), in it and in its sub-configs, and the few fields that must agree with those
(a state-space model's heads, a rotary part's width); where the model then cannot be built or
called, the layer counts alone are shrunk (:data:`LAYERS`), and where it still cannot, the rule's
sizes are set with the config's tuples made lists, as a checkpoint's JSON holds them (:func:`listed`:
ViTMatte's). Random weights made to look trained
(:func:`opsched.testing.weights.trained_looking`: zeroed parameters drawn, batch norms' statistics,
frozen ones' too, of the model's own activations on its inputs), batch 1, the model's
main input (16 tokens, an image at its config's size or a sub-config's, 8000 audio samples, 3000 mel frames) and
each further input its ``forward`` requires, made by its name, or that it names in refusing to run
without it (Bros's boxes, LXMERT's regions); for an encoder-decoder 8
decoder tokens, and for a text-and-image model an image, with an image token placed before the
text for each feature its ``get_image_features`` makes of it (as its processor places them)
where it needs them, in rows of patches beside their grid where it takes them so (Qwen2-VL's,
the grid and the tokens' kinds fixed values), or beside its size (Mistral3's), else the text
alone; for a vision tower, an image's patches and
their grid, the grid a fixed value (``fixed_values=``: the tower sizes its tensors by its numbers);
for a video model, a clip of its frames; for a forecaster, its context of past values; for the
Decision Transformer, a trajectory of 16 steps; for SegGPT, its image and its prompt's, each half
the canvas its config sizes. A timm
backbone (DETR's) is made transformers' own of the same family where timm is not installed.
Models past ``--max-params`` (counted on the meta device) are not built.
``optimize`` runs with the analytic cost model and its own check against the model, and the
largest difference of its outputs from eager's is recorded; where that is beyond float32's
tolerance, what the check passed them by: eager's outputs with values that tie taken in another
order (RT-DETR's queries), which positions moved, or the model run in float64, how far opsched's
and eager's are each from it (:func:`beyond_tolerance`).

Each outcome is whose it is:
*equal*: optimize() ran and matched eager (within float32's tolerance, or up to tied values
taken in another order, or as near the model run in float64 as eager itself: *undecided* where
eager is that far by a tenth of the outputs' scale, float32 keeping nothing of them to hold a
plan to); *refused*: opsched raised its own error, named
(:class:`opsched.errors.OpschedError`: a model it cannot hold, said why); *failed*: any other
exception from opsched, or outputs that differ (a bug of ours); *not built*: the generic rule
could not build or call the model in eager PyTorch (not opsched's: the rule's limit); *too large*;
*crashed*: its worker process died or ran out of time. A refused model is also run as its error
suggests where it cannot be one static graph: through ``torch.compile(model, backend="opsched")``
(analytic costs), with the graphs Dynamo captured, how many of them ran eagerly, and the largest
difference from eager.

Each model runs in a worker process (``--jobs`` at once, ``--chunk`` models a process), so a model
that exhausts memory or hangs costs only itself. No timings: what runs, and how exactly.

    python benchmarks/transformers_all.py
    python benchmarks/transformers_all.py --models bert bamba vit_mae
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import contextlib
import functools
import inspect
import json
import re
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import RESULTS, write  # noqa: E402

#: Layer counts: a model keeps its kinds of layers, two of each (one of an encoder-decoder's each).
LAYERS = {"num_hidden_layers": 2, "num_layers": 2, "n_layer": 2, "n_layers": 2, "encoder_layers": 1,
          "decoder_layers": 1, "num_encoder_layers": 1, "num_decoder_layers": 1}

#: Layer counts and widths, heads and experts: the models of the corpus's size.
SMALL = {**LAYERS, "hidden_size": 64, "d_model": 64, "n_embd": 64, "intermediate_size": 128, "ffn_dim": 128,
         "encoder_ffn_dim": 128, "decoder_ffn_dim": 128, "d_ff": 128, "num_attention_heads": 4,
         "encoder_attention_heads": 4, "decoder_attention_heads": 4, "n_head": 4, "n_heads": 4,
         "num_key_value_heads": 2, "head_dim": 16, "d_kv": 16, "num_experts": 4, "num_local_experts": 4,
         "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
         "kv_lora_rank": 16, "q_lora_rank": 32, "qk_rope_head_dim": 8, "qk_nope_head_dim": 8, "v_head_dim": 16,
         "linear_num_key_heads": 2, "linear_num_value_heads": 4, "rotary_dim": 8, "mamba_d_head": 16,
         "mamba_headdim": 16}

#: The fields that count experts: where a config holds one, it has none to shrink (:func:`_shrunk`).
EXPERTS = ("num_experts", "num_local_experts")

#: Fields a config may hold as None, meaning "work it out", which some models never do (Ministral's
#: head width, Nemotron's key-value heads, DeepSeek-V2's experts a token): set as :data:`SMALL` has them.
FILLED = ("head_dim", "num_key_value_heads", "num_experts_per_tok")

#: A state-space model's (heads, head width, expansion) fields: its heads are its inner width
#: (expansion x hidden size) over its head width, so they follow the hidden size.
SSM_HEADS = (("num_heads", "head_dim", "expand"), ("mamba_n_heads", "mamba_d_head", "mamba_expand"),
             ("n_mamba_heads", "mamba_headdim", "mamba_expand"))

OUTCOMES = ("equal", "refused", "failed", "not built", "too large", "crashed")


#: The fields that name a model's width, and the fields that hold a width of the same config or
#: of another: BLIP-2's Q-Former attends to its vision tower's output, T5Gemma's decoder to its
#: encoder's; OPT embeds its tokens at its own width (a checkpoint may embed narrower, and project),
#: SigLIP's text tower projects to it. When a width is shrunk, the fields that held it follow, so
#: that the model keeps its default structure (OPT no projection, BLIP-2's text its image's width).
WIDTHS = ("hidden_size", "d_model", "n_embd")
HELD_WIDTHS = ("encoder_hidden_size", "cross_attention_hidden_size", "word_embed_proj_dim", "projection_size",
               "reassemble_hidden_size")

#: The fields that hold a head's width (the width over the heads), which follow it as the widths
#: do: Bros projects its boxes' embeddings to a head's width, to add them to its attention's scores.
HELD_HEAD_WIDTHS = ("dim_bbox_projection",)


def shrunk(config: Any, sizes: dict[str, int]) -> Any:
    """``config`` with each of ``sizes`` it holds as an int set (read-only fields left; with
    :data:`SMALL`, :data:`FILLED` ones it holds as None too, and :func:`_follow`'s), stage
    depths set to one, ``layer_types`` cut to the layers kept, no cache; its sub-configs too;
    and each of :data:`HELD_WIDTHS` that held a width of :data:`WIDTHS` set to what that width
    became."""
    configs = _tree(config)
    before = [({key: _field(c, key) for key in WIDTHS}, _head_width(c)) for c in configs]
    _shrunk(config, sizes)
    became: dict[int, int] = {}
    head_became: dict[int, int] = {}
    for c, (widths, head) in zip(configs, before):
        for key, value in widths.items():
            if isinstance(value, int) and isinstance(_field(c, key), int):
                became.setdefault(value, _field(c, key))
        if head is not None and (now := _head_width(c)) is not None:
            head_became.setdefault(head, now)
    for c in configs:
        for keys, follows in ((HELD_WIDTHS, became), (HELD_HEAD_WIDTHS, head_became)):
            for key in keys:
                value = _field(c, key)
                if isinstance(value, int) and value in follows and key in vars(c):
                    setattr(c, key, follows[value])
    return config


def _head_width(config: Any) -> int | None:
    """A head's width in ``config``: its hidden size over its attention heads; None where it has not both."""
    hidden, heads = _field(config, "hidden_size"), _field(config, "num_attention_heads")
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads > 0 else None


def _tree(config: Any) -> list[Any]:
    """``config`` and its sub-configs, outermost first."""
    from transformers import PretrainedConfig

    out, stack = [], [config]
    while stack:
        c = stack.pop(0)
        out.append(c)
        stack.extend(v for v in vars(c).values() if isinstance(v, PretrainedConfig))
    return out


def _shrunk(config: Any, sizes: dict[str, int]) -> None:
    """:func:`shrunk` but for the held widths."""
    from transformers import PretrainedConfig

    aliases = getattr(config, "attribute_map", {})
    heads = tuple(_field(config, f) for f in ("num_attention_heads", "num_key_value_heads"))
    layers_before = _field(config, "num_hidden_layers")
    for key, value in sizes.items():
        if aliases.get(key) == "num_stages":  # ConvNeXt's layers are stages, each with its width in a list
            continue
        held = _field(config, key)
        if key in EXPERTS and isinstance(held, int) and held <= 1:
            continue  # one expert is a model without experts (ViTPose's: ViTPose+ has six): none made
        if (isinstance(held, int) and not isinstance(held, bool)) or \
                (held is None and key in FILLED and key in vars(config) and sizes is SMALL):
            # a property computed from other fields, or one that says which to set (Funnel's layers: its block sizes)
            with contextlib.suppress(AttributeError, NotImplementedError):
                setattr(config, key, value)
    if sizes is SMALL:
        _follow(config, heads)
    for key in ("depths", "block_sizes"):  # stages' depths (Swin's), Funnel's blocks'
        depths = getattr(config, key, None)
        if isinstance(depths, (list, tuple)) and all(isinstance(d, int) for d in depths):
            setattr(config, key, [1] * len(depths))
    _stages_kept(config, layers_before)
    layers, kinds = getattr(config, "num_hidden_layers", None), getattr(config, "layer_types", None)
    if isinstance(layers, int) and isinstance(kinds, list) and len(kinds) > layers:
        config.layer_types = kinds[:layers]
    if hasattr(config, "use_cache"):
        config.use_cache = False
    for sub in vars(config).values():
        if isinstance(sub, PretrainedConfig):
            _shrunk(sub, sizes)


def _stages_kept(config: Any, layers_before: Any) -> None:
    """A backbone whose stages are its layers (a ViT's: a stage's name per layer) and whose layers
    were shrunk keeps the outputs its head reads: as many layers as it reads stages, at least, and
    the stages it reads the last of them (ZoeDepth's BEiT read 6, 12, 18 and 24 of 24 layers: 1-4
    of 4, where none would be read of 2)."""
    names, indices, layers = _field(config, "stage_names"), _field(config, "out_indices"), \
        _field(config, "num_hidden_layers")
    if not (isinstance(names, list) and isinstance(indices, (list, tuple)) and indices and isinstance(layers, int)
            and isinstance(layers_before, int) and len(names) == layers_before + 1 and layers < layers_before):
        return
    kept = max(layers, len(indices))
    config.num_hidden_layers = kept
    config.stage_names = ["stem", *(f"stage{i}" for i in range(1, kept + 1))]
    config.set_output_features_output_indices(None, list(range(kept - len(indices) + 1, kept + 1)))


def _field(config: Any, key: str) -> Any:
    """``config``'s field ``key``, None where it has none, or refuses to give one for the whole
    model (Gemma 4's per-layer fields: left as they are)."""
    try:
        return getattr(config, key, None)
    except Exception:  # noqa: BLE001 (transformers' AmbiguousGlobalPerLayerAttributeError)
        return None


def _follow(config: Any, heads: tuple[Any, ...]) -> None:
    """The fields that must agree with the widths :data:`SMALL` set: the key-value heads keep
    their share of the ``heads`` the config had (DeepSeek's latent attention makes keys for every
    head, and torch.export's attention path repeats them by the ratio); DeepSeek's and Mistral 4's
    head width, of which their rotary part is a share; a state-space model's heads
    (:data:`SSM_HEADS`); Qwen2-VL's rotary sections (in its code, not its config), which sum to
    half its head width."""
    now = _field(config, "num_attention_heads")
    if all(isinstance(h, int) and h > 0 for h in heads) and isinstance(now, int):
        config.num_key_value_heads = max(1, now * heads[1] // heads[0])
    rope = _field(config, "rope_parameters")
    share = (rope if isinstance(rope, dict) else {}).get("partial_rotary_factor") or \
        _field(config, "partial_rotary_factor") or 1.0
    rotary, plain = _field(config, "qk_rope_head_dim"), _field(config, "qk_nope_head_dim")
    if isinstance(rotary, int) and _field(config, "head_dim") is not None:  # what the rotary part is a share of
        config.head_dim = int(rotary / share)
    if isinstance(rotary, int) and isinstance(plain, int) and isinstance(_field(config, "qk_head_dim"), int):
        config.qk_head_dim = rotary + plain  # LongCat-Flash keeps the sum as a field of its own
    experts = next((e for key in EXPERTS if isinstance(e := _field(config, key), int)), None)
    if experts is not None and isinstance(_field(config, "num_experts_per_tok"), int) and \
            config.num_experts_per_tok > experts:
        config.num_experts_per_tok = experts  # HunYuan-MoE's one expert: its top 1, not 2
    hidden = _field(config, "hidden_size")
    for count, width, expand in SSM_HEADS:
        if all(isinstance(_field(config, f), int) for f in (count, width, expand)) and isinstance(hidden, int):
            setattr(config, count, max(1, getattr(config, expand) * hidden // getattr(config, width)))
    head = _field(config, "head_dim") or (hidden // now if isinstance(hidden, int) and isinstance(now, int) else None)
    if isinstance(rope, dict) and isinstance(head, int) and \
            "mrope_section" in getattr(config, "ignore_keys_at_rope_validation", ()):
        # the model's default sections (Qwen2-VL's 16, 24, 24) sum to half its head's rotary part
        half = int(head * share) // 2
        rope["mrope_section"] = [half - 2 * (3 * half // 8), 3 * half // 8, 3 * half // 8]


def _held(config: Any, key: str) -> list[int]:
    """Every int value of field ``key`` in ``config`` and its sub-configs, outermost first, each once
    (an audio model's mel bins live in its encoder's config)."""
    values = []
    for c in _tree(config):
        value = _field(c, key)
        if isinstance(value, int) and not isinstance(value, bool) and value not in values:
            values.append(value)
    return values


def timm_free(config: Any) -> Any:
    """``config`` with each timm backbone it names (DETR's default ResNet-50, OmDet-Turbo's Swin)
    made transformers' own, of the same family and stages, where timm is not installed (it is
    not on this CPU machine); as it is otherwise."""
    import importlib.util

    from transformers import PretrainedConfig, ResNetConfig, SwinConfig

    if importlib.util.find_spec("timm") is not None:
        return config
    for key, sub in vars(config).items():
        if type(sub).__name__ == "TimmBackboneConfig":
            indices, family = list(sub.out_indices), str(getattr(sub, "backbone", ""))
            made = {"resnet": ResNetConfig, "swin": SwinConfig}.get(family.split("_")[0].rstrip("0123456789"))
            if made is not None:
                setattr(config, key, made(out_features=[f"stage{i}" for i in indices]))
        elif isinstance(sub, PretrainedConfig):
            timm_free(sub)
    return config


def default_config(architecture: str) -> Any:
    """``architecture``'s default config; a forecaster's that has no default horizon (the time
    series transformers', whose models refuse to be built without one) made with one of 24 steps
    and one time feature, as a checkpoint's names them."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    made = CONFIG_MAPPING[architecture]
    config = made()
    if "prediction_length" in vars(config) and config.prediction_length is None:
        config = made(prediction_length=24, num_time_features=1)
    return config


def as_checkpoints_name(config: Any) -> Any:
    """``config`` with the fields named that a checkpoint's config names and the default one
    holds as None: BLIP-2's and InstructBLIP's image token, InstructBLIP-Video's video token (their
    processors' tokenizers add it past the text model's vocabulary: the text vocabulary's size),
    X-MOD's default language (the first it has adapters for); and the width a vision tower projects
    its features to, its text model's where the image takes places in the text, where the default
    config holds another (Qwen3-VL's 3584 beside its text's 4096, Janus's 2048: a checkpoint's
    config holds its own two, equal); as it is otherwise."""
    text = getattr(config, "text_config", None)
    vocabulary = _field(text, "vocab_size") if text is not None else None
    for key in ("image_token_index", "video_token_index"):
        if key in vars(config) and getattr(config, key) is None and isinstance(vocabulary, int):
            setattr(config, key, vocabulary)
    vision = getattr(config, "vision_config", None)
    width = next((w for key in WIDTHS if isinstance(w := _field(text, key), int)), None)
    placed = _image_token(config) is not None  # else a projection to a space of its own (CLIP's)
    for key in ("out_hidden_size", "text_hidden_size", *(("projection_dim",) if placed else ())):
        if vision is not None and isinstance(_field(vision, key), int) and width is not None:
            setattr(vision, key, width)
    languages = _field(config, "languages")
    if "default_language" in vars(config) and config.default_language is None and languages:
        config.default_language = list(languages)[0]
    classes = _auto_classes(config)
    if config.architectures is None and isinstance(classes, (list, tuple)):
        # AutoModel picks among several classes by the architectures a checkpoint names (Funnel's
        # full model or its base), and fails where none are named: the first, as the mapping has it
        config.architectures = [classes[0].__name__]
    return config


def listed(config: Any) -> Any:
    """``config`` with each field it and its sub-configs hold as a tuple a list, as a checkpoint's
    JSON holds it where the config's own ``__init__`` keeps what it is given: ViTMatte's model
    extends a list by its default config's tuple of widths, and cannot be built from it (Reformer's,
    which adds a tuple to its own, can only from the tuple: a fallback, not the rule)."""
    for c in _tree(config):
        for key, value in vars(c).items():
            if isinstance(value, tuple):
                setattr(c, key, _listed(value))
    return config


def _listed(value: Any) -> Any:
    """``value`` with its tuples lists, nested ones too (what JSON makes of them)."""
    return [_listed(v) for v in value] if isinstance(value, (tuple, list)) else value


def _auto_classes(config: Any) -> Any:
    """What its auto class's mapping holds for ``config``'s type: a class, several, or None."""
    auto = auto_class(config)
    with contextlib.suppress(KeyError):
        return auto._model_mapping[type(config)] if auto is not None else None
    return None


@functools.cache
def _autos() -> tuple[Any, ...]:
    """transformers' auto classes, in the order an architecture is built by: ``AutoModel``, each
    task's (by name), ``AutoBackbone`` (a backbone is built by a task's class where one holds it)."""
    import transformers

    tasks = sorted(n for n in dir(transformers) if n.startswith("AutoModelFor"))
    return tuple(getattr(transformers, n) for n in ["AutoModel", *tasks, "AutoBackbone"])


def auto_class(config: Any) -> Any:
    """The auto class that builds ``config``'s model: the first of :func:`_autos` whose mapping
    holds its type (``AutoModel``'s, save for an architecture registered with a task alone:
    PP-OCRv5's detector with ``AutoModelForObjectDetection``); None where none does."""
    return next((auto for auto in _autos() if type(config) in auto._model_mapping), None)


def architectures() -> list[str]:
    """Every model type an auto class builds: ``AutoModel``'s (as its mapping names them), then
    those a task's class alone builds, each once."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_MAPPING_NAMES

    found = dict.fromkeys(MODEL_MAPPING_NAMES)
    for auto in _autos()[1:]:
        found.update((c.model_type, None) for c in auto._model_mapping if c.model_type in CONFIG_MAPPING)
    return list(found)


def _size(config: Any, key: str, default: int) -> int:
    """An int field of ``config`` or of its vision config (the first of a list), else ``default``."""
    value = getattr(config, key, None)
    if value is None and getattr(config, "vision_config", None) is not None:
        value = getattr(config.vision_config, key, None)
    if isinstance(value, (list, tuple)):
        value = value[0]
    return value if isinstance(value, int) else default


def candidate_inputs(model: Any, config: Any) -> dict[str, dict[str, Any]]:
    """The inputs to try ``model`` with, best first, by what they are: for a text-and-image model
    that reads its image where its text holds the image's token, its image with that token in the
    text for each of the image's features ("image placed", :func:`image_placed`); then
    :func:`example_inputs` ("as made"); then, for a text-and-image model, its tokens alone ("text
    alone": its image needs sizes beside it, which only its processor knows); for an audio model,
    or rows of embeddings or latents, :func:`audio_forms`; for a model that takes an image its
    config sizes but makes no example of, its inputs with the image ("with its image": ViLT's);
    for a model given an image, a clip of its frames, with its token placed for each of the clip's
    features where it reads them so (InstructBLIP-Video's), then without, or two of its frames (a
    keypoint matcher's pair of images: EfficientLoFTR's), and its image at each size a sub-config
    names (:func:`_image_sizes`: SAM 2's and LW-DETR's backbones, whose windows tile no other);
    for a vision tower that takes an image's grid, :func:`patch_grids` alone."""

    grid = next((n for n, p in inspect.signature(model.forward).parameters.items()
                 if n.endswith("grid_thw") and p.default is p.empty), None)  # a tower's, not its whole model's
    if grid is not None:
        return patch_grids(model, config, grid)
    inputs = example_inputs(model, config)
    candidates = {"as made": inputs}
    if "pixel_values" in inputs and "input_ids" in inputs:
        placed = image_placed(model, config, inputs)
        if placed is not None:  # where the model reads its image at its token (BLIP-2), that before text without it
            candidates = {"image placed": placed, **candidates}
        gridded = gridded_image(model, config, inputs)
        if gridded is not None:  # Qwen2-VL's: its image in rows of patches beside their grid
            candidates = {"image placed, in patches": gridded, **candidates}
        sized = sized_image(model, config, inputs)
        if sized is not None:  # Mistral3's: its image beside its size
            candidates = {"image placed, with its size": sized, **candidates}
        candidates["text alone"] = {k: v for k, v in inputs.items() if k != "pixel_values"}
    candidates.update(audio_forms(config, inputs))
    if "pixel_values" not in inputs and "pixel_values" in inspect.signature(model.forward).parameters and \
            isinstance(_field(config, "image_size"), int):  # ViLT's: one transformer over text and image
        candidates["with its image"] = {**inputs, "pixel_values": _image(config)}
    if "pixel_values" in inputs and inputs["pixel_values"].dim() == 4:  # a video model's (X-CLIP's frames: its tower's)
        clip = {**inputs, "pixel_values": _clip(config)}
        placed = image_placed(model, config, clip) if "input_ids" in clip else None
        candidates.update({"a clip placed": placed} if placed is not None else {}, **{"a clip": clip})
        # a keypoint matcher's pair of images
        candidates["an image pair"] = {**inputs, "pixel_values": clip["pixel_values"][:, :2].clone()}
    candidates.update(resized_images(config, inputs))
    return candidates


def image_placed(model: Any, config: Any, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """``inputs`` with the image's tokens before the text, as a text-and-image model's processor
    places them: the config's image token once per feature of the image (:func:`_image_rows`),
    the model's token embeddings grown to hold it where its tokenizer added it past the config's
    vocabulary (as a checkpoint's are); None where the model has no such token, or its features
    cannot be counted."""
    import torch

    token = _image_token(config)
    rows = _image_rows(model, config, inputs) if isinstance(token, int) else 0
    if not rows:
        return None
    embeddings = model.get_input_embeddings()
    if embeddings is not None and token >= embeddings.num_embeddings:  # LLaVA's: its tokenizer added it
        model.resize_token_embeddings(token + 1, mean_resizing=False)
    # the text's random tokens (3-99, fewer where the vocabulary is smaller) hold no image token: Mistral3's is 10
    text = inputs["input_ids"].masked_fill(inputs["input_ids"] == token, 4 if token == 3 else 3)
    return {**inputs, "input_ids": torch.cat([torch.full((1, rows), token), text], dim=1)}


def _image_token(config: Any) -> int | None:
    """The token a text-and-image model's text holds in its image's place (its video's where it
    reads a clip), None where its config names none."""
    named = (getattr(config, key, None) for key in ("image_token_id", "image_token_index", "video_token_index"))
    return next((t for t in named if t is not None), None)


def gridded_image(model: Any, config: Any, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """For a text-and-image model that takes its image as its vision tower does, in rows of
    patches beside their grid (``image_grid_thw``: Qwen2-VL's and its kin's, as their processors
    make it), ``inputs`` with that image (:func:`_patches`, of the frames a patch of its tower
    spans) and its tokens placed (:func:`image_placed`), and where the model takes them, the
    tokens' kinds (``mm_token_type_ids``: 1 at the image's tokens, as the processor marks them);
    None for a model of another kind, or one whose image tokens cannot be counted."""
    features = getattr(model, "get_image_features", None)
    if features is None or "image_grid_thw" not in inspect.signature(features).parameters:
        return None
    patches, grid = _patches(config, _size(config, "temporal_patch_size", 1))
    placed = image_placed(model, config, {**inputs, "pixel_values": patches, "image_grid_thw": grid})
    if placed is not None and "mm_token_type_ids" in inspect.signature(model.forward).parameters:
        placed["mm_token_type_ids"] = (placed["input_ids"] == _image_token(config)).long()
    return placed


def sized_image(model: Any, config: Any, inputs: dict[str, Any]) -> dict[str, Any] | None:
    """For a text-and-image model that takes its image's size beside it (``image_sizes``:
    Mistral3's, as its processor makes it), ``inputs`` with an image of 224 x 224 (its config's
    size is the largest it takes: Mistral3's 1540 would be 3,025 tokens), that size, and its
    tokens placed (:func:`image_placed`); None for a model of another kind, or one whose image
    tokens cannot be counted so."""
    features = getattr(model, "get_image_features", None)
    if features is None or "image_sizes" not in inspect.signature(features).parameters:
        return None
    import torch

    image = torch.randn(*inputs["pixel_values"].shape[:-2], 224, 224)
    return image_placed(model, config, {**inputs, "pixel_values": image, "image_sizes": torch.tensor([[224, 224]])})


def _image_rows(model: Any, config: Any, inputs: dict[str, Any]) -> int:
    """How many features a text-and-image model makes of the image (a token each): the rows of
    what its own ``get_image_features`` makes of it, or where it has none but reads its image at
    placeholders, its query former's queries (InstructBLIP's); 0 where it cannot tell."""
    import torch

    if not hasattr(model, "get_image_features"):  # of a clip, each frame's (InstructBLIP-Video's)
        queries, image = getattr(config, "num_query_tokens", None), inputs["pixel_values"]
        frames = image.shape[1] if image.dim() == 5 else 1
        return queries * frames if isinstance(queries, int) and hasattr(model, "get_placeholder_mask") else 0
    try:
        with torch.no_grad():
            # with the query former's text where it reads one (InstructBLIP's instruction), the image's grid or size
            beside = {k: v for k, v in inputs.items() if k in ("qformer_input_ids", "image_grid_thw", "image_sizes")}
            features = model.get_image_features(pixel_values=inputs["pixel_values"], **beside)
    except Exception:  # noqa: BLE001 (sizes beside the image, which the processor knows: the text alone then)
        return 0
    return _rows(getattr(features, "pooler_output", features))


def _rows(features: Any) -> int:
    """How many feature rows (one image token each) a tensor, or a list of tensors, holds."""
    import torch

    if isinstance(features, torch.Tensor):
        return features.numel() // features.shape[-1] if features.dim() else 0
    if isinstance(features, (list, tuple)):
        return sum(_rows(f) for f in features)
    return 0


def patch_grids(model: Any, config: Any, grid: str) -> dict[str, dict[str, Any]]:
    """A vision tower's inputs as its model's processor makes them: the image's patches flattened
    (one row a patch, of channels x frames x side x side values) beside its grid of (frames,
    rows, columns) patches in ``grid``, an image of 4x4 merged patches (a merge of m x m patches
    a token); a patch of one frame, or two (a video's), where the config's frame count does not
    fit, or each patch a small image (channels, side, side) where the tower embeds it with a 2-d
    convolution; VideoLLaMA3's towers take each image's merge beside its grid."""
    import torch

    merge = _size(config, "spatial_merge_size", 1)
    side, frames = _size(config, "patch_size", 14), _size(config, "temporal_patch_size", 1)
    channels = _size(config, "in_channels", _size(config, "num_channels", 3))
    params = inspect.signature(model.forward).parameters
    first = next(n for n, p in params.items() if n != grid and p.default is p.empty and p.kind is not p.VAR_KEYWORD)
    patches, grid_thw = _patches(config, 1)
    beside = {grid: grid_thw}
    if "merge_sizes" in params:  # VideoLLaMA3's, an image's merge
        beside["merge_sizes"] = torch.tensor([merge])
    candidates = {f"patches of {t} frames": {first: _patches(config, t)[0], **beside}
                  for t in dict.fromkeys((frames, 1, 2))}
    return {**candidates, "patches as images": {first: patches.reshape(len(patches), channels, side, side), **beside}}


def _patches(config: Any, frames: int) -> tuple[Any, Any]:
    """An image of 4 x 4 merged patches (a merge of m x m patches a token) as a vision tower takes
    it: a row per patch, of channels x ``frames`` x side x side values, and its grid of (frames,
    rows, columns) patches."""
    import torch

    merge, side = _size(config, "spatial_merge_size", 1), _size(config, "patch_size", 14)
    channels, rows = _size(config, "in_channels", _size(config, "num_channels", 3)), 4 * merge
    return torch.randn(rows * rows, channels * frames * side * side), torch.tensor([[1, rows, rows]])


def audio_forms(config: Any, inputs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The other forms of an audio model's inputs (:func:`candidate_inputs`), by name: its
    features in the other layout ("features transposed": Whisper's are (batch, mel bins, frames),
    Parakeet's (batch, frames, mel bins)), at the mel bins of its encoder's config where the
    model's own has none, or frames stacked to its feature projection's width (w2v-BERT's); its
    samples on a channel of their own (a codec's), or a spectrogram of its config's frames and mel
    bins (AST's); for rows of embeddings or latents, each channel a row ("channels first": a
    convolutional decoder's, VibeVoice's or Mimi's), or, where the config counts its audio's
    channels, its samples on those (VibeVoice's encoder's, whose one input is named as hidden
    states)."""
    import torch

    candidates: dict[str, dict[str, Any]] = {}
    if "input_features" in inputs:
        candidates["features transposed"] = {**inputs, "input_features": inputs["input_features"].transpose(1, 2)
                                             .contiguous()}
        for bins in _held(config, "num_mel_bins"):  # an encoder's own, where the whole model's config has none
            if bins != inputs["input_features"].shape[1]:
                features = torch.randn(1, bins, 3000)
                candidates[f"{bins} mel bins"] = {**inputs, "input_features": features}
                candidates[f"{bins} mel bins transposed"] = {**inputs, "input_features": features.mT.contiguous()}
        for width in _held(config, "feature_projection_input_dim"):  # w2v-BERT's: frames stacked in twos
            candidates[f"frames of {width}"] = {**inputs, "input_features": torch.randn(1, 1500, width)}
    if "input_values" in inputs:  # a codec's samples: (batch, channels, samples)
        candidates["samples on a channel"] = {**inputs, "input_values": inputs["input_values"].unsqueeze(1)}
        frames, bins = _field(config, "max_length"), _field(config, "num_mel_bins")
        if isinstance(frames, int) and isinstance(bins, int):  # AST's: a spectrogram, (batch, frames, mel bins)
            candidates["spectrogram"] = {**inputs, "input_values": torch.randn(1, frames, bins)}
    rows = [n for n, v in inputs.items() if n.endswith(("_embeds", "hidden_states", "latents")) and v.dim() == 3]
    if rows:  # a codec's latents, a convolutional decoder's: (batch, channels, frames)
        candidates["channels first"] = {**inputs, **{n: inputs[n].mT.contiguous() for n in rows}}
        channels = _field(config, "channels")
        if isinstance(channels, int) and list(inputs) == rows:  # a codec's encoder's, its one input: its audio
            candidates["samples on its channels"] = {rows[0]: torch.randn(1, channels, 8000)}
    return candidates


def example_inputs(model: Any, config: Any) -> dict[str, Any]:
    """Keyword inputs for ``model``'s main input and each further one its ``forward`` requires
    (Blip-2's text beside its image, a vision tower's image where its main input is named
    otherwise), by name (:func:`named_input`); for an encoder-decoder, its decoder tokens; for a
    text-and-image model, its image, or its text where the image is its main input;
    ``ValueError`` for an input of another kind."""
    import torch

    params = inspect.signature(model.forward).parameters
    required = [n for n, p in params.items()
                if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    main = model.main_input_name
    names = required if required and main not in params else list(dict.fromkeys([main, *required]))
    # SigLIP 2's image: its patches flattened, their grid beside them
    inputs = patch_rows(config) if "spatial_shapes" in params else {}
    for name in names:
        if name in inputs:
            continue
        made = named_input(name, model, config)
        if made is None:
            raise ValueError(f"no example for a{' main' if name == main else ' required'} input {name!r}")
        inputs[name] = made
    if "input_ids" in inputs and "pixel_values" not in inputs and "pixel_values" in params and \
            getattr(config, "vision_config", None) is not None:
        inputs["pixel_values"] = _image(config)
    if "pixel_values" in inputs and getattr(config, "text_config", None) is not None:
        # a text-and-image model whose main input is its image (InstructBLIP): its text too, and
        # where it reads one, its query former's (the instruction)
        for name in ("input_ids", "qformer_input_ids"):
            if name in params and name not in inputs:
                inputs[name] = named_input(name, model, config)
    queries = getattr(config, "latent_query_num", None)
    if "image_embeds_position_mask" in params and isinstance(queries, int) and "input_ids" in inputs:
        # Kosmos-2's: its image's latent queries take places in the text, which a mask marks
        text = inputs["input_ids"]
        inputs["input_ids"] = torch.cat([tokens(config, queries), text], dim=1)
        inputs["image_embeds_position_mask"] = torch.cat([torch.ones(1, queries, dtype=torch.long),
                                                          torch.zeros_like(text)], dim=1)
    if "past_values" in inputs and "past_values_padding" in params:  # TimesFM 2.5's, where it may be left out
        inputs["past_values_padding"] = named_input("past_values_padding", model, config)
    if "prompt_masks" in inputs:  # SegGPT's canvas holds its image above the prompt's: each is half its height
        inputs.update({name: value[:, :, :value.shape[2] // 2].clone() for name, value in inputs.items()
                       if name in ("pixel_values", "prompt_pixel_values", "prompt_masks")})
    if "states" in inputs:  # a trajectory's other parts, which its forward may be called without but reads
        inputs.update({name: named_input(name, model, config) for name in ("actions", "returns_to_go", "timesteps")
                       if name in params})
    if getattr(config, "is_encoder_decoder", False) and \
            (main == "input_ids" or "decoder_input_ids" in params):
        inputs["decoder_input_ids"] = tokens(config, 8)  # a translator's, a speech recogniser's
    return inputs


def patch_rows(config: Any) -> dict[str, Any]:
    """A native-resolution tower's image as its processor makes it (SigLIP 2's): a 16 x 16 grid
    of patches, one row each (channels x side x side values), every row real (no padding), and
    the grid's (rows, columns) beside them."""
    import torch

    grid = 16
    side, channels = _size(config, "patch_size", 16), _size(config, "num_channels", 3)
    return {"pixel_values": torch.randn(1, grid * grid, channels * side * side),
            "pixel_attention_mask": torch.ones(1, grid * grid, dtype=torch.long),
            "spatial_shapes": torch.tensor([[grid, grid]])}


def tokens(config: Any, count: int) -> Any:
    """``count`` random tokens, past the first three (which are often special) and below 100, or
    below the smallest vocabulary the config holds where that is smaller (VITS's 38 characters)."""
    import torch

    return torch.randint(3, min([100, *_held(config, "vocab_size")]), (1, count))


def named_input(name: str, model: Any, config: Any) -> Any:
    """An example of the input ``name``, by what its name says it is (16 tokens, an image at its
    config's size, a video clip, 16 rows of embeddings at the width of the model or of what it
    attends to, or one of :func:`by_name`), or None for a name of no such kind."""
    import torch

    if name.endswith("input_ids"):  # Blip-2's text, InstructBLIP's query-former's
        return tokens(config, 16)
    if name.endswith("pixel_values"):  # SegGPT's prompt image too
        frames = getattr(config, "num_frames", None)  # a video model's clip: (batch, frames, channels, side, side)
        image = _image(config)
        return image.unsqueeze(1).expand(-1, frames, -1, -1, -1).clone() if isinstance(frames, int) else image
    if name.endswith(("_embeds", "hidden_states", "latents")):  # an input at a width of the model, 16 rows of it:
        width = _size(config, "hidden_size", 64)  # its own, or what it attends to (BLIP-2's Q-Former, its image's)
        return torch.randn(1, 16, _size(config, "encoder_hidden_size", width) if name.startswith("encoder_") else width)
    made = by_name().get(name)
    return made(config) if made is not None else None


def _boxes(config: Any) -> Any:
    """16 boxes, (x0, y0, x1, y1) within the image, as fractions of its sides."""
    import torch

    corners = torch.rand(1, 16, 2, 2).sort(dim=2).values  # each box's least (x, y), then its greatest
    return corners.reshape(1, 16, 4)


def _clip(config: Any) -> Any:
    """A video's frames, (batch, frames, channels, side, side): as many as the config says, else 8."""
    frames = (_held(config, "num_frames") or [8])[0]
    return _image(config).unsqueeze(1).expand(-1, frames, -1, -1, -1).clone()


def _past_values(config: Any) -> Any:
    """A forecaster's history: (batch, steps), of each channel where it has several."""
    import torch

    steps, channels = _history(config), getattr(config, "num_input_channels", None)
    return torch.randn(1, steps, channels) if isinstance(channels, int) else torch.randn(1, steps)


@functools.cache
def by_name() -> dict[str, Any]:
    """The inputs :func:`named_input` makes by their whole name, each from the config: a function
    of it (built at first use: a worker's, which imports torch, not the process that starts them)."""
    import torch

    return {
        "input_values": lambda c: torch.randn(1, 8000),  # audio samples
        "input_features": lambda c: torch.randn(1, _size(c, "num_mel_bins", 80), 3000),  # (batch, mel bins, frames)
        "input_features_mask": lambda c: torch.ones(1, 3000, dtype=torch.long),  # a speech encoder's: all real
        # Gemma 3n's audio tower's: (batch, frames, mel bins), and which frames are padding (none)
        "audio_mel": lambda c: torch.randn(1, 3000, _size(c, "input_feat_size", 128)),
        "audio_mel_mask": lambda c: torch.zeros(1, 3000, dtype=torch.bool),
        "bbox": _boxes,  # a document model's words' boxes
        "visual_pos": _boxes,  # LXMERT's regions'
        "visual_feats": lambda c: torch.randn(1, 16, _size(c, "visual_feat_dim", 2048)),  # their detector's features
        "pixel_values_videos": _clip,
        "prompt_masks": _image,  # SegGPT's: its prompt image's mask, an image of its own (example_inputs halves it)
        "past_values": _past_values,
        "past_values_padding": lambda c: torch.zeros(1, _history(c)),  # TimesFM's: which steps are padding (none)
        "freq": lambda c: torch.zeros(1, 1, dtype=torch.long),  # TimesFM's frequency class
        # the time series transformers': (batch, steps, features), every step observed
        "past_time_features": lambda c: torch.randn(1, _history(c), _size(c, "num_time_features", 1)),
        "past_observed_mask": lambda c: torch.ones(1, _history(c)),
        # a trajectory of 16 steps (the Decision Transformer's): what was seen, done, still to earn, and when
        "states": lambda c: torch.randn(1, 16, _size(c, "state_dim", 17)),
        "actions": lambda c: torch.randn(1, 16, _size(c, "act_dim", 4)),
        "returns_to_go": lambda c: torch.randn(1, 16, 1),
        "timesteps": lambda c: torch.arange(16).unsqueeze(0),
    }


def _history(config: Any) -> int:
    """A forecaster's steps of history: its context, and as many before it as its longest lag
    reaches back (the time series transformers' lagged inputs)."""
    lags = getattr(config, "lags_sequence", None)
    return _size(config, "context_length", 512) + (max(lags) if lags else 0)


def resized_images(config: Any, inputs: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``inputs`` with their image (where they hold one) at each other size :func:`_image_sizes` finds."""
    import torch

    image = inputs.get("pixel_values")
    if image is None or image.dim() != 4:
        return {}
    return {f"{height} x {width}": {**inputs, "pixel_values": torch.randn(1, image.shape[1], height, width)}
            for height, width in _image_sizes(config) if (height, width) != tuple(image.shape[-2:])}


def _image_sizes(config: Any) -> list[tuple[int, int]]:
    """The (height, width) of each image size ``config`` or a sub-config names (``image_size``, one
    side or both), outermost first, each once: a backbone's, where the whole model names none."""
    sizes = []
    for c in _tree(config):
        size = _field(c, "image_size")
        pair = tuple(size) if isinstance(size, (list, tuple)) and len(size) == 2 else \
            (size, size) if isinstance(size, int) and not isinstance(size, bool) else None
        if pair is not None and all(isinstance(x, int) for x in pair) and pair not in sizes:
            sizes.append(pair)
    return sizes


def _image(config: Any) -> Any:
    """An image at the config's size (224 where it has none), of its channels."""
    import torch

    # (height, width) where a config gives both: SegGPT's, MGP-STR's
    size = next((s for c in (config, getattr(config, "vision_config", None)) if (s := _field(c, "image_size"))), None)
    pair = isinstance(size, (list, tuple)) and len(size) == 2
    height, width = size if pair else (_size(config, "image_size", 224),) * 2
    return torch.randn(1, _size(config, "num_channels", 3), height, width)


def first_line(e: BaseException, most: int = 400) -> str:
    """The error's type and first line, at most ``most`` characters of it: where longer, its head
    and its end, where opsched's messages say what to do (a failed check ends by whose the
    difference is), and between them the line of the model's code a refusal names."""
    line = (str(e).strip().splitlines() or [""])[0]
    if len(line) > most:
        head, tail = most // 3, len(line) - (most - most // 3)
        place = re.search(r" at \S+:\d+(?: in [\w<>.]+)?(?: \(`[^`]*`\))?", line)
        middle = " [...] "
        if place and place.start() < head:  # the head holds it whole
            head = max(head, place.end())
        elif place and place.end() <= tail:
            middle = f" [...]{place.group(0)} [...] "
        line = line if head >= tail else f"{line[:head]}{middle}{line[tail:]}"
    return f"{type(e).__name__}: {line}"


def check(architecture: str, max_params: float) -> dict[str, Any]:
    """One architecture built, called and optimized: its row."""
    import torch

    import opsched
    from opsched.check import draws_random
    from opsched.compare import largest_difference, scale
    from opsched.errors import OpschedError
    from opsched.testing import tensors

    row: dict[str, Any] = {"model": architecture}
    reasons = []
    for label, sizes, lists in (("small", SMALL, False), ("layers", LAYERS, False), ("small, lists", SMALL, True)):
        try:
            torch.manual_seed(0)
            config = as_checkpoints_name(shrunk(timm_free(default_config(architecture)), sizes))
            config = listed(config) if lists else config
            auto = auto_class(config)
            with torch.device("meta"):
                row["class"] = type(meta := auto.from_config(config)).__name__
            row["params_m"] = sum(p.numel() for p in meta.parameters()) / 1e6
            if row["params_m"] > max_params:
                reasons.append(f"{row['params_m']:.0f}M parameters")
                continue
            model = auto.from_config(config).eval()
            for form, inputs in candidate_inputs(model, config).items():
                row["form"] = form
                try:
                    want, inputs = called(model, config, inputs)
                    break
                except Exception as e:  # noqa: BLE001 (the next candidate, or the reason below)
                    reasons.append(first_line(e))
            else:
                continue
            row.update(config=label, inputs=sorted(inputs))
            # trained-looking weights: at its initialiser's, a CNN's activations shrink at every layer
            # (MobileNetV2's outputs were 4e-27 from eager's, where all of them were under 1e-20)
            want = _called_trained_looking(model, inputs)
            break
        except Exception as e:  # noqa: BLE001 (a config the generic rule cannot shrink: recorded, not opsched's)
            reasons.append(first_line(e))
    else:
        row.pop("form", None)
        errors = [r for r in reasons if not r.endswith(" parameters")]
        return {**row, "outcome": "not built" if errors else "too large", "error": (errors or reasons)[0]}
    # a tower's grid of patches (and VideoLLaMA3's merges, an image's size beside it) sets its sizes by
    # value: fixed, as a deployment at one image size fixes it; and a text-and-image model's prompt layout (which
    # tokens are the image's, from which Qwen2-VL computes its positions), as one template fixes it
    fixed = [k for k in inputs
             if k.endswith("grid_thw") or k in ("merge_sizes", "spatial_shapes", "mm_token_type_ids", "image_sizes")]
    if fixed:
        row["fixed"] = fixed
    start = time.perf_counter()
    try:
        try:
            module = opsched.optimize(model, inputs, cost="analytic", progress=False, fixed_values=fixed)
        except OpschedError as e:
            asked = masks_asked(str(e), inputs)
            if not asked:
                raise
            # as a user does what the refusal says: the masks its tokenizer would give, then again
            inputs = {**inputs, **asked}
            row.update(inputs=sorted(inputs), masks=sorted(asked))
            with torch.no_grad():
                want = model(**inputs)
            start = time.perf_counter()
            module = opsched.optimize(model, inputs, cost="analytic", progress=False, fixed_values=fixed)
        with torch.no_grad():
            got = module(**inputs)
    except OpschedError as e:
        return {**row, "outcome": "refused", "error": first_line(e), "compiled": through_compile(model, inputs, want)}
    except Exception as e:  # noqa: BLE001 (what opsched let escape: a bug of ours, with where)
        return {**row, "outcome": "failed", "error": first_line(e), "where": traceback.format_exc()[-2000:]}
    a, b = tensors(got), tensors(want)
    row.update(seconds=time.perf_counter() - start, operators=len(module.graph.nodes),
               opaque=sum(n.op == "opaque" for n in module.graph.nodes), outputs=len(b),
               scale=max((scale(t) for t in b if t.is_floating_point()), default=0.0))
    if len(a) != len(b):
        return {**row, "outcome": "failed", "error": f"{len(a)} output tensors against the model's {len(b)}"}
    row["max_diff"] = max((largest_difference(x, y) for x, y in zip(a, b)), default=0.0)
    drawn = [n.name for n in module.graph.nodes if draws_random(n)]
    if drawn:  # its difference from eager is its own draws' (Informer's sampled keys): the check's tolerance let it by
        row["draws"] = drawn
    else:
        row.update(beyond_tolerance(model, inputs, a, b))
    return {**row, "outcome": "equal"}


def beyond_tolerance(model: Any, inputs: dict[str, Any], got: list[Any], want: list[Any]) -> dict[str, Any]:
    """What optimize()'s check passed outputs ``got`` by where they are beyond float32's tolerance
    of eager's ``want``: as eager's with values that tie taken in another order (``reordered``:
    RT-DETR's queries, :func:`opsched.compare.reordering`), else as near the model run in float64
    as eager's (``float64``: :func:`against_float64`); nothing where they are within it."""
    from opsched.compare import largest_difference, reordering, tolerance

    if all(largest_difference(x, y) <= tolerance(y) for x, y in zip(got, want)):
        return {}
    tied = reordering([(x, y, tolerance(y)) for x, y in zip(got, want)])
    if tied is not None:
        return {"reordered": tied.describe()}
    return {"float64": against_float64(model, inputs, got, want)}


def against_float64(model: Any, inputs: dict[str, Any], got: list[Any], want: list[Any]) -> dict[str, float] | None:
    """How far opsched's outputs ``got`` and eager's ``want`` each are from the model's run in
    float64 (the largest difference over the outputs), for a row that optimize()'s check passed
    against float64 (:func:`opsched.compare.as_true`) because its outputs differ from eager's by
    more than float32's tolerance: where eager itself is as far as the outputs are large (D-FINE's
    detections, picked by top-k among scores that float32 orders otherwise), that pass says
    nothing, and the page says so; None where the model does not run in float64 (or returns
    no output there of eager's shape)."""
    import copy

    import torch

    from opsched.compare import largest_difference
    from opsched.testing import tensors

    try:
        with torch.no_grad():
            truth = tensors(copy.deepcopy(model).double()(
                **{k: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                   for k, v in inputs.items()}))
    except Exception:  # noqa: BLE001 (an op without a float64 kernel: nothing to hold them against)
        return None
    floating = [(x, y, t) for x, y, t in zip(got, want, truth) if y.is_floating_point() and t.shape == y.shape]
    if not floating:
        return None
    return {"opsched": max((largest_difference(x, t) for x, _, t in floating), default=0.0),
            "eager": max((largest_difference(y, t) for _, y, t in floating), default=0.0)}


def called(model: Any, config: Any, inputs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``model`` called on ``inputs`` in eager PyTorch, and the inputs it was called on: where it
    refuses for want of an input it may be called without, which its error names (Bros's "You
    have to specify bbox", LXMERT's "`visual_feats` cannot be `None`"), with that input too
    (:func:`named_input`), as often as it names another; the last error where it names none."""
    import torch

    params = inspect.signature(model.forward).parameters
    while True:
        try:
            with torch.no_grad():
                return model(**inputs), inputs
        except Exception as e:
            named = {n: made for n in params if n not in inputs and re.search(rf"\b{n}\b", str(e), re.IGNORECASE)
                     and (made := named_input(n, model, config)) is not None}
            if not named:
                raise
            inputs = {**inputs, **named}


def _called_trained_looking(model: Any, inputs: dict[str, Any]) -> Any:
    """``model`` made to look trained (:func:`opsched.testing.weights.trained_looking`: its zeroed
    parameters drawn, its batch norms' statistics those of its activations on ``inputs``), and
    what it returns for ``inputs`` then."""
    import torch

    from opsched.testing.weights import trained_looking

    with torch.no_grad():
        trained_looking(model, **inputs)
        return model(**inputs)


def masks_asked(error: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """The masks a refusal asks for ("pass attention_mask and decoder_attention_mask as its
    tokenizer or processor gives them"): all ones, as a tokenizer gives them for unpadded text,
    each the shape of the ids it masks; none where the refusal asks for none."""
    import torch

    found = re.search(r"pass (\w+(?: and \w+)*) as its tokenizer", error)
    masks = {}
    for name in found[1].split(" and ") if found else ():
        ids = inputs.get(name.replace("attention_mask", "input_ids"))
        if isinstance(ids, torch.Tensor):
            masks[name] = torch.ones_like(ids)
    return masks


def through_compile(model: Any, inputs: dict[str, Any], want: Any) -> dict[str, Any]:
    """``model`` through ``torch.compile(backend="opsched")``: the graphs Dynamo captured, those run
    eagerly, and the largest difference from ``want`` (None where the outputs differ in number or
    shape); or the error."""
    import torch

    import opsched.dynamo
    from opsched.compare import largest_difference
    from opsched.testing import tensors

    torch._dynamo.reset()
    opsched.dynamo.reset()
    try:
        compiled = torch.compile(model, backend="opsched",
                                 options={"cost": "analytic", "progress": False, "schedule_cache": False})
        with torch.no_grad():
            got = compiled(**inputs)
    except Exception as e:  # noqa: BLE001 (Dynamo's errors and ours alike: recorded)
        return {"error": first_line(e)}
    graphs = opsched.dynamo.compiled_graphs()
    a, b = tensors(got), tensors(want)
    alike = len(a) == len(b) and all(x.shape == y.shape for x, y in zip(a, b))  # VITS's length is drawn at random
    return {"graphs": len(graphs), "eager": sum(bucket.schedule is None for g in graphs for bucket in g.buckets),
            "max_diff": max(map(largest_difference, a, b), default=0.0) if alike else None}


def compiled_text(compiled: dict[str, Any] | None) -> str:
    if not compiled:
        return ""
    if "error" in compiled:
        return compiled["error"]
    diff = "outputs differ in number or shape" if compiled["max_diff"] is None else \
        f"max diff {compiled['max_diff']:.1e}"
    return f"{compiled['graphs']} graphs, {compiled['eager']} run eagerly; {diff}"


def worker(architectures: list[str], max_params: float) -> None:
    """Rows as lines on stdout, each architecture announced first (a crash then names it)."""
    import logging
    import warnings

    import torch

    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)
    for name in architectures:
        print("START " + name, flush=True)
        print("ROW " + json.dumps(check(name, max_params)), flush=True)


def run_chunk(chunk: list[str], args: argparse.Namespace) -> tuple[list[dict[str, Any]], list[str]]:
    """``chunk`` in one worker process: its rows, and the architectures it did not reach (after
    one that crashed it, which gets a row of its own)."""
    cmd = [sys.executable, __file__, "--worker", "--max-params", str(args.max_params), "--models", *chunk]
    rows: list[dict[str, Any]] = []
    current = None
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True) as p:
        timer = threading.Timer(args.timeout * len(chunk), p.kill)
        timer.start()
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("START "):
                current = line[6:].strip()
            elif line.startswith("ROW "):
                rows.append(json.loads(line[4:]))
                current = None
        code = p.wait()
        timer.cancel()
    done = {r["model"] for r in rows}
    left = [n for n in chunk if n not in done]
    if left:
        crashed = current or left[0]
        rows.append({"model": crashed, "outcome": "crashed", "error": f"the worker ended with {code}"})
        left.remove(crashed)
    return rows, left


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    from opsched.cli.table import format_table

    tally = collections.Counter(r["outcome"] for r in rows)
    equal = [r for r in rows if r["outcome"] == "equal"]
    about = [re.sub(r":\w+:`~?([^`]+)`", r"`\1`", " ".join(paragraph.split())).replace("``", "`")
             for paragraph in __doc__.split("\n\n")[:3]]
    lines = ["# Every transformers architecture through optimize()", "", *(f"{a}\n" for a in about),
             "| " + " | ".join(OUTCOMES) + " |", "|" + "---:|" * len(OUTCOMES),
             "| " + " | ".join(str(tally[o]) for o in OUTCOMES) + " |", ""]
    if equal:
        slow = sorted(equal, key=lambda r: -r["seconds"])[:5]
        lines += [f"Of the {len(equal)} equal: {passed_how(equal)}; "
                  f"{sum(r['opaque'] > 0 for r in equal)} with opaque nodes; operators "
                  f"{min(r['operators'] for r in equal)}-{max(r['operators'] for r in equal)}; "
                  f"{sum({'pixel_values', 'input_ids'} <= set(r['inputs']) for r in equal)} text-and-image models "
                  f"given both ({sum(r['form'].startswith(('image placed', 'a clip placed')) for r in equal)} with "
                  f"a token placed in the text for each of the image's features, "
                  f"{sum(r['form'] == 'image placed, in patches' for r in equal)} of them in rows of patches beside "
                  f"their grid), {sum(r['form'] == 'text alone' for r in equal)} their text alone; "
                  f"{sum(r['form'] == 'features transposed' for r in equal)} audio models given their features as "
                  f"(frames, mel bins); {sum(bool(r.get('fixed')) and 'input_ids' not in r['inputs'] for r in equal)} "
                  f"vision towers given their grid as a fixed value; optimize() took "
                  f"longest on " + ", ".join(f"{r['model']} ({r['seconds']:.0f} s)" for r in slow) + ".", ""]
    ours = [r for r in rows if r["outcome"] in ("refused", "failed", "crashed")]
    if ours:
        lines += ["## Refused, failed and crashed", "",
                  format_table(["model", "class", "outcome", "torch.compile(backend='opsched')", "error"],
                               [[r["model"], r.get("class", ""), r["outcome"], compiled_text(r.get("compiled")),
                                 r["error"]] for r in ours], markdown=True), ""]
    causes = collections.Counter(re.sub(r"\d+", "N", r["error"])[:90] for r in rows if r["outcome"] == "not built")
    if causes:
        lines += ["## Not built: the generic rule's limits (first error, digits as N; the 10 commonest)", "",
                  format_table(["models", "error"], [[n, c] for c, n in causes.most_common(10)], markdown=True), ""]
    md, js = write(args.name, "\n".join(lines), {"rows": rows, "tally": dict(tally)}, args.out)
    print(dict(tally))
    print(f"wrote {md} and {js}")


def passed_how(equal: list[dict[str, Any]]) -> str:
    """How the ``equal`` rows passed, as the page says it: within float32's tolerance of eager
    (the largest difference of those that draw no random numbers, and each that draws apart, its
    difference its draws' own), as eager's outputs with tied values in another order, or as near
    the model run in float64 as eager (:func:`judged`)."""
    within = [r for r in equal if "float64" not in r and "reordered" not in r]
    tied = [r for r in equal if "reordered" in r]
    held = [r for r in equal if "float64" in r]
    parts = [f"{len(within)} within float32's tolerance of eager's outputs"]
    if within:
        worst = max(within, key=lambda r: (not r.get("draws"), r["max_diff"]))  # one that draws none, where any
        parts[0] += (f", the largest difference {worst['max_diff']:.1e} ({worst['model']}) of those that draw no "
                     f"random numbers" + "".join(
                         f", and {r['max_diff']:.1e} for {r['model']}, which draws them ({len(r['draws'])} "
                         f"call{'s' * (len(r['draws']) > 1)}), so that its difference is its draws' own"
                         for r in within if r.get("draws")))
    if tied:
        parts.append(f"{len(tied)} eager's outputs with values that tie taken in another order (`opsched.compare."
                     f"reordering`): " + ", ".join(f"{r['model']} ({r['reordered']})" for r in tied))
    if held:
        parts.append(f"{len(held)} beyond float32's tolerance, and as near the model run in float64 as eager's own "
                     f"outputs are (`opsched.compare.as_true`): " + ", ".join(map(judged, held)))
    return "; ".join(parts)


def judged(row: dict[str, Any]) -> str:
    """An equal row that optimize()'s check held against the model run in float64, as the page
    names it: how far opsched's outputs are from eager's and from float64's, and eager's own from
    float64's; "undecided" where eager's are :data:`opsched.compare.UNDECIDED` of the outputs' scale
    from float64's or more, so that float32 computes nothing the check could hold a plan to."""
    from opsched.compare import UNDECIDED

    far = row.get("float64")
    if far is None:
        return f"{row['model']} ({row['max_diff']:.2g} from eager; the model does not run in float64)"
    undecided = ", undecided" if far["eager"] >= UNDECIDED * row["scale"] else ""
    return (f"{row['model']} ({row['max_diff']:.2g} from eager, of a scale of {row['scale']:.2g}; from float64 "
            f"{far['opsched']:.2g}, eager {far['eager']:.2g}{undecided})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", help="architectures (model types, as 'bert'); default: all")
    p.add_argument("--max-params", type=float, default=150, help="millions of parameters past which not to build")
    p.add_argument("--jobs", type=int, default=2, help="worker processes at once")
    p.add_argument("--chunk", type=int, default=8, help="architectures per worker process")
    p.add_argument("--timeout", type=float, default=120, help="seconds an architecture may take")
    p.add_argument("--name", default="transformers-all")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the .md and .json go")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        worker(args.models, args.max_params)
        return
    todo = list(args.models or architectures())
    chunks = [todo[i:i + args.chunk] for i in range(0, len(todo), args.chunk)]
    rows: list[dict[str, Any]] = []
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        pending = {pool.submit(run_chunk, c, args) for c in chunks}
        while pending:
            finished, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            for future in finished:
                made, left = future.result()
                for r in made:
                    rows.append(r)
                    print(f"[{len(rows)}/{len(todo)}] {r['model']}: {r['outcome']}", flush=True)
                if left:
                    pending.add(pool.submit(run_chunk, left, args))
    rows.sort(key=lambda r: todo.index(r["model"]))
    report(rows, args)


if __name__ == "__main__":
    main()

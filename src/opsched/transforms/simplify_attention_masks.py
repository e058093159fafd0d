"""Drop the attention masks that mask nothing, and turn a constant causal mask into ``is_causal``.

Traced, a ``transformers`` model's attention does not look like the same model run eagerly:
eagerly, its mask helpers see that no token is masked and call ``scaled_dot_product_attention``
with no mask (an encoder) or with ``is_causal=True`` (a decoder); under ``torch.export`` they
cannot skip it, and the graph carries the mask as a constant: all true (BERT, ViT, DINOv2, ...),
all zero (Swin's additive mask), or the lower triangle (GPT-2, Llama, ...). A mask costs kernels
of its own (the CPU kernel turns a boolean mask into an additive one, three kernels per call),
and on a GPU it rules out the flash-attention kernel. So, for a call whose mask is a constant:

* a boolean mask that is all true, or an additive one that is all zero, is dropped;
* a boolean mask equal to the lower triangle ``ones(L, S).tril()`` (broadcast over batch and
  heads) is dropped and the call made causal, which is the same mask by the operator's definition;
  so is an additive one that is zero on that triangle and -inf or its dtype's least value above it
  (``nn.Transformer.generate_square_subsequent_mask``, a decoder's ``finfo.min`` mask): every query
  reads its first key, so a key's weight where the mask is ``finfo.min`` is ``exp`` of
  ``finfo.min`` less a finite maximum, zero, as where it is -inf.

Either way the call computes what it did. A mask computed from the inputs is left alone.
"""

from __future__ import annotations

from typing import Any

import torch

from opsched.ir import Graph, Node
from opsched.ir.ops.aten import SDPA, encoded_arguments, overload
from opsched.transforms._rewrite import rename_uses

__all__ = ["simplify_attention_masks"]


def simplify_attention_masks(graph: Graph) -> Graph:
    changed = {n.name: new for n in graph.nodes
               if n.op.startswith("aten.") and n.attr("target") == SDPA and (new := _simplified(graph, n)) is not None}
    if not changed:
        return graph
    return rename_uses(graph, [changed.get(n.name, n) for n in graph.nodes], {})


def _simplified(graph: Graph, node: Node) -> Node | None:
    names = [a.name for a in overload(SDPA)._schema.arguments]
    args, kwargs = list(node.attrs["args"]), dict(node.attrs["kwargs"])
    bound = encoded_arguments(node)
    mask_enc = bound.get("attn_mask", ("v", None))
    if mask_enc[0] != "p" or bound.get("is_causal", ("v", False)) != ("v", False):
        return None
    mask = graph.params[node.params[mask_enc[1]]]
    query, key = (_shape(graph, node, bound[k]) for k in ("query", "key"))
    if query is None or key is None:
        return None
    length, source = query[-2], key[-2]
    if (mask.dtype == torch.bool and bool(mask.all())) or (mask.is_floating_point() and not bool(mask.any())):
        causal = False
    elif _causal(mask, length, source):
        causal = True
    else:
        return None
    changes = {"attn_mask": ("v", None), **({"is_causal": ("v", True)} if causal else {})}
    for key_name, enc in changes.items():
        position = names.index(key_name)
        if key_name in kwargs or position >= len(args):
            kwargs[key_name] = enc
        else:
            args[position] = enc
    dropped = mask_enc[1]
    params = node.params[:dropped] + node.params[dropped + 1:]
    attrs = {**node.attrs, "args": tuple(_renumbered(a, dropped) for a in args),
             "kwargs": tuple((k, _renumbered(v, dropped)) for k, v in kwargs.items())}
    return node.replace(attrs=attrs, params=params)


def _causal(mask: torch.Tensor, length: int, source: int) -> bool:
    """Whether ``mask`` (boolean, or additive) keeps the lower triangle of ``length`` queries by
    ``source`` keys and hides the rest, broadcast over batch and heads (module docstring)."""
    kept = torch.ones(length, source, dtype=torch.bool, device=mask.device).tril()
    if mask.dtype == torch.bool:
        return bool((mask == kept).all())
    if not mask.is_floating_point():
        return False
    hidden = (mask == float("-inf")) | (mask == torch.finfo(mask.dtype).min)
    return bool(torch.where(kept, mask == 0, hidden).all())


def _shape(graph: Graph, node: Node, enc: Any) -> tuple[int, ...] | None:
    tag, k = enc
    if tag == "t":
        return tuple(graph.types[node.inputs[k]].shape)
    if tag == "p":
        return tuple(graph.params[node.params[k]].shape)
    return None


def _renumbered(enc: Any, dropped: int) -> Any:
    """``enc`` with the parameter references past ``dropped`` moved down by one."""
    tag, value = enc
    if tag == "p" and value > dropped:
        return ("p", value - 1)
    if tag == "list":
        return ("list", tuple(_renumbered(v, dropped) for v in value))
    return enc

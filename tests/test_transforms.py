"""Graph rewrites checked on their own: what each pass changes, exactly, and that the model still
computes what it did, on the torch and ONNX Runtime backends."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opsched
from opsched.ir.ops.aten import arguments
from opsched.testing import assert_close
from opsched.transforms import simplify_attention_masks
from opsched.transforms.simplify_attention_masks import SDPA

L, S, E = 6, 6, 8


class Attention(nn.Module):
    """One attention call whose mask is a constant (a buffer, as ``transformers`` models build
    theirs under tracing), or the model's second input."""

    def __init__(self, mask: torch.Tensor | None) -> None:
        super().__init__()
        self.mask = mask

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        q, k, v = (x * s for s in (1.0, 0.5, 2.0))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask if mask is None else mask)


def _attention(graph: opsched.Graph) -> opsched.ir.Node:
    (node,) = [n for n in graph.nodes if n.attr("target") == SDPA]
    return node


def _masks() -> dict[str, tuple[torch.Tensor, str]]:
    """Masks by name, with what the pass makes of each: dropped, causal or kept."""
    torch.manual_seed(0)
    causal = torch.ones(L, S, dtype=torch.bool).tril()
    some = torch.rand(1, 1, L, S) > 0.3
    some[..., 0] = True  # no row masked whole
    return {
        "all true": (torch.ones(1, 1, L, S, dtype=torch.bool), "dropped"),
        "all true, broadcast over rows": (torch.ones(1, S, dtype=torch.bool), "dropped"),
        "all zero": (torch.zeros(1, 2, L, S), "dropped"),
        "lower triangle": (causal.expand(1, 2, L, S).clone(), "causal"),
        "lower triangle, 2-d": (causal, "causal"),
        "upper triangle": (causal.T.contiguous(), "kept"),
        "some masked": (some, "kept"),
        "additive, not zero": (torch.randn(1, 1, L, S), "kept"),
        "one element, true": (torch.ones(1, 1, dtype=torch.bool), "dropped"),
    }


@pytest.mark.parametrize("case", list(_masks()))
def test_constant_attention_masks_that_mask_nothing_go_and_a_causal_one_becomes_is_causal(case: str) -> None:
    mask, becomes = _masks()[case]
    model = Attention(mask).eval()
    x = torch.randn(1, 2, L, E)
    graph = opsched.from_torch(model, (x,))
    node = _attention(graph)
    args = arguments(node)
    if becomes == "kept":
        assert len(node.params) == 1 and "attn_mask" not in args and not args.get("is_causal", False)
    else:
        assert node.params == () and args["attn_mask"] is None and not graph.params
        assert args.get("is_causal", False) == (becomes == "causal")
    with torch.no_grad():
        expected = model(x)
        for backend in ("torch", "ort"):
            module = opsched.optimize_graph(graph, scheduler="sequential", cost="analytic", backend=backend,
                                            check=False)
            assert_close(module(x), expected, f"{case} on {backend}")


def test_a_mask_computed_from_the_inputs_is_kept() -> None:
    model = Attention(None).eval()
    x, mask = torch.randn(1, 2, L, E), torch.ones(1, 1, L, S, dtype=torch.bool)
    graph = opsched.from_torch(model, (x, mask))
    assert simplify_attention_masks(graph) is graph
    assert _attention(graph).inputs[-1] == graph.inputs[1].name

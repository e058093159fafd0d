"""Graph rewrites checked on their own: what each pass changes, exactly, and that the model still
computes what it did, on the torch and ONNX Runtime backends."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import opsched
from opsched.ir.ops.aten import SDPA, arguments
from opsched.testing import assert_close
from opsched.transforms import fold_batch_norm, simplify_attention_masks

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
        "additive lower triangle of -inf": (nn.Transformer.generate_square_subsequent_mask(L), "causal"),
        "additive lower triangle of finfo.min": (torch.zeros(1, 1, L, S).masked_fill(~causal, torch.finfo().min),
                                                 "causal"),
        "additive lower triangle of -1e4": (torch.zeros(L, S).masked_fill(~causal, -1e4), "kept"),
        "additive upper triangle of -inf": (torch.zeros(L, S).masked_fill(causal, float("-inf")), "kept"),
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


def _repeat_heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``transformers``' ``repeat_kv``: each key/value head repeated for its group of query heads."""
    b, heads, length, width = x.shape
    return x[:, :, None, :, :].expand(b, heads, groups, length, width).reshape(b, heads * groups, length, width)


class GroupedQueryAttention(nn.Module):
    """4 query heads over 2 key/value heads, the heads repeated as ``transformers`` does under
    tracing; ``how`` breaks the pattern in one way or another."""

    def __init__(self, how: str = "repeated") -> None:
        super().__init__()
        self.how = how

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
        k, v = k * 0.5, v - 1.0
        key = _repeat_heads(k, 2)
        value = v.repeat(1, 2, 1, 1) if self.how == "value tiled" else _repeat_heads(v, 2)
        if self.how == "along the sequence":
            key = k[:, :, :, None].expand(1, 2, S, 2, E).reshape(1, 2, 2 * S, E)
            value = v[:, :, :, None].expand(1, 2, S, 2, E).reshape(1, 2, 2 * S, E)
            q = q[:, :2]
        out = F.scaled_dot_product_attention(q, key, value, is_causal=True)
        return (out, key) if self.how == "repeat returned" else out


@pytest.mark.parametrize("how, folds", [("repeated", True), ("repeat returned", True), ("value tiled", False),
                                        ("along the sequence", False)])
def test_repeated_key_and_value_heads_fold_into_grouped_query_attention(how: str, folds: bool) -> None:
    model = GroupedQueryAttention(how).eval()
    q, k, v = torch.randn(1, 4, L, E), torch.randn(1, 2, S, E), torch.randn(1, 2, S, E)
    graph = opsched.from_torch(model, (q, k, v))
    node = _attention(graph)
    assert arguments(node).get("enable_gqa", False) == folds
    repeats = [n for n in graph.nodes if n.attr("target") == "aten::expand.default"]
    if folds:
        key, value = (node.inputs[ref[1]] for ref in node.attrs["args"][1:3])
        assert graph.types[key].shape == graph.types[value].shape == (1, 2, S, E)  # the heads as they were
        assert len(repeats) == (1 if how == "repeat returned" else 0)  # the returned repeat stays
    with torch.no_grad():
        expected = model(q, k, v)
        for backend in ("torch", "ort"):
            module = opsched.optimize_graph(graph, scheduler="sequential", cost="analytic", backend=backend,
                                            check=False)
            assert_close(module(q, k, v), expected, f"{how} on {backend}")
            if backend == "ort":  # every step in the session
                assert "run with torch" not in module.executor.describe(), module.executor.describe()


def test_grouped_query_attention_runs_in_one_onnx_runtime_session() -> None:
    """``enable_gqa``, which torch.onnx's export refuses, exports with the heads repeated first."""
    class Direct(nn.Module):
        def forward(self, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q * 2.0, kv, kv, enable_gqa=True).sum(dim=-1)

    q, kv = torch.randn(1, 6, L, E), torch.randn(1, 2, S, E)
    graph = opsched.from_torch(Direct(), (q, kv))
    module = opsched.optimize_graph(graph, scheduler="sequential", cost="analytic", backend="ort", check=False)
    assert "run with torch" not in module.executor.describe(), module.executor.describe()
    with torch.no_grad():
        assert_close(module(q, kv), Direct()(q, kv), "grouped-query attention in ONNX Runtime")


@pytest.mark.parametrize("dtype, width, masked, capability, repeats", [
    ("float16", 8, False, (9, 0), False),   # flash attention takes the heads as they are
    ("bfloat16", 256, False, (8, 0), False),
    ("float32", 8, False, (9, 0), True),    # no fused kernel for float32 grouped heads: the math one
    ("float16", 8, True, (9, 0), True),     # nor for a masked call
    ("float16", 512, False, (9, 0), True),  # nor for heads over 256 wide
    ("float16", 8, False, (7, 5), True),    # nor before sm80
])
def test_on_a_gpu_grouped_attention_repeats_its_heads_where_no_fused_kernel_takes_them(
        monkeypatch: pytest.MonkeyPatch, dtype: str, width: int, masked: bool, capability: tuple[int, int],
        repeats: bool) -> None:
    """Which grouped-query calls the kernel runs on repeated heads, decided on a GPU's facts (here
    stood in for), and that the repeated-heads kernel computes what the call does."""
    from opsched.ir.ops import aten

    class Grouped(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mask = torch.rand(1, 1, L, S) > 0.2 if masked else None
            if self.mask is not None:
                self.mask[..., 0] = True

        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return F.scaled_dot_product_attention(q, k + 1.0, v, attn_mask=self.mask, enable_gqa=True)

    model = Grouped()
    q, k, v = torch.randn(1, 4, L, width), torch.randn(1, 2, S, width), torch.randn(1, 2, S, width)
    graph = opsched.from_torch(model, (q, k, v))
    node = _attention(graph)
    assert not aten._repeats_heads_itself(graph, node)  # on this CPU: the call as it is
    monkeypatch.setattr(aten, "_placement", lambda g, n: (torch.device("cuda"), getattr(torch, dtype)))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability)
    assert aten._repeats_heads_itself(graph, node) == repeats
    monkeypatch.setattr(aten, "_placement", lambda g, n: (torch.device("cpu"), torch.float32))
    add = next(n for n in graph.nodes if n.attr("target") == "aten::add.Tensor")
    values = {"q": q, "k": k, "v": v, add.name: k + 1.0}
    call = [values[name] for name in node.inputs]
    with torch.no_grad():
        assert_close(aten._heads_repeated(graph, node)(*call), aten._overload_call(graph, node)(*call),
                     "grouped attention on repeated heads")


def test_a_batch_norm_folds_into_a_bias_free_convolution_on_the_device_of_its_weights() -> None:
    """GoogLeNet's and Inception's convolutions have no bias: the fold makes one, where the
    weights are (it was made on the CPU, and a CUDA model's import failed on mixing devices;
    the meta device stands in for CUDA here)."""
    model = nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8)).eval()
    raw = opsched.from_torch(model, torch.randn(1, 3, 8, 8), canonical=False)
    on_meta = raw.replace(params={k: v.to("meta") for k, v in raw.params.items()})
    folded = fold_batch_norm(on_meta)
    assert [n.op for n in folded.nodes] == ["conv2d"]
    (conv,) = folded.nodes
    assert [folded.params[p].device.type for p in conv.params] == ["meta", "meta"]
    assert folded.params[conv.params[1]].shape == (8,)

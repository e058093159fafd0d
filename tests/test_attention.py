"""``scaled_dot_product_attention`` in ONNX Runtime (:mod:`opsched.ir.ops.attention`): the fused
``MultiHeadAttention`` where the scores are large, torch.onnx's form elsewhere, both equal to
eager, fully hidden queries included."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import opsched
from opsched.backends.ort_export import export_segment
from opsched.ir import Graph
from opsched.ir.ops import attention


class _Attention(torch.nn.Module):
    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.options = options

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, *mask, **self.options)


def _ops(graph: Graph) -> list[str]:
    """The ONNX operators of ``graph`` exported as one segment, as the ort backend makes it."""
    proto = export_segment(graph, [(n.name,) for n in graph.nodes], [i.name for i in graph.inputs],
                           graph.outputs).proto
    return [n.op_type for n in proto.graph.node]


def _hidden_rows(mask: torch.Tensor) -> torch.Tensor:
    """``mask`` (bool, kept where True) with batch 0's queries 1 and 3 reading no key."""
    mask = mask.clone()
    mask[0, ..., 1, :] = False
    mask[0, ..., 3, :] = False
    return mask


def _float(mask: torch.Tensor) -> torch.Tensor:
    return torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))


torch.manual_seed(0)
_Q, _K, _V = torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 16), torch.randn(2, 4, 8, 32)
_KEYS = torch.rand(2, 1, 1, 8) > 0.3
_SQUARE = _hidden_rows(torch.rand(2, 1, 8, 8) > 0.3)

#: (options, operands) of calls the fused operator computes as PyTorch does.
FUSED_CALLS: dict[str, tuple[dict[str, Any], tuple[torch.Tensor, ...]]] = {
    "plain": ({}, (_Q, _K, _V)),
    "scale": ({"scale": 0.2}, (_Q, _K, _V)),
    "causal": ({"is_causal": True}, (_Q, _K, _V)),
    "cross: more keys than queries": ({}, (_Q, torch.randn(2, 4, 11, 16), torch.randn(2, 4, 11, 32))),
    "float mask per head": ({}, (_Q, _K, _V, torch.randn(2, 4, 8, 8))),
    "float mask of rank 2": ({}, (_Q, _K, _V, torch.randn(8, 8))),
    "bool mask over keys": ({}, (_Q, _K, _V, _KEYS)),
    "bool mask, queries reading no key": ({}, (_Q, _K, _V, _SQUARE)),
    "float mask, queries reading no key": ({}, (_Q, _K, _V, _float(_SQUARE))),
    "grouped heads": ({"enable_gqa": True}, (torch.randn(1, 8, 8, 16), torch.randn(1, 2, 8, 16),
                                             torch.randn(1, 2, 8, 16))),
}


#: The fused form needs ONNX Runtime 1.22 or later (attention._fusing_runtime).
fusing = pytest.mark.skipif(not attention._fusing_runtime(), reason="ONNX Runtime before 1.22: nothing is fused")


@fusing
@pytest.mark.parametrize("case", list(FUSED_CALLS))
def test_attention_with_large_scores_runs_as_onnx_runtimes_fused_operator_equal_to_eager(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With the size rule at 0 bytes, each call the fused operator computes as PyTorch does runs
    in it (one MultiHeadAttention, no Softmax), equal to eager within float32 rounding; a query
    that every key is hidden from reads zeros, as PyTorch's, not the operator's NaN."""
    monkeypatch.setattr(attention, "FUSED_FROM_BYTES", 0)
    options, operands = FUSED_CALLS[case]
    model = _Attention(**options)
    graph = opsched.from_torch(model, operands)
    ops = _ops(graph)
    assert ops.count("MultiHeadAttention") == 1 and "Softmax" not in ops, ops
    made = opsched.optimize_graph(graph, scheduler="sequential", backend="ort")(*operands)
    expected = model(*operands)
    assert not expected.isnan().any()
    torch.testing.assert_close(made, expected, atol=2e-6, rtol=1e-5)


#: Calls the fused operator does not compute as PyTorch does, with why.
UNFUSED_CALLS: dict[str, tuple[dict[str, Any], tuple[torch.Tensor, ...]]] = {
    "float64: the CPU kernel's one dtype is float32": ({}, tuple(t.double() for t in (_Q, _K, _V))),
    "rank 3": ({}, (_Q[0], _K[0], _V[0])),
    "causal over more keys than queries: aligned otherwise": (
        {"is_causal": True}, (_Q, torch.randn(2, 4, 11, 16), torch.randn(2, 4, 11, 32))),
}


@pytest.mark.parametrize("case", list(UNFUSED_CALLS))
def test_attention_the_fused_operator_computes_otherwise_exports_as_torch_onnx_does(
        case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attention, "FUSED_FROM_BYTES", 0)
    options, operands = UNFUSED_CALLS[case]
    model = _Attention(**options)
    graph = opsched.from_torch(model, operands)
    ops = _ops(graph)
    assert "MultiHeadAttention" not in ops and "Softmax" in ops, ops
    made = opsched.optimize_graph(graph, scheduler="sequential", backend="ort")(*operands)
    torch.testing.assert_close(made, model(*operands))


@fusing
def test_attention_is_fused_from_64_mib_of_scores() -> None:
    """Below :data:`FUSED_FROM_BYTES` of scores the call exports as torch.onnx does (the fused
    operator is slower there on a small CPU), from it on fused (as fast, and an unmasked call's
    scores never held): 4 heads of 2,048 x 2,048 float32 scores are 64 MiB. Exported only."""
    assert attention.FUSED_FROM_BYTES == 64 << 20
    for tokens, fused in ((2047, False), (2048, True)):
        q = torch.randn(1, 4, tokens, 16)
        ops = _ops(opsched.from_torch(_Attention(), (q, q, q)))
        assert ("MultiHeadAttention" in ops) == fused and ("Softmax" in ops) != fused, (tokens, ops)


class _LearnedQuery(torch.nn.Module):
    """DETR's and SAM's kind of call: a query the model holds (a parameter) and a mask it keeps
    (a buffer, its query 2 reading no key)."""

    def __init__(self) -> None:
        super().__init__()
        self.query = torch.nn.Parameter(torch.randn(1, 4, 8, 16))
        mask = torch.randn(1, 1, 8, 11)
        mask[..., 2, :] = float("-inf")
        self.register_buffer("mask", mask)

    def forward(self, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(self.query, k, v, attn_mask=self.mask)


@pytest.mark.parametrize("fused", [pytest.param(True, marks=fusing), False])
def test_attention_on_the_models_own_tensors_in_either_form(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Operands that are the model's parameters and buffers become initializers once, as the
    form reads them: the unfused form made one it did not read for its query, which ONNX
    Runtime dropped, and then failed to take its weight (DETR, SAM, Kosmos-2 in the sweep)."""
    if fused:
        monkeypatch.setattr(attention, "FUSED_FROM_BYTES", 0)
    model, k, v = _LearnedQuery().eval(), torch.randn(1, 4, 11, 16), torch.randn(1, 4, 11, 32)
    graph = opsched.from_torch(model, (k, v))
    assert ("MultiHeadAttention" in _ops(graph)) == fused
    with torch.no_grad():
        made = opsched.optimize_graph(graph, scheduler="sequential", backend="ort")(k, v)
        expected = model(k, v)
    assert (expected[:, :, 2] == 0).all()
    torch.testing.assert_close(made, expected, atol=2e-6, rtol=1e-5)


def test_an_onnx_runtime_before_1_22_is_given_torch_onnxs_form(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its operator took no mask broadcast over batch or heads (1.20) and read the wrong rows of
    one broadcast over heads alone with more than one batch (fixed in 1.22)."""
    monkeypatch.setattr(attention, "FUSED_FROM_BYTES", 0)
    monkeypatch.setattr(attention, "_fusing_runtime", lambda: False)
    ops = _ops(opsched.from_torch(_Attention(), (_Q, _K, _V, _KEYS)))
    assert "MultiHeadAttention" not in ops and "Softmax" in ops, ops


def test_a_query_a_float_mask_hides_every_key_from_reads_zeros_in_torch_onnxs_form_too() -> None:
    """torch.onnx's form of a float mask gave NaN for a query whose every key is -inf, where
    PyTorch gives zeros; a mask of fewer dimensions than the output is taken as it broadcasts."""
    for mask in (_float(_SQUARE), _float(_SQUARE)[0, 0]):
        model = _Attention()
        operands = (_Q, _K, _V, mask)
        made = opsched.optimize_graph(opsched.from_torch(model, operands), scheduler="sequential",
                                      backend="ort")(*operands)
        expected = model(*operands)
        assert (expected[0, :, [1, 3]] == 0).all() and not made.isnan().any()
        torch.testing.assert_close(made, expected)


@fusing
def test_a_bert_with_large_attention_runs_it_fused_equal_to_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """A whole Hugging Face model, its padding mask included: its attention blocks' own
    Transposes of the heads meet the fused form's, and every block runs fused."""
    transformers = pytest.importorskip("transformers")
    monkeypatch.setattr(attention, "FUSED_FROM_BYTES", 0)
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, attn_implementation="sdpa")
    model = transformers.BertModel(config).eval()
    ids, mask = torch.randint(0, 100, (2, 12)), torch.ones(2, 12, dtype=torch.long)
    mask[1, 7:] = 0
    graph = opsched.from_torch(model, (ids, mask))
    assert _ops(graph).count("MultiHeadAttention") == 2
    made = opsched.optimize(model, (ids, mask), scheduler="sequential", progress=False)(ids, mask)
    torch.testing.assert_close(made.last_hidden_state, model(ids, mask).last_hidden_state, atol=1e-5, rtol=1e-5)


class _BiasedMask(torch.nn.Module):
    """T5's kind of mask: a bias the model holds where a key is kept, ``finfo.min`` (or -inf) where
    not, made from a boolean input."""

    def __init__(self, fill: float) -> None:
        super().__init__()
        self.fill = fill
        self.bias = torch.nn.Parameter(torch.randn(1, 4, 8, 8))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=torch.where(keep, self.bias, self.fill))


@pytest.mark.parametrize("fused", [pytest.param(True, marks=fusing), False])
@pytest.mark.parametrize("fill", [torch.finfo(torch.float32).min, float("-inf")])
def test_a_float_mask_that_cannot_hold_minus_inf_is_exported_without_zeroing_hidden_queries(
        fused: bool, fill: float, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding the queries a mask hides from every key (ReduceMax, Greater, Where) cost a padded T5
    encoder up to 5% of its time. A mask of ``finfo.min`` cannot hide a query so (its bounds,
    :mod:`opsched.ir.bounds`), and is exported without; one of -inf still is. Either way the
    module equals eager: a query whose every key is ``finfo.min`` reads the mean of the values,
    one whose every key is -inf reads zeros."""
    if fused:
        monkeypatch.setattr(attention, "FUSED_FROM_BYTES", 0)
    model = _BiasedMask(fill).eval()
    operands = (_Q[:1], _K[:1], _V[:1], _SQUARE[:1])
    graph = opsched.from_torch(model, operands)
    ops = _ops(graph)
    assert ("MultiHeadAttention" in ops) == fused
    assert ("ReduceMax" in ops) == (fill == float("-inf")), ops
    with torch.no_grad():
        made = opsched.optimize_graph(graph, scheduler="sequential", backend="ort")(*operands)
        expected = model(*operands)
    hidden, mean = expected[0, :, [1, 3]], _V[0].mean(1, keepdim=True)
    assert (hidden == 0).all() if fill == float("-inf") else torch.allclose(hidden, mean.expand_as(hidden), atol=1e-6)
    torch.testing.assert_close(made, expected, atol=2e-6, rtol=1e-5)


@pytest.mark.parametrize("mask", ["keys", "queries reading no key"])
def test_a_boolean_mask_is_made_additive_so_no_score_is_searched_for_nan(mask: str) -> None:
    """torch.onnx's form of a boolean mask finds a fully hidden query's NaN over every score
    (IsNaN and Where over batch x heads x queries x keys); opsched makes the mask additive first
    (0, or half the least float32), and the float form finds such queries on the mask and zeroes
    the output's rows by a Mul. Equal to eager, zeros included."""
    operands = (_Q, _K, _V, _KEYS if mask == "keys" else _SQUARE)
    graph = opsched.from_torch(_Attention(), operands)
    ops = _ops(graph)
    assert "IsNaN" not in ops and ops.count("Where") == 1 and ops[-3:] == ["Greater", "Cast", "Mul"], ops
    made = opsched.optimize_graph(graph, scheduler="sequential", backend="ort")(*operands)
    expected = _Attention()(*operands)
    assert (expected == 0).all(-1).sum() == (0 if mask == "keys" else 2 * 4)
    torch.testing.assert_close(made, expected)

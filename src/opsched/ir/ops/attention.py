"""``scaled_dot_product_attention`` in ONNX: as ONNX Runtime's fused ``MultiHeadAttention`` where
its scores are large and the call is one that operator computes, else as torch.onnx exports it.

torch.onnx writes the call as a scaled MatMul, Softmax and MatMul, which materialise every
head's full score matrix (batch x heads x queries x keys), twice over. ONNX Runtime's CPU kernel
computes an unmasked call in tiles (its flash path), never holding the scores, and a masked or
causal one holding them once. On two cores, at 2,048 tokens and 12 heads
(``benchmarks/attention_kernels.py``: time and peak memory over a call in a fresh process):

- unmasked: torch.onnx's form took 1.26x the fused form's time, its peak 198 MiB against 38;
- keys masked (a padded batch): 2.68x, 833 MiB against 273;
- causal: 0.98x, 384 MiB against 261.

On small calls the fused operator is the slower: at 128 tokens it took 1.5x the unfused form's
time, as each run wakes the threads its several parallel loops need (opsched's sessions let
threads spin within a run only, :mod:`opsched.backends.ort_program`). So the fused form is taken
from :data:`FUSED_FROM_BYTES` of scores on, where the two forms' times crossed. A whole BERT of
BERT-base's width at 2,048 tokens ran 1.14x faster so, at 74 MiB of peak memory over a call
against 259 (``--model``; eager PyTorch: 1.02x opsched's time, 124 MiB). The line is this
machine's: on more cores the fused operator's parallel loops pay sooner.

PyTorch's own kernel beat both forms on a lone masked call (1.9x at 2,048 tokens) and a causal
one (4.2x): it skips the hidden scores. Run outside the session, though, such
calls lost: GPT-2 (12 layers, 128 tokens) took 126 ms with them cut out against 81 ms with them
in the session (4 layers at 512 tokens: 1.03x faster), as each cut is a session run more, and
torch's OpenMP threads, spinning after its kernel, take the cores from the session after it
(a probe of such a rule, not kept).

The fused operator takes its query, key and value as (batch, tokens, heads x width), where the
call has (batch, heads, tokens, width), and gives its output so: each operand is transposed and
folded, the output unfolded and transposed back. A model's attention block has just made its
heads by the opposite Transpose (Hugging Face's ``view(...).transpose(1, 2)``) and folds them
back after, so ONNX Runtime's transpose optimizer cancels both pairs within a segment (a probe of
ViT-B/16 with every call fused: ONNX Runtime's optimized graph kept 1 of its 49 Transposes).

The fused form is taken for the calls the operator computes as PyTorch does: float32 (its CPU
kernel's one dtype), operands of rank 4 whose batch and heads agree (keys and values of fewer
heads with ``enable_gqa`` are repeated first, as below), no dropout, a mask that is additive
float32 or boolean (kept where True, as ``where(mask, 0, -inf)``) of the operator's shape or
broadcast to it, and ``is_causal`` only over as many keys as queries (the operator's
``unidirectional`` masks the same positions there), with ONNX Runtime 1.22 or later
(:func:`_fusing_runtime`). Any other call exports as torch.onnx does.
Either way, a query that every key is hidden from reads zeros, as in PyTorch (:func:`_read_rows`);
torch.onnx's export gave NaN there for a float mask. Where a float mask cannot hold -inf (its
bounds, :mod:`opsched.ir.bounds`: Hugging Face's masks of ``finfo.min``, T5's position biases
among them), no query is hidden so, and the zeroing is left out: on two cores it cost a padded
T5 encoder (4 layers, width 512) 0-5% of its time at 128 tokens and 2-3% at 1,024 (three runs
of ``benchmarks/attention_kernels.py --masked``). A boolean mask is made additive first
(:func:`_made_additive`), where torch.onnx's form of it finds the NaN over every score: a padded
BERT (BERT-base's width, 4 layers) ran 1.02x faster for it at 128 tokens and 1.22x at 512.

With ``enable_gqa``, which torch.onnx's export refuses, each key and value head is first
repeated for its group of query heads (Unsqueeze, Expand, Reshape: head ``h`` reads key head
``h // groups``, the operator's definition).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from opsched.ir.node import Node
from opsched.ir.ops.aten import SDPA, arguments, encoded_arguments
from opsched.ir.ops.registry import NotExportable
from opsched.ir.types import TensorType

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__ = ["ATTENTION_FORMS", "FusedAttention", "fused_attention"]

#: The operator set of ONNX Runtime's own operators, at the version its MultiHeadAttention is of.
MICROSOFT = ("com.microsoft", 1)

#: The dtypes of a mask whose fully hidden rows are found (:func:`_read_rows`), as NumPy's.
_FLOATS: dict[str, type[np.floating[Any]]] = {"float16": np.float16, "float32": np.float32, "float64": np.float64}

#: The fused form is taken where the unfused form's scores (batch x heads x queries x keys
#: float32 values) would take at least this many bytes (module docstring).
FUSED_FROM_BYTES = 64 << 20


@dataclass(frozen=True)
class FusedAttention:
    """A call as ``MultiHeadAttention`` computes it: its sizes, scale and how it masks."""

    batch: int
    heads: int
    queries: int
    keys: int
    width: int        # of a query's and a key's head
    value_width: int  # of a value's head
    scale: float
    causal: bool
    mask: TensorType | None  # as the call gives it (float32 or bool), broadcast to (batch, heads, queries, keys)


def fused_attention(node: Node, query: TensorType, key: TensorType, value: TensorType,
                    mask: TensorType | None) -> FusedAttention | None:
    """The fused form of the call ``node`` on operands of these types (keys and values already
    repeated for ``enable_gqa``), or None where the operator does not compute it as PyTorch does
    (module docstring)."""
    given = arguments(node)
    if not _fusing_runtime():
        return None
    if any(t.dtype != "float32" or t.rank != 4 for t in (query, key, value)) or node.out.dtype != "float32":
        return None
    (b, h, s, d), (_, _, t, _), dv = query.shape, key.shape, value.shape[-1]
    if key.shape != (b, h, t, d) or value.shape != (b, h, t, dv) or given.get("dropout_p", 0.0) != 0.0:
        return None
    causal = bool(given.get("is_causal", False))
    if causal and (s != t or mask is not None):
        return None
    if mask is not None:
        if mask.dtype not in ("float32", "bool") or mask.rank > 4:
            return None
        shape = _broadcast_shape(mask, 4)
        if any(m not in (1, full) for m, full in zip(shape, (b, h, s, t))):
            return None
    if 4 * b * h * s * t < FUSED_FROM_BYTES:
        return None
    scale = given.get("scale")
    return FusedAttention(b, h, s, t, d, dv, 1.0 / math.sqrt(d) if scale is None else float(scale), causal, mask)


@functools.cache
def _fusing_runtime() -> bool:
    """Whether the installed ONNX Runtime's operator takes a mask as the fused form gives it:
    broadcast over batch or heads since 1.20, and right for (batch, 1, ...) with more than one
    batch since 1.22 (its unfused CPU kernel read the wrong rows before)."""
    import onnxruntime

    return tuple(int(part) for part in onnxruntime.__version__.split(".")[:2]) >= (1, 22)


def _attention(b: OnnxBuilder, node: Node) -> None:
    """The call, fused where :func:`fused_attention` says it can be, else through torch.onnx's
    export; keys and values repeated first for ``enable_gqa`` (module docstring)."""
    from opsched.ir.ops.aten_export import export_as

    inputs, types = list(node.inputs), [b.graph.types[v] for v in node.inputs]
    kwargs = node.attrs["kwargs"]
    enc = encoded_arguments(node)
    if arguments(node).get("enable_gqa", False):
        query = b.operand_type(node, enc["query"])
        for name in ("key", "value"):
            tag, k = enc[name]
            if tag != "t" or query is None:
                raise NotExportable(f"{SDPA} with enable_gqa: its key and value must be inputs of the call")
            inputs[k], types[k] = _repeated_heads(b, node, inputs[k], types[k], query.shape[-3])
        kwargs = tuple((name, ("v", False) if name == "enable_gqa" else e) for name, e in kwargs)

    refs = [enc.get(name, ("v", None)) for name in ("query", "key", "value", "attn_mask")]

    def value(ref: tuple[str, Any]) -> str:
        """An operand's ONNX value; a parameter's made an initializer only now, once it is read
        (one left unread would be dropped by ONNX Runtime, its weights handed over for nothing)."""
        return inputs[ref[1]] if ref[0] == "t" else b.operand(node, ref)

    q_type, k_type, v_type, mask_type = (types[r[1]] if r[0] == "t" else b.operand_type(node, r) for r in refs)
    fused = None
    if q_type is not None and k_type is not None and v_type is not None:
        fused = fused_attention(node, q_type, k_type, v_type, mask_type)
    hides = _may_hide(b, node, refs[3], mask_type)
    if fused is not None:
        q, k, v, mask = map(value, refs)
        return _export_fused(b, node, fused, q, k, v, mask, hides)
    given = mask_type
    mask_type = _made_additive(b, node, inputs, types, refs[3], mask_type)
    if given is None or mask_type is None or mask_type.dtype not in _FLOATS or mask_type.rank > node.out.rank or \
            not hides:
        return export_as(b, node, SDPA, node.attrs["args"], kwargs, inputs, types)
    # PyTorch's zeros for a query every key is hidden from (_read_rows), where ONNX's Softmax gives NaN or, of
    # a boolean mask made additive, the mean of the values
    out = b.fresh(f"{node.name}_attended")
    export_as(b, node, SDPA, node.attrs["args"], kwargs, inputs, types, output=out)
    made = given.dtype == "bool"
    rows = _read_rows(b, node, _padded(b, node, value(refs[3]), mask_type, node.out.rank), mask_type.dtype, made)
    _zeroed(b, node, out, rows, node.out.dtype, made, node.name)


def _repeated_heads(b: OnnxBuilder, node: Node, value: str, t: TensorType, query_heads: int
                    ) -> tuple[str, TensorType]:
    """A key or value of ``t`` with each head repeated for its group of the query's heads."""
    groups = query_heads // t.shape[-3]
    if groups == 1:
        return value, t  # as many heads as the query's (already repeated, where the key is the value)
    lead, heads = list(t.shape[:-3]), t.shape[-3]
    shape = [*lead, heads, groups, *t.shape[-2:]]
    grown = b.add("Unsqueeze", [value, b.init(np.array([t.rank - 2], np.int64), "axis")],
                  b.fresh(f"{node.name}_heads"))
    grown = b.add("Expand", [grown, b.init(np.array(shape, np.int64), "shape")], b.fresh("expand"))
    repeated = (*lead, heads * groups, *t.shape[-2:])
    return (b.add("Reshape", [grown, b.init(np.array(repeated, np.int64), "shape")],
                  b.fresh(f"{node.name}_repeated")), TensorType(repeated, t.dtype))


def _may_hide(b: OnnxBuilder, node: Node, ref: tuple[str, Any], t: TensorType | None) -> bool:
    """Whether the mask ``ref`` (of ``t``) may hide a query from every key: a boolean one may, a
    float one where it may hold -inf (:mod:`opsched.ir.bounds`: a mask of ``finfo.min`` never
    does, whatever it is added to short of overflow)."""
    from opsched.ir.bounds import least

    return t is not None and (t.dtype not in _FLOATS or least(b.graph, ref, node) == -math.inf)


def _export_fused(b: OnnxBuilder, node: Node, f: FusedAttention, q: str, k: str, v: str, mask: str,
                  hides: bool) -> None:
    """``MultiHeadAttention`` on the operands moved to its layout, and its output moved back; a
    query the mask hides from every key read as zeros where it ``hides`` any (:func:`_read_rows`)."""
    b.declare(*MICROSOFT)
    heads_last = [0, 2, 1, 3]

    def folded(x: str, tokens: int, width: int, hint: str) -> str:
        moved = b.add("Transpose", [x], b.fresh(f"{node.name}_{hint}_tokens"), perm=heads_last)
        shape = b.init(np.array([f.batch, tokens, f.heads * width], np.int64), "shape")
        return b.add("Reshape", [moved, shape], b.fresh(f"{node.name}_{hint}_folded"))

    operands = [folded(q, f.queries, f.width, "query"), folded(k, f.keys, f.width, "key"),
                folded(v, f.keys, f.value_width, "value"), "", ""]
    rows, made = None, f.mask is not None and f.mask.dtype == "bool"
    if f.mask is not None:
        bias = _additive(b, node, mask, "float32") if made else mask
        bias = _padded(b, node, bias, f.mask, 4)
        rows = _read_rows(b, node, bias, "float32", made) if hides else None
        shape = _broadcast_shape(f.mask, 4)
        full = (*shape[:2], f.queries, f.keys)  # the operator's (batch or 1, heads or 1, queries, keys)
        if shape != full:
            bias = b.add("Expand", [bias, b.init(np.array(full, np.int64), "shape")], b.fresh(f"{node.name}_bias_full"))
        operands.append(bias)
    out = b.add("MultiHeadAttention", operands, b.fresh(f"{node.name}_fused"), domain=MICROSOFT[0],
                num_heads=f.heads, scale=f.scale, unidirectional=int(f.causal))
    out = b.add("Reshape", [out, b.init(np.array([f.batch, f.queries, f.heads, f.value_width], np.int64), "shape")],
                b.fresh(f"{node.name}_unfolded"))
    if rows is not None:
        rows = b.add("Transpose", [rows], b.fresh(f"{node.name}_rows_tokens"), perm=heads_last)
        out = _zeroed(b, node, out, rows, "float32", made, b.fresh(f"{node.name}_read"))
    b.add("Transpose", [out], node.name, perm=heads_last)


def _made_additive(b: OnnxBuilder, node: Node, inputs: list[str], types: list[TensorType], ref: tuple[str, Any],
                   t: TensorType | None) -> TensorType | None:
    """The type of the mask ``ref`` (of ``t``) as the unfused form takes it: a boolean one that is
    an input of the call made additive in ``inputs`` and ``types``, a float one of the output's
    dtype. torch.onnx's form of a boolean mask finds the NaN of fully hidden queries over every
    score (IsNaN and Where, batch x heads x queries x keys), where the float form finds them on
    the mask, once for every call that reads it, and zeroes the output's rows."""
    if t is None or t.dtype != "bool" or ref[0] != "t" or node.out.dtype not in _FLOATS or t.rank > node.out.rank:
        return t
    k, made = ref[1], TensorType(t.shape, node.out.dtype)
    inputs[k], types[k] = _additive(b, node, inputs[k], node.out.dtype), made
    return made


def _additive(b: OnnxBuilder, node: Node, mask: str, dtype: str) -> str:
    """A boolean ``mask`` (kept where True) made additive, of ``dtype``: 0 where kept, and where
    hidden, :func:`_far` (module docstring)."""
    kept, hidden = b.init(np.array(0.0, _FLOATS[dtype]), "kept"), b.init(_far(dtype), "hidden")
    return b.add("Where", [mask, kept, hidden], b.fresh(f"{node.name}_bias"))


def _far(dtype: str) -> np.ndarray:
    """How far a boolean mask made additive hides a key: half ``dtype``'s least value. A key's
    weight is then ``exp`` of it less its row's largest score, zero, as PyTorch's -inf makes it;
    but a query hidden from every key gets a finite softmax where -inf's is NaN, and a score added
    to it does not overflow to -inf, as one added to ``finfo.min`` may (by -16 in float16)."""
    return np.array(np.finfo(_FLOATS[dtype]).min / 2, _FLOATS[dtype])


def _padded(b: OnnxBuilder, node: Node, mask: str, t: TensorType, rank: int) -> str:
    """``mask`` (of ``t``) with leading axes of 1 up to ``rank``, as it broadcasts."""
    if t.rank == rank:
        return mask
    shape = np.array(_broadcast_shape(t, rank), np.int64)
    return b.add("Reshape", [mask, b.init(shape, "shape")], b.fresh(f"{node.name}_mask_rank{rank}"))


def _broadcast_shape(t: TensorType, rank: int) -> tuple[int, ...]:
    """``t``'s shape with leading axes of 1 up to ``rank``, as it broadcasts."""
    return (1,) * (rank - t.rank) + tuple(t.shape)


def _read_rows(b: OnnxBuilder, node: Node, bias: str, dtype: str, made: bool) -> str:
    """Which queries read any key, by an additive mask ``bias`` (of ``dtype``, its queries and keys
    its last two axes; ``made`` of a boolean one, :func:`_additive`): True or False of its shape
    with one key.

    PyTorch's softmax over a row of -inf alone is zeros (its "safe" softmax): a query that every
    key is hidden from (a padded token's, a fully masked row) reads nothing. ONNX's Softmax, and
    the fused operator's, make it NaN (of a mask made, the values' mean), so the output is zeroed
    where this is False (:func:`_zeroed`). It is found on the mask as the call gives it, before it
    is broadcast, where it is smallest, and once for all the calls that read it (ONNX Runtime
    eliminates common subexpressions)."""
    largest = b.add("ReduceMax", [bias, b.init(np.array([-1], np.int64), "axes")], b.fresh(f"{node.name}_largest"),
                    keepdims=1)
    hidden = _far(dtype) if made else np.array(-np.inf, _FLOATS[dtype])
    return b.add("Greater", [largest, b.init(hidden, "hidden")], b.fresh(f"{node.name}_rows"))


def _zeroed(b: OnnxBuilder, node: Node, out: str, rows: str, dtype: str, finite: bool, name: str) -> str:
    """``out`` (of ``dtype``) zeroed where ``rows`` is False: where it is ``finite`` there (of a
    mask made, :func:`_far`), times the rows as 0 or 1, which ONNX Runtime computes faster than the
    Where that NaN needs (with a Where, a padded BERT-base of 4 layers at 128 tokens took 1.04x
    the time: a probe, interleaved)."""
    from opsched.ir.ops.onnx_builder import ONNX_DTYPES

    if finite:
        scale = b.add("Cast", [rows], b.fresh(f"{node.name}_rows_scale"), to=ONNX_DTYPES[dtype])
        return b.add("Mul", [out, scale], name)
    return b.add("Where", [rows, out, b.init(np.array(0, _FLOATS[dtype]), "zero")], name)


#: The attention call's ONNX form, by target.
ATTENTION_FORMS = {SDPA: _attention}

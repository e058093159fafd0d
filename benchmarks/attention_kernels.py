"""Attention on this CPU: opsched's ONNX forms of ``scaled_dot_product_attention`` against ONNX
Runtime's fused attention operator alone and PyTorch's own kernel.

torch.onnx exports the call as a scaled MatMul, Softmax and MatMul, which materialises every
head's full score matrix. ONNX Runtime also has a fused operator,
``com.microsoft.MultiHeadAttention``, which its transformer optimizer writes; its CPU kernel
computes an unmasked call in tiles, never holding the scores, and a masked or causal one by
holding them once. opsched exports a call in it where the scores would take at least
``FUSED_FROM_BYTES`` (:mod:`opsched.ir.ops.attention`); this benchmark times one call each way,
and measures what each form adds to a fresh process's peak memory, to show where that line falls.

Contenders: *opsched*: what ``opsched.optimize`` returns for a module whose one call is
``F.scaled_dot_product_attention(q, k, v)`` (one ONNX Runtime session, plus the module's own
call), unmasked or, in the last rows, with a boolean mask hiding the last eighth of the keys
(a padded batch's) or ``is_causal`` (a decoder's); *fused form* and *unfused form*: the same,
with the fused form taken always and never (never: what opsched exported before); *ORT fused*:
an ONNX Runtime session of ``MultiHeadAttention`` alone, its inputs made once in its layout
(batch, tokens, heads x width), outside the timing (unmasked calls only); *torch*: the call in
eager PyTorch.

Each contender runs on 2 threads, in interleaved rounds within one process, in a fresh order
each round (:func:`opsched.timing.interleave`: 50 ms of sleep, so that no thread the previous
contender left spinning takes a core, then one untimed call and the median of ``--calls``
timed ones), the median over rounds. The fused operator's session lets its threads spin within
a run and stop as it returns, as opsched's one-session plans do. *peak MiB*: how far one call
raised the peak resident memory of a fresh process that made that form.

*A whole model* (``--model``): a BERT of BERT-base's width and heads, 4 layers, at 2,048
tokens (192 MiB of scores a layer): eager, and what ``opsched.optimize`` makes of it with
either form, timed interleaved, and each one's peak over a call in a fresh process.

*Masked models* (``--masked``), each padded (the last eighth of its tokens), at 128 tokens and
more: a T5 encoder (4 layers, width 512, 8 heads, as t5-small's), whose mask, its position
biases where a key is kept and ``finfo.min`` where not, cannot hide a query from every key, so
that opsched exports its attention without zeroing such queries (:mod:`opsched.ir.bounds`),
*before* forcing that zeroing (ReduceMax, Greater and Where each call, as opsched exported
every float mask before); and a BERT (BERT-base's width and heads, 4 layers), whose mask is
boolean, which opsched makes additive, *before* taking torch.onnx's boolean form (the NaN of a
fully hidden query found over every score, IsNaN and Where). *eager*: the model itself.

    python benchmarks/attention_kernels.py
    python benchmarks/attention_kernels.py --model
    python benchmarks/attention_kernels.py --masked
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _report import geomean, write_table  # noqa: E402
from torch import nn  # noqa: E402

import opsched  # noqa: E402
from opsched.ir.ops import attention  # noqa: E402
from opsched.timing import interleave  # noqa: E402

#: (tokens, heads, head width, masking): BERT-base's at 128 and 512 tokens, ViT-B/16's 197, long
#: sequences; the last two masked as a padded batch's keys and as a decoder's (``is_causal``).
SHAPES = ((128, 12, 64, ""), (197, 12, 64, ""), (512, 12, 64, ""), (1024, 8, 64, ""), (1024, 12, 64, ""),
          (2048, 4, 16, ""), (2048, 12, 64, ""), (2048, 12, 64, "keys"), (2048, 12, 64, "causal"))

#: The contenders opsched's time is divided by, in the last columns.
OVER = ("ORT fused", "torch")

#: How opsched exports the attention, by contender: by its rule, fused always, never.
FORMS: dict[str, Callable[[], contextlib.AbstractContextManager[object]]] = {
    "opsched": contextlib.nullcontext,
    "fused form": lambda: mock.patch.object(attention, "FUSED_FROM_BYTES", 0),
    "unfused form": lambda: mock.patch.object(attention, "fused_attention", return_value=None),
    "zeroing": lambda: mock.patch.object(attention, "_may_hide", return_value=True),
    "boolean form": lambda: mock.patch.object(attention, "_made_additive", lambda b, node, inputs, types, ref, t: t)}


class Attention(nn.Module):
    def __init__(self, causal: bool = False) -> None:
        super().__init__()
        self.causal = causal

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *mask: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, *mask, is_causal=self.causal)


def call_case(tokens: int, heads: int, width: int, masking: str = "") -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """The module of one attention call and its operands: a query that is also its key and
    value, and with ``masking`` "keys", a boolean mask hiding the last eighth of the keys."""
    q = torch.randn(1, heads, tokens, width, generator=torch.Generator().manual_seed(0))
    if masking == "keys":
        return Attention().eval(), (q, q, q, torch.arange(tokens).view(1, 1, 1, tokens) < tokens - tokens // 8)
    return Attention(causal=masking == "causal").eval(), (q, q, q)


def model_case() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """BERT-base's width and heads, 4 layers, on 2,048 tokens (random weights)."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=4, max_position_embeddings=2048, attn_implementation="sdpa")
    return transformers.BertModel(config).eval(), (torch.randint(0, config.vocab_size, (1, 2048)),)


def t5_case(tokens: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A T5 encoder of t5-small's width and heads, 4 layers, its last eighth of tokens padded."""
    import transformers

    torch.manual_seed(0)
    config = transformers.T5Config(num_layers=4, d_model=512, d_kv=64, num_heads=8, d_ff=2048, vocab_size=1000)
    ids, mask = torch.randint(0, 1000, (1, tokens)), torch.ones(1, tokens, dtype=torch.long)
    mask[0, tokens - tokens // 8:] = 0
    return transformers.T5EncoderModel(config).eval(), (ids, mask)


def bert_case(tokens: int) -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    """A BERT of BERT-base's width and heads, 4 layers, its last eighth of tokens padded."""
    import transformers

    torch.manual_seed(0)
    config = transformers.BertConfig(num_hidden_layers=4, attn_implementation="sdpa")
    ids, mask = torch.randint(0, config.vocab_size, (1, tokens)), torch.ones(1, tokens, dtype=torch.long)
    mask[0, tokens - tokens // 8:] = 0
    return transformers.BertModel(config).eval(), (ids, mask)


#: The masked models (``--masked``): how each is made, at which token counts, and what opsched
#: exported before (:data:`FORMS`).
MASKED = {"T5 encoder": (t5_case, (128, 1024), "zeroing"), "BERT": (bert_case, (128, 512), "boolean form")}


def made(model: nn.Module, inputs: tuple[torch.Tensor, ...], form: str) -> nn.Module:
    """What ``opsched.optimize`` makes of ``model`` with its attention exported as ``form`` says
    (:data:`FORMS`; its own check left out, as it calls the module: each is checked after), or the
    model itself (*eager*)."""
    if form == "eager":
        return model
    with FORMS[form]():
        module: nn.Module = opsched.optimize(model, inputs, cost="analytic", scheduler="sequential", progress=False,
                                             verify=False)
    return module


def peak_mib(case: list[str], form: str) -> float:
    """How far one call of ``form`` raised the peak memory of a fresh process (MiB); ``case``:
    the arguments of :func:`call_case` as text, or none for :func:`model_case`."""
    out = subprocess.run([sys.executable, __file__, "--peak", form, *case], capture_output=True, text=True,
                         check=True).stdout
    return float(out.split()[-1])


def _peak(form: str, case: list[str]) -> None:
    torch.set_num_threads(2)
    model, inputs = call_case(*map(int, case[:3]), *case[3:]) if case else model_case()
    module = made(model, inputs, form)
    # Linux's peak resident memory of this process, reset to what it holds now (not
    # getrusage's, which a child inherits from the parent it was forked from)
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kib("VmHWM")
    with torch.no_grad():
        module(*inputs)
    print((_status_kib("VmHWM") - before) / 1024)


def _status_kib(field: str) -> int:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(field + ":"))
    return int(line.split()[1])


def fused_session(tokens: int, heads: int, width: int) -> object:
    """An ONNX Runtime session of ``com.microsoft.MultiHeadAttention`` on 2 threads."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    shape = [1, tokens, heads * width]
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in ("q", "k", "v", "o")]
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["o"], domain="com.microsoft", num_heads=heads)
    graph = helper.make_graph([node], "attention", values[:3], values[3:])
    opsets = [helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = 2, 1
    options.add_session_config_entry("session.force_spinning_stop", "1")  # as opsched's sessions (module docstring)
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def timed(model: nn.Module, inputs: tuple[torch.Tensor, ...], forms: tuple[str, ...], rounds: int, calls: int,
          others: dict[str, Callable[[], object]]) -> dict[str, float]:
    """Median ms of each of ``forms`` (each checked against ``model`` first) and ``others``."""
    with torch.no_grad():
        expected = model(*inputs)
        modules = {form: made(model, inputs, form) for form in forms}
        for name, module in modules.items():
            torch.testing.assert_close(module(*inputs), expected, atol=1e-4, rtol=1e-4, msg=name)
        contenders = {name: functools.partial(m, *inputs) for name, m in modules.items()} | others
        medians = interleave(contenders, rounds, warmup=1, settle_s=0.05, block=calls)
    return {name: statistics.median(m) for name, m in medians.items()}


def run(tokens: int, heads: int, width: int, masking: str, rounds: int, calls: int
        ) -> tuple[list[object], dict[str, object]]:
    model, inputs = call_case(tokens, heads, width, masking)
    others: dict[str, Callable[[], object]] = {}
    if not masking:  # the operator alone, on its own layout (unmasked: its one form here)
        q = inputs[0]
        flat = np.ascontiguousarray(q.transpose(1, 2).reshape(1, tokens, heads * width).numpy())
        session = fused_session(tokens, heads, width)
        fused_out = session.run(None, {"q": flat, "k": flat, "v": flat})[0]  # type: ignore[attr-defined]
        assert np.allclose(fused_out.reshape(1, tokens, heads, width).transpose(0, 2, 1, 3), model(*inputs).numpy(),
                           atol=1e-4)
        others["ORT fused"] = lambda: session.run(None, {"q": flat, "k": flat, "v": flat})  # type: ignore[attr-defined]
    others["torch"] = functools.partial(model, *inputs)
    ms = timed(model, inputs, ("opsched", "fused form", "unfused form"), rounds, calls, others)
    case = [str(tokens), str(heads), str(width), *([masking] if masking else [])]
    peaks = {form: peak_mib(case, form) for form in ("fused form", "unfused form")}
    scores = 4 * heads * tokens * tokens
    row: list[object] = [
        f"{tokens} x {heads} x {width}" + (f", {masking}" if masking else ""), f"{scores / 2**20:.0f}",
        "fused" if scores >= attention.FUSED_FROM_BYTES else "unfused",
        *(f"{ms[n]:.3f}" if n in ms else "n/a" for n in ("opsched", "fused form", "unfused form", *OVER)),
        f"{ms['unfused form'] / ms['fused form']:.2f}", *(f"{peaks[f]:.0f}" for f in peaks),
        *(f"{ms['opsched'] / ms[n]:.2f}" if n in ms else "n/a" for n in OVER)]
    return row, {"tokens": tokens, "heads": heads, "width": width, "masking": masking, "ms": ms, "peak_mib": peaks}


def _intro(title: str, paragraphs: tuple[int, ...] = (1, 2, 3, 4)) -> list[str]:
    """A page's title and the paragraphs of the module docstring that say what it shows."""
    parts = __doc__.split("\n\n")
    return [f"# {title}", "", *(" ".join(parts[k].split()) + "\n" for k in paragraphs)]


def calls_table(rounds: int, calls: int) -> None:
    rows: list[list[object]] = []
    records: list[dict[str, Any]] = []
    for shape in SHAPES:
        row, record = run(*shape, rounds, calls)
        print(row, flush=True)
        rows.append(row)
        records.append(record)
    over = {key: geomean(r["ms"]["opsched"] / r["ms"][key] for r in records if key in r["ms"]) for key in OVER}
    write_table("attention-kernels", _intro("Attention on this CPU: opsched's ONNX forms, ONNX Runtime's fused "
                                            "operator, PyTorch's kernel"),
                ["tokens x heads x width", "scores MiB", "opsched exports", "opsched ms", "fused form ms",
                 "unfused form ms", "ORT fused ms", "torch ms", "unfused over fused", "fused peak MiB",
                 "unfused peak MiB", *(f"opsched over {n}" for n in OVER)],
                rows, {f"opsched over {k}": v for k, v in over.items()}, {"rows": records})


def model_table(rounds: int) -> None:
    model, inputs = model_case()
    forms = ("opsched", "unfused form")
    ms = timed(model, inputs, forms, rounds, 1, {"eager": functools.partial(model, *inputs)})
    rows: list[list[object]] = [[name, f"{ms[name]:.0f}", f"{ms[name] / ms['opsched']:.2f}",
                                 f"{peak_mib([], name):.0f}"] for name in ("opsched", "unfused form", "eager")]
    for row in rows:
        print(row, flush=True)
    write_table("attention-model", _intro("Attention in a whole model on this CPU: BERT-base's width, 4 layers, "
                                          "2,048 tokens"),
                ["contender", "ms", "over opsched", "peak MiB"], rows,
                {f"{name} over opsched": ms[name] / ms["opsched"] for name in ("unfused form", "eager")},
                {"ms": ms, "peak_mib": {r[0]: float(str(r[3])) for r in rows}})


def masked_table(rounds: int, calls: int) -> None:
    rows: list[list[object]] = []
    records: list[dict[str, Any]] = []
    for name, (case, counts, before) in MASKED.items():
        for tokens in counts:
            model, inputs = case(tokens)
            ms = timed(model, inputs, ("opsched", before), rounds, calls, {"eager": functools.partial(model, *inputs)})
            row: list[object] = [name, tokens, before, *(f"{ms[n]:.2f}" for n in ("opsched", before, "eager")),
                                 f"{ms[before] / ms['opsched']:.3f}", f"{ms['eager'] / ms['opsched']:.2f}"]
            print(row, flush=True)
            rows.append(row)
            records.append({"model": name, "tokens": tokens, "before": before, "ms": ms})
    write_table("attention-masked", _intro("Masked models on this CPU: a padded T5 encoder and BERT, their "
                                           "masks as opsched exports them and as it did before", (3, 5)),
                ["model", "tokens", "before", "opsched ms", "before ms", "eager ms", "before over opsched",
                 "eager over opsched"], rows,
                {"before over opsched": geomean(r["ms"][r["before"]] / r["ms"]["opsched"] for r in records)},
                {"rows": records})


def main() -> None:
    if sys.argv[1:2] == ["--peak"]:
        return _peak(sys.argv[2], sys.argv[3:])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--calls", type=int, default=11, help="timed calls per turn (their median)")
    p.add_argument("--model", action="store_true", help="time a whole model instead (module docstring)")
    p.add_argument("--masked", action="store_true", help="time a padded T5 encoder instead (module docstring)")
    args = p.parse_args()
    torch.set_num_threads(2)
    if args.model:
        model_table(min(args.rounds, 5))
    elif args.masked:
        masked_table(args.rounds, args.calls)
    else:
        calls_table(args.rounds, args.calls)


if __name__ == "__main__":
    main()

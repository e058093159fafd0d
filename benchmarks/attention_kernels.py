"""Attention on this CPU: opsched's ONNX form of ``scaled_dot_product_attention`` against ONNX
Runtime's fused attention operator and PyTorch's own kernel.

opsched exports the call as torch.onnx does: scaled MatMul, Softmax, MatMul. That materialises
every head's full score matrix. ONNX Runtime also has a fused operator,
``com.microsoft.MultiHeadAttention``, which its transformer optimizer writes. This benchmark
times the three on one attention call. The corpus's 16-token models hide the difference.

Contenders:
- *opsched*: what ``opsched.optimize`` returns for a module whose one call is
  ``F.scaled_dot_product_attention(q, k, v)``. It is one ONNX Runtime session, plus the module's
  own call.
- *ORT fused*: an ONNX Runtime session of ``MultiHeadAttention`` alone. Its inputs are
  (batch, tokens, heads x width), the layout it takes, and are made once, outside the timing.
- *torch*: the call in eager PyTorch.

Each contender runs on 2 threads, in interleaved rounds within one process (3 warm-up calls,
then the median of ``--calls`` calls per round, the median over rounds). *x opsched* is
opsched's time over the contender's.

    python benchmarks/attention_kernels.py
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _report import geomean, write_table  # noqa: E402
from torch import nn  # noqa: E402

import opsched  # noqa: E402

#: (tokens, heads, head width): BERT-base's at 128 and 512 tokens, ViT-B/16's 197, a long sequence.
SHAPES = ((128, 12, 64), (197, 12, 64), (512, 12, 64), (2048, 4, 16))


class Attention(nn.Module):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)


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
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def timed(call: Callable[[], object], calls: int) -> float:
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def run(tokens: int, heads: int, width: int, rounds: int, calls: int) -> tuple[list[object], dict[str, object]]:
    q = torch.randn(1, heads, tokens, width)
    module = opsched.optimize(Attention().eval(), (q, q, q), cost="analytic", scheduler="sequential", progress=False)
    flat = np.ascontiguousarray(q.transpose(1, 2).reshape(1, tokens, heads * width).numpy())
    session = fused_session(tokens, heads, width)
    torch_out = Attention()(q, q, q)
    fused_out = session.run(None, {"q": flat, "k": flat, "v": flat})[0]  # type: ignore[attr-defined]
    assert np.allclose(fused_out.reshape(1, tokens, heads, width).transpose(0, 2, 1, 3), torch_out.numpy(), atol=1e-4)
    contenders = {"opsched": lambda: module(q, q, q),
                  "ORT fused": lambda: session.run(None, {"q": flat, "k": flat, "v": flat}),  # type: ignore[attr-defined]
                  "torch": lambda: Attention()(q, q, q)}
    medians: dict[str, list[float]] = {name: [] for name in contenders}
    with torch.no_grad():
        for call in contenders.values():
            for _ in range(3):
                call()
        for r in range(rounds):
            names = list(contenders) if r % 2 else list(reversed(contenders))
            for name in names:
                medians[name].append(timed(contenders[name], calls))
    ms = {name: statistics.median(m) * 1e3 for name, m in medians.items()}
    row = [f"{tokens} x {heads} x {width}", *(f"{ms[n]:.3f}" for n in contenders),
           f"{ms['opsched'] / ms['ORT fused']:.2f}", f"{ms['opsched'] / ms['torch']:.2f}"]
    return row, {"tokens": tokens, "heads": heads, "width": width, "ms": ms}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--calls", type=int, default=11)
    args = p.parse_args()
    torch.set_num_threads(2)
    rows, records = [], []
    for shape in SHAPES:
        row, record = run(*shape, args.rounds, args.calls)
        print(row)
        rows.append(row)
        records.append(record)
    intro = ["# Attention on this CPU: opsched's ONNX form, ONNX Runtime's fused operator, PyTorch's kernel", "",
             *(" ".join(p.split()) + "\n" for p in __doc__.split("\n\n")[1:4])]
    over = {key: geomean(r["ms"]["opsched"] / r["ms"][key] for r in records) for key in ("ORT fused", "torch")}
    write_table("attention-kernels", intro,
                ["tokens x heads x width", "opsched ms", "ORT fused ms", "torch ms", "x ORT fused", "x torch"],
                rows, {f"opsched over {k}": v for k, v in over.items()}, {"rows": records})


if __name__ == "__main__":
    main()

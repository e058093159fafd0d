"""ONNX forms of one op, timed on ONNX Runtime on this CPU: the native op that opsched's segments
use at opset 20 against the spelling it would otherwise need, and an op at the opset segments
declare it at against the newer one.

- ``gelu`` (erf and tanh forms): ONNX's ``Gelu`` against the formula in elementwise nodes (what
  segments held at opset 17, which has no Gelu);
- ``fold``: ONNX's ``Col2Im`` against :func:`opsched.ir.ops.aten_onnx.col2im_by_scatter` (what
  segments hold for the dtypes ONNX Runtime's Col2Im lacks), both made by opsched's own export of
  an ``F.fold`` call;
- ``nearest``: nearest upsampling by 2 (a feature pyramid's), opsched's Resize (given its sizes)
  against the Gather per axis it falls back to where ONNX's rows are not PyTorch's;
- ``avg pool``: NASNet's pool (3x3, stride 1, padding not counted, 11 channels: outside ORT's
  blocked layout) declared at opset 18 (AveragePool-11, where segments declare it:
  :data:`opsched.ir.ops.onnx_opsets.OLDEST`) against opset 20 (AveragePool-19).

Each is a one-op ONNX Runtime session on the same input, timed interleaved; the ratio is the
median of per-round ratios. Writes ``docs/results/onnx-forms.md`` (and ``.json``).

    python benchmarks/onnx_forms.py
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from _report import write  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from opsched import from_torch  # noqa: E402
from opsched.cli.table import format_table  # noqa: E402
from opsched.ir.ops.aten_onnx import ONNX_FORMS, col2im_by_scatter  # noqa: E402
from opsched.ir.ops.onnx_builder import OPSET, OnnxBuilder  # noqa: E402
from opsched.ir.ops.onnx_opsets import OLDEST  # noqa: E402
from opsched.ir.ops.onnx_session import OnnxModel, inference_session  # noqa: E402
from opsched.timing import interleave, paired_ratio  # noqa: E402

Forms = dict[str, onnx.ModelProto | OnnxModel]


def _model(nodes: list[onnx.NodeProto], shape: list[int], inits: Sequence[onnx.TensorProto] = (),
           opset: int = OPSET) -> onnx.ModelProto:
    """A model of ``nodes`` from ``x`` to ``y``, both of ``shape``, at ``opset``."""
    graph = helper.make_graph(nodes, "form", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)], list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def gelu_forms(approximate: str, shape: list[int]) -> Forms:
    """ONNX's Gelu, and the formula in elementwise nodes."""
    def c(name: str, v: float) -> onnx.TensorProto:
        return numpy_helper.from_array(np.array(v, np.float32), name)

    if approximate == "tanh":  # x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
        nodes = [helper.make_node("Mul", ["x", "x"], ["x2"]), helper.make_node("Mul", ["x2", "x"], ["x3"]),
                 helper.make_node("Mul", ["x3", "a"], ["ax3"]), helper.make_node("Add", ["x", "ax3"], ["inner"]),
                 helper.make_node("Mul", ["inner", "k"], ["scaled"]), helper.make_node("Tanh", ["scaled"], ["core"])]
        inits = [c("a", 0.044715), c("k", math.sqrt(2 / math.pi))]
    else:  # x/2 * (1 + erf(x / sqrt 2))
        nodes = [helper.make_node("Div", ["x", "r2"], ["d"]), helper.make_node("Erf", ["d"], ["core"])]
        inits = [c("r2", math.sqrt(2))]
    nodes += [helper.make_node("Mul", ["x", "half"], ["h"]), helper.make_node("Add", ["core", "one"], ["s"]),
              helper.make_node("Mul", ["h", "s"], ["y"])]
    inits += [c("half", 0.5), c("one", 1.0)]
    return {"native": _model([helper.make_node("Gelu", ["x"], ["y"], approximate=approximate)], shape),
            "spelled out": _model(nodes, shape, inits)}


def avg_pool_forms(shape: list[int]) -> Forms:
    """One AveragePool (3x3, stride 1, padding 1 not counted) at the opset segments declare it at
    and at :data:`OPSET`."""
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1],
                            count_include_pad=0)
    return {"native": _model([node], shape, opset=OLDEST), f"opset {OPSET}": _model([node], shape)}


def fold_forms(channels: int, size: int, kernel: int) -> tuple[Forms, list[int]]:
    """opsched's two exports of ``F.fold`` (blocks side by side, as MobileViTV2 folds its patches)."""
    blocks = (size // kernel) ** 2
    cols = torch.randn(1, channels * kernel * kernel, blocks)
    graph = from_torch(_Fold(size, kernel), cols)
    (node,) = [n for n in graph.nodes if n.attrs.get("target") == "aten::col2im.default"]
    forms = {}
    for label, form in (("native", ONNX_FORMS["aten::col2im.default"]), ("scatter", col2im_by_scatter)):
        b = OnnxBuilder(graph)
        form(b, node)
        forms[label] = b.model([node.inputs[0]], [node.name])
    return forms, list(cols.shape)


def nearest_forms(shape: list[int], scale: int) -> Forms:
    """opsched's export of nearest upsampling by a whole ``scale`` (a Resize given its sizes),
    and the Gather per axis that it falls back to where ONNX's rows are not PyTorch's."""
    x = torch.randn(*shape)
    graph = from_torch(_Upsample(scale), x)
    (node,) = [n for n in graph.nodes if "upsample_nearest" in n.attrs.get("target", "")]
    b = OnnxBuilder(graph)
    ONNX_FORMS[node.attrs["target"]](b, node)
    native = b.model([node.inputs[0]], [node.name])
    made, nodes, inits = "x", [], []
    for axis in (2, 3):
        rows = numpy_helper.from_array(np.arange(shape[axis] * scale, dtype=np.int64) // scale, f"rows{axis}")
        out = "y" if axis == 3 else f"by_rows{axis}"
        nodes.append(helper.make_node("Gather", [made, rows.name], [out], axis=axis))
        inits.append(rows)
        made = out
    gathers = helper.make_graph(nodes, "gathers", [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                                [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return {"native": native,
            "gathers": helper.make_model(gathers, opset_imports=[helper.make_opsetid("", OPSET)])}


class _Upsample(torch.nn.Module):
    def __init__(self, scale: int) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(x, scale_factor=self.scale, mode="nearest")


class _Fold(torch.nn.Module):
    def __init__(self, size: int, kernel: int) -> None:
        super().__init__()
        self.size, self.kernel = size, kernel

    def forward(self, cols: torch.Tensor) -> torch.Tensor:
        return F.fold(cols, (self.size, self.size), self.kernel, stride=self.kernel)


def race(forms: Forms, shape: list[int], rounds: int, threads: int) -> tuple[dict[str, float], float, float]:
    """Median µs of each form, the median per-round ratio (the other form's time over the native
    op's), and the largest difference between their outputs."""
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    calls = {}
    for label, model in forms.items():
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        session = inference_session(model, options)
        feed = {session.get_inputs()[0].name: x}
        calls[label] = lambda s=session, f=feed: s.run(None, f)[0]
    native, other = (calls[k]() for k in forms)
    times = interleave(calls, rounds, block=5, settle_s=0.02)  # what the other session left spinning goes idle
    (other_label,) = [k for k in forms if k != "native"]
    ratio = paired_ratio(times[other_label], times["native"])
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}, ratio, float(np.abs(native - other).max())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=30)
    p.add_argument("--threads", type=int, default=1,
                   help="intra-op threads per session (on 2 cores, two-thread sessions in one process came out "
                        "bimodal: a session's pool sometimes ran as one thread)")
    args = p.parse_args()
    fold, fold_shape = fold_forms(256, 32, 2)
    cases = [("gelu (erf)", gelu_forms("none", [4, 197, 768]), [4, 197, 768]),
             ("gelu (tanh)", gelu_forms("tanh", [4, 197, 768]), [4, 197, 768]),
             ("fold 256x32x32, 2x2 blocks", fold, fold_shape),
             ("avg pool 3x3 (opset 18 as native)", avg_pool_forms([1, 11, 56, 56]), [1, 11, 56, 56]),
             ("nearest x2 (Resize by sizes as native)", nearest_forms([1, 64, 28, 28], 2), [1, 64, 28, 28])]
    rows, records = [], []
    for name, forms, shape in cases:
        med, ratio, diff = race(forms, shape, args.rounds, args.threads)
        other = next(k for k in forms if k != "native")
        rows.append([name, "x".join(map(str, shape)), f"{med['native']:.0f}", f"{other}: {med[other]:.0f}",
                     f"{ratio:.2f}", f"{diff:.1e}"])
        records.append({"case": name, "input": shape, "median_us": med, "ratio": ratio, "max_abs_diff": diff})
    intro = ["# ONNX forms on ONNX Runtime (this CPU)", "",
             f"One-op ONNX Runtime sessions (intra-op threads: {args.threads}; opset {OPSET}) on the same input, "
             f"{args.rounds} interleaved rounds of 5 calls, each turn after 20 ms idle; *ratio*: the median "
             "per-round ratio of the other form's time to the native op's (> 1: the native op is faster)."]
    headers = ["case", "input", "native µs", "other form µs", "ratio", "max difference"]
    md, js = write("onnx-forms", "\n".join([*intro, "", format_table(headers, rows, markdown=True)]),
                   {"results": records})
    print(format_table(headers, rows))
    print(f"wrote {md} and {js}")


if __name__ == "__main__":
    main()

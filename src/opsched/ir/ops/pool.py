"""2-D pooling: max and average windows, and adaptive average pooling."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch.nn.functional as F

from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops._common import fail, pair, reduce_flops, window
from opsched.ir.ops.registry import Kernel, OpDef, register
from opsched.ir.schema import OpSchema
from opsched.ir.types import FrozenAttrs, TensorType

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__ = ["pool_output_hw"]


def pool_output_hw(h: int, w: int, attrs: FrozenAttrs) -> tuple[int, int]:
    kh, kw = pair(attrs["kernel"])
    sh, sw = pair(attrs.get("stride", attrs["kernel"]))
    ph, pw = pair(attrs.get("padding", 0))
    dh, dw = pair(attrs.get("dilation", 1))
    ceil = bool(attrs.get("ceil_mode", False))
    return window(h, kh, sh, ph, dh, ceil), window(w, kw, sw, pw, dw, ceil)


def _infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    if x.rank != 4:
        raise fail("pool", f"expects an NCHW input, got {x}")
    h, w = pool_output_hw(x.shape[2], x.shape[3], attrs)
    if h <= 0 or w <= 0:
        raise fail("pool", f"output would be empty for input {x} and kernel {attrs['kernel']}")
    return TensorType((x.shape[0], x.shape[1], h, w), x.dtype)


def _flops(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType], out: TensorType) -> int:
    kh, kw = pair(attrs["kernel"])
    return out.numel * kh * kw


def _max_kernel(graph: Graph, node: Node) -> Kernel:
    a = node.attrs
    k, s, p = a["kernel"], a.get("stride", a["kernel"]), a.get("padding", 0)
    d, c = a.get("dilation", 1), a.get("ceil_mode", False)
    return lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=c)


def _avg_kernel(graph: Graph, node: Node) -> Kernel:
    a = node.attrs
    k, s, p, c = a["kernel"], a.get("stride", a["kernel"]), a.get("padding", 0), a.get("ceil_mode", False)
    inc = a.get("count_include_pad", True)
    return lambda x: F.avg_pool2d(x, k, s, p, ceil_mode=c, count_include_pad=inc)


def _window_attrs(b: OnnxBuilder, n: Node) -> dict[str, object]:
    """The ONNX window of a pool. With ``ceil_mode``, ONNX's shape inference sizes the output by
    a rule of its own (it keeps a last window that starts in the padding; PyTorch and ONNX
    Runtime drop it), and a session whose declared sizes differ from the inferred ones is
    refused: the window is written without ``ceil_mode``, its end padded to give PyTorch's size."""
    kernel, stride = pair(n.attr("kernel")), pair(n.attr("stride", n.attr("kernel")))
    pad, dilation = pair(n.attr("padding", 0)), pair(n.attr("dilation", 1))
    out, size = b.graph.types[n.name].shape[2:], b.graph.types[n.inputs[0]].shape[2:]
    # the least end padding that fits PyTorch's last window: any up to stride - 1 more gives the same size
    end = [max(0, (o - 1) * s + d * (k - 1) + 1 - i - p) if n.attr("ceil_mode", False) else p
           for o, s, d, k, i, p in zip(out, stride, dilation, kernel, size, pad)]
    return dict(kernel_shape=list(kernel), strides=list(stride), pads=[*pad, *end])


def _max_export(b: OnnxBuilder, n: Node) -> None:
    b.add("MaxPool", [n.inputs[0]], n.name, dilations=list(pair(n.attr("dilation", 1))), **_window_attrs(b, n))


def _avg_export(b: OnnxBuilder, n: Node) -> None:
    """An average pool; where ``ceil_mode`` pads the end further than PyTorch counts padding
    (:func:`_window_attrs`), windows that reach into it are averaged over the cells PyTorch
    counts: ONNX's average over the input's cells, times a constant per output position."""
    window = _window_attrs(b, n)
    include = bool(n.attr("count_include_pad", True))
    pad = pair(n.attr("padding", 0))
    if not include or window["pads"] == [*pad, *pad]:
        b.add("AveragePool", [n.inputs[0]], n.name, count_include_pad=int(include), **window)
        return
    cells = b.add("AveragePool", [n.inputs[0]], b.fresh(f"{n.name}_cells"), count_include_pad=0, **window)
    b.add("Mul", [cells, b.init(_counted(b, n), f"{n.name}_counted")], n.name)


def _counted(b: OnnxBuilder, n: Node) -> np.ndarray:
    """Per output position, the input's cells in its window over the cells PyTorch divides by
    (padding included, up to the padded input's end): [1, 1, H, W]."""
    kernel, stride = pair(n.attr("kernel")), pair(n.attr("stride", n.attr("kernel")))
    pad = pair(n.attr("padding", 0))
    out, size = b.graph.types[n.name].shape[2:], b.graph.types[n.inputs[0]].shape[2:]
    ratios = []
    for o, k, s, p, i in zip(out, kernel, stride, pad, size):
        start = np.arange(o) * s - p
        inside = np.minimum(start + k, i) - np.maximum(start, 0)
        counted = np.minimum(start + k, i + p) - start
        ratios.append(inside / counted)
    return np.outer(*ratios).astype(getattr(np, b.graph.types[n.name].dtype)).reshape(1, 1, *out)


def _adaptive_infer(inputs: Sequence[TensorType], attrs: FrozenAttrs, params: Sequence[TensorType]) -> TensorType:
    (x,) = inputs
    if len(x.shape) != 4:
        raise fail("adaptive_avg_pool2d", f"expects an NCHW input, got {x}")
    oh, ow = pair(attrs["output_size"])
    return TensorType((x.shape[0], x.shape[1], oh, ow), x.dtype)


def _adaptive_kernel(graph: Graph, node: Node) -> Kernel:
    size = node.attr("output_size")
    return lambda x: F.adaptive_avg_pool2d(x, size)


def _adaptive_export(b: OnnxBuilder, n: Node) -> None:
    """1x1: a global average pool; sizes that divide the input: an average pool of equal windows;
    any other size: torch's bins (``floor(i*H/oh)`` to ``ceil((i+1)*H/oh)``, overlapping where
    they do not divide), averaged along the height then along the width (the mean of a rectangle
    is the mean of its row means), one ReduceMean per bin of each axis."""
    x = n.inputs[0]
    (h, w), (oh, ow) = b.graph.types[x].shape[2:], pair(n.attr("output_size"))
    if (oh, ow) == (1, 1):
        b.add("GlobalAveragePool", [x], n.name)
    elif h % oh == 0 and w % ow == 0:
        b.add("AveragePool", [x], n.name, kernel_shape=[h // oh, w // ow], strides=[h // oh, w // ow])
    else:
        rows = _adaptive_axis(b, x, 2, h, oh, None)
        _adaptive_axis(b, rows, 3, w, ow, n.name)


def _adaptive_axis(b: OnnxBuilder, x: str, axis: int, size: int, out: int, name: str | None) -> str:
    """``x`` averaged over each of torch's ``out`` adaptive bins of ``size`` along ``axis``."""
    if size % out == 0:  # equal bins: one pool along this axis
        kernel = [size // out if a == axis else 1 for a in (2, 3)]
        return b.add("AveragePool", [x], name, kernel_shape=kernel, strides=kernel)
    bins = []
    for i in range(out):
        start, end = (i * size) // out, -(-((i + 1) * size) // out)
        bounds = [b.init(np.array([v], np.int64), "s") for v in (start, end, axis)]
        bins.append(b.add("ReduceMean", [b.add("Slice", [x, *bounds]), bounds[2]], keepdims=1))
    return b.add("Concat", bins, name, axis=axis)


register(OpDef(OpSchema("max_pool2d", "pool", (1, 1), _infer, _flops), _max_kernel, _max_export))
register(OpDef(OpSchema("avg_pool2d", "pool", (1, 1), _infer, _flops), _avg_kernel, _avg_export))
register(OpDef(OpSchema("adaptive_avg_pool2d", "reduce", (1, 1), _adaptive_infer, reduce_flops), _adaptive_kernel,
               _adaptive_export))

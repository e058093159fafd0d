"""ONNX forms of the ATen overloads that torch.onnx cannot export (or exports as ONNX Runtime runs
slowly) and models use often.

A generic ATen node (:mod:`opsched.ir.ops.aten`) exports through its overload's own torch.onnx
symbolic (:mod:`opsched.ir.ops.aten_export`), except where a form here takes its place. These
overloads have none at the segments' opset, or a wrong one, and each would otherwise cut an ONNX
Runtime segment: casts (``_to_copy``); the writes an in-place index assignment becomes once
functionalised (``slice_scatter``, ``select_scatter``, ``fill``, ``copy``), as ScatterElements
over constant positions, ConstantOfShape and Cast+Expand; ``F.unfold`` and ``F.fold`` (``im2col``,
``col2im``), as a Gather over the pixel positions of their blocks, and ONNX's ``Col2Im`` (a
summing ScatterElements over those positions for the dtypes ONNX Runtime's ``Col2Im`` lacks);
``index_add``, whose own export wrote a repeated index once, as an adding ScatterElements;
``Tensor.unfold``, whose own export grows with its windows (a Slice and an Unsqueeze each), as
one Gather;
``grid_sampler`` (``F.grid_sample``) as ONNX's GridSample; tensors made uninitialised to be
written over (``empty_like``, ``new_empty``), as zeros, where torch.onnx bakes in its trace's memory;
nearest-neighbour upsampling, which torch.onnx exports as a Resize that reads other pixels, as
Gathers; and the Fourier transforms and views of complex values, on pairs of parts
(:mod:`opsched.ir.ops.fourier`); and a two-operand ``einsum`` as the batched MatMul PyTorch
computes it by, not ONNX's slow Einsum (:mod:`opsched.ir.ops.einsum`). Each form is exact (the
einsum's sums within rounding of PyTorch's) for every dtype ONNX has; it raises
:class:`NotExportable` otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

from opsched.ir.node import Node
from opsched.ir.ops.aten import arguments, run_on
from opsched.ir.ops.attention import ATTENTION_FORMS
from opsched.ir.ops.einsum import EINSUM_FORMS
from opsched.ir.ops.fourier import PAIR_FORMS
from opsched.ir.ops.registry import NotExportable
from opsched.ir.types import TensorType

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__ = ["ONNX_FORMS", "col2im_by_scatter"]


def _cast(b: OnnxBuilder, node: Node) -> None:
    """A copy to another dtype (``x.int()`` once decomposed): layout, device and memory format
    do not change the values, so it is a Cast."""
    from opsched.ir.ops.onnx_builder import ONNX_DTYPES

    if node.out.dtype not in ONNX_DTYPES:
        raise NotExportable(f"{node.attrs['target']}: ONNX has no {node.out.dtype}")
    b.add("Cast", [_operand(b, node, 0)], node.name, to=ONNX_DTYPES[node.out.dtype])


def _slice_scatter(b: OnnxBuilder, node: Node) -> None:
    """``base`` with ``src`` written over ``base[..., start:end:step, ...]`` (what an in-place
    slice assignment becomes once functionalised): a ScatterElements whose indices are the
    slice's positions along ``dim``."""
    given, (base, src) = arguments(node), _tensor_types(b, node, 2)
    dim = given.get("dim", 0) % base.rank
    start, _, step = slice(given.get("start"), given.get("end"), given.get("step", 1)).indices(base.shape[dim])
    _scatter_along(b, node, dim, start + step * np.arange(src.shape[dim], dtype=np.int64), src.shape,
                   _operand(b, node, 1))


def _select_scatter(b: OnnxBuilder, node: Node) -> None:
    """``base`` with ``src`` written over ``base.select(dim, index)`` (``x[:, 0] = y``): ``src``
    given its dimension back, then scattered at ``index``."""
    given, (base, src) = arguments(node), _tensor_types(b, node, 2)
    dim = given["dim"] % base.rank
    shape = (*src.shape[:dim], 1, *src.shape[dim:])
    axes = b.init(np.array([dim], dtype=np.int64), f"{node.name}_axes")
    unsqueezed = b.add("Unsqueeze", [_operand(b, node, 1), axes], b.fresh(f"{node.name}_src"))
    _scatter_along(b, node, dim, np.array([given["index"] % base.shape[dim]], dtype=np.int64), shape, unsqueezed)


def _scatter_along(b: OnnxBuilder, node: Node, dim: int, positions: np.ndarray, shape: Sequence[int],
                   updates: str) -> None:
    """The node's output: its first operand with ``updates`` (of ``shape``) written at
    ``positions`` along ``dim``."""
    along = [1] * len(shape)
    along[dim] = len(positions)
    indices = b.init(np.ascontiguousarray(np.broadcast_to(positions.reshape(along), shape)), f"{node.name}_indices")
    b.add("ScatterElements", [_operand(b, node, 0), indices, updates], node.name, axis=dim)


def _index_add(b: OnnxBuilder, node: Node) -> None:
    """``self.index_add(dim, index, source, alpha=a)``: ``a * source`` added into ``self`` at
    ``index`` along ``dim``, a repeated index adding each time (MoE layers gather their experts'
    outputs so). ONNX's ScatterElements with ``reduction="add"``, its indices ``index`` expanded
    to ``source``'s shape; torch.onnx's own export wrote a repeated index once."""
    given, args = arguments(node), node.attrs["args"]
    base, index, source = (b.operand_type(node, args[k]) for k in (0, 2, 3))
    if base is None or index is None or source is None or base.rank != source.rank:
        raise NotExportable(f"{node.attrs['target']}: of a 0-d or differently ranked source")
    dim = given["dim"] % base.rank
    along = [1] * source.rank
    along[dim] = -1
    shaped = b.add("Reshape", [b.operand(node, args[2]), b.init(np.array(along, np.int64), f"{node.name}_along")],
                   b.fresh(f"{node.name}_index"))
    indices = b.add("Expand", [shaped, b.init(np.array(source.shape, np.int64), f"{node.name}_shape")],
                    b.fresh(f"{node.name}_indices"))
    updates = b.operand(node, args[3])
    if given.get("alpha", 1) != 1:
        alpha = b.init(np.array(given["alpha"], getattr(np, source.dtype)), f"{node.name}_alpha")
        updates = b.add("Mul", [updates, alpha], b.fresh(f"{node.name}_scaled"))
    b.add("ScatterElements", [b.operand(node, args[0]), indices, updates], node.name, axis=dim, reduction="add")


def _fill(b: OnnxBuilder, node: Node) -> None:
    """A tensor of the input's shape holding one value (``x.fill_(0)`` once functionalised); by a
    0-d tensor's value (``fill.Tensor``), that value cast to the input's type and broadcast, as a
    copy's (VITS fills float32 with a float64: the value's type, kept, made ONNX Runtime refuse
    the session)."""
    _tensor_types(b, node, 1)
    if node.attrs["args"][1][0] in ("t", "p"):
        _copy(b, node)
        return
    _constant_of_shape(b, node, arguments(node)["value"])


def _uninitialized(b: OnnxBuilder, node: Node) -> None:
    """A tensor whose values are whatever its memory held (``torch.empty_like``, made to be
    written over) as zeros, which are such values: torch.onnx exports it as a constant of what
    its trace's memory held, which the export's check then accepts or refuses by what the check's
    memory holds, so that a model's segments were cut by the process's heap (Qwen2-MoE's)."""
    from opsched.ir.ops.onnx_builder import ONNX_DTYPES

    if node.out.dtype not in ONNX_DTYPES:
        raise NotExportable(f"{node.attrs['target']}: ONNX has no {node.out.dtype}")
    _constant_of_shape(b, node, 0)


def _constant_of_shape(b: OnnxBuilder, node: Node, value: float) -> None:
    """The node's output as ``value`` everywhere."""
    from onnx import helper

    from opsched.ir.ops.onnx_builder import ONNX_DTYPES

    shape = b.init(np.array(node.out.shape, dtype=np.int64), f"{node.name}_shape")
    held = np.array([value], dtype=getattr(np, node.out.dtype, np.float32))  # bfloat16: as a float
    b.add("ConstantOfShape", [shape], node.name, value=helper.make_tensor("value", ONNX_DTYPES[node.out.dtype], [1],
                                                                          held))


def _copy(b: OnnxBuilder, node: Node) -> None:
    """``self`` overwritten by ``src`` (``y[:, 2:4] = 3`` once functionalised): ``src`` cast to the
    output's type and broadcast to its shape."""
    from opsched.ir.ops.onnx_builder import ONNX_DTYPES

    _tensor_types(b, node, 2)  # both operands of a type ONNX holds, else NotExportable
    cast = b.add("Cast", [_operand(b, node, 1)], b.fresh(f"{node.name}_src"), to=ONNX_DTYPES[node.out.dtype])
    b.add("Expand", [cast, b.init(np.array(node.out.shape, dtype=np.int64), f"{node.name}_shape")], node.name)


def _col2im(b: OnnxBuilder, node: Node) -> None:
    """``F.fold``: ONNX's ``Col2Im`` where ONNX Runtime has a kernel for it (float32; faster than
    the scatter, ``benchmarks/onnx_forms.py``), else :func:`col2im_by_scatter`."""
    size, kernel, dilation, padding, stride = _window_arguments(node)
    (cols,) = _tensor_types(b, node, 1)
    if cols.rank != 3:
        raise NotExportable(f"{node.attrs['target']}: an unbatched fold")
    if cols.dtype != "float32":
        return col2im_by_scatter(b, node)
    b.add("Col2Im", [_operand(b, node, 0), b.init(np.array(size, np.int64), f"{node.name}_size"),
                     b.init(np.array(kernel, np.int64), f"{node.name}_kernel")], node.name,
          dilations=list(dilation), pads=[*padding, *padding], strides=list(stride))


def col2im_by_scatter(b: OnnxBuilder, node: Node) -> None:
    """``F.fold`` (a batched ``col2im`` node) for any dtype: every column's values added into the
    (padded) image at the positions their sliding block covers, as a ScatterElements with
    ``reduction="add"``, then the padding cut off."""
    from onnx import helper

    from opsched.ir.ops.onnx_builder import ONNX_DTYPES

    size, kernel, dilation, padding, stride = _window_arguments(node)
    (cols,) = _tensor_types(b, node, 1)
    n, c = node.out.shape[:2]
    padded = [s + 2 * p for s, p in zip(size, padding)]
    positions = _block_positions(padded, kernel, dilation, stride)
    flat = (n, c, len(positions))
    indices = b.init(np.ascontiguousarray(np.broadcast_to(positions, flat)), f"{node.name}_indices")
    updates = b.add("Reshape", [_operand(b, node, 0), b.init(np.array(flat, np.int64), f"{node.name}_cols")],
                    b.fresh(f"{node.name}_cols"))
    image_size = b.init(np.array([n, c, padded[0] * padded[1]], np.int64), f"{node.name}_image")
    zeros = b.add("ConstantOfShape", [image_size], b.fresh(f"{node.name}_zeros"),
                  value=helper.make_tensor("value", ONNX_DTYPES[cols.dtype], [1], [0]))
    summed = b.add("ScatterElements", [zeros, indices, updates], b.fresh(f"{node.name}_sum"), axis=2,
                   reduction="add")
    image = b.add("Reshape", [summed, b.init(np.array([n, c, *padded], np.int64), f"{node.name}_padded")],
                  b.fresh(f"{node.name}_padded"))
    b.add("Slice", [image, b.init(np.array(padding, np.int64), f"{node.name}_starts"),
                    b.init(np.array([p + s for p, s in zip(padding, size)], np.int64), f"{node.name}_ends"),
                    b.init(np.array([2, 3], np.int64), f"{node.name}_axes")], node.name)


def _im2col(b: OnnxBuilder, node: Node) -> None:
    """``F.unfold``: the (padded) image's pixels gathered at the positions each sliding block
    covers, block by block, into columns."""
    kernel, dilation, padding, stride = _window_arguments(node)
    (image,) = _tensor_types(b, node, 1)
    if image.rank != 4:
        raise NotExportable(f"{node.attrs['target']}: an unbatched unfold")
    n, c, *size = image.shape
    x = _operand(b, node, 0)
    if any(padding):
        pads = b.init(np.array([0, 0, *padding, 0, 0, *padding], np.int64), f"{node.name}_pads")
        x = b.add("Pad", [x, pads], b.fresh(f"{node.name}_pad"))
    padded = [s + 2 * p for s, p in zip(size, padding)]
    positions = _block_positions(padded, kernel, dilation, stride)
    flat = b.add("Reshape", [x, b.init(np.array([n, c, padded[0] * padded[1]], np.int64), f"{node.name}_flat")],
                 b.fresh(f"{node.name}_flat"))
    picked = b.add("Gather", [flat, b.init(positions, f"{node.name}_indices")], b.fresh(f"{node.name}_blocks"),
                   axis=2)
    b.add("Reshape", [picked, b.init(np.array(node.out.shape, np.int64), f"{node.name}_cols")], node.name)


#: The largest window :func:`_windows` makes of strided Slices, one per position in it.
SLICED_WINDOW = 16


def _windows(b: OnnxBuilder, node: Node) -> None:
    """``Tensor.unfold(dim, size, step)``: windows of ``size`` along ``dim``, ``step`` apart,
    each a new last axis. torch.onnx's export makes a Slice and an Unsqueeze per window: at
    UnivNet's 3000 frames of audio, 62,000 nodes, and ONNX Runtime took 233 s to load them.
    Ours grows with the window's size alone: a window of at most :data:`SLICED_WINDOW` is a
    strided Slice per position in it (every window's first entry, every second, ...), stacked
    on the new axis by one Concat; a larger one is a Gather of ``dim`` at a (windows, size) grid
    of positions, then the window's axis moved last. (UnivNet's windows of 3 over 258 samples:
    82 ms as Slices, 311 ms as a Gather, which ONNX Runtime computes entry by entry.)"""
    (x,) = _tensor_types(b, node, 1)
    if x.rank == 0:
        raise NotExportable(f"{node.attrs['target']}: the unfold of a scalar")
    given = arguments(node)
    dim, size, step = given["dimension"] % x.rank, given["size"], given["step"]
    count = (x.shape[dim] - size) // step + 1
    if size <= SLICED_WINDOW:
        axis = b.init(np.array([dim], np.int64), b.fresh("axis"))
        new = b.init(np.array([x.rank], np.int64), b.fresh("axis"))
        stride = b.init(np.array([step], np.int64), b.fresh("step"))
        parts = []
        for j in range(size):
            sliced = b.add("Slice", [_operand(b, node, 0), b.init(np.array([j], np.int64), b.fresh("start")),
                                     b.init(np.array([j + (count - 1) * step + 1], np.int64), b.fresh("end")),
                                     axis, stride], b.fresh(f"{node.name}_at{j}"))
            parts.append(b.add("Unsqueeze", [sliced, new], node.name if size == 1 else b.fresh(f"{node.name}_at{j}")))
        if size > 1:
            b.add("Concat", parts, node.name, axis=x.rank)
        return
    positions = np.arange(count, dtype=np.int64)[:, None] * step + np.arange(size, dtype=np.int64)[None, :]
    last = dim == x.rank - 1  # the window's axis is last already
    picked = b.add("Gather", [_operand(b, node, 0), b.init(positions, f"{node.name}_positions")],
                   node.name if last else b.fresh(f"{node.name}_windows"), axis=dim)
    if not last:
        order = [*range(dim + 1), *range(dim + 2, x.rank + 1), dim + 1]
        b.add("Transpose", [picked], node.name, perm=order)


def _window_arguments(node: Node) -> list[tuple[int, ...]]:
    """``col2im``'s output size, kernel, dilation, padding and stride, each a pair (``im2col``'s
    the same but the output size)."""
    return [tuple(v[1] for v in enc[1]) for enc in node.attrs["args"][1:]]


def _block_positions(padded: Sequence[int], kernel: Sequence[int], dilation: Sequence[int],
                     stride: Sequence[int]) -> np.ndarray:
    """Per column entry of an unfolded image, in ``im2col``'s (kernel offset, block) order, the
    flat index of the padded image's pixel it holds."""
    blocks = [(p - d * (k - 1) - 1) // s + 1 for p, d, k, s in zip(padded, dilation, kernel, stride)]
    ki, kj, bi, bj = np.meshgrid(*(np.arange(e) for e in (*kernel, *blocks)), indexing="ij")
    rows, columns = bi * stride[0] + ki * dilation[0], bj * stride[1] + kj * dilation[1]
    return np.ascontiguousarray((rows * padded[1] + columns).reshape(-1), dtype=np.int64)


def _nearest(b: OnnxBuilder, node: Node) -> None:
    """Nearest-neighbour upsampling (``F.interpolate``, modes ``nearest`` and ``nearest-exact``):
    the rows PyTorch's kernel reads along each spatial axis, found by running the overload on a
    map of row numbers. Where ONNX's Resize reads the same rows (it steps by out/in in float32
    where PyTorch steps by in/out: at whole ratios they agree), a Resize, 60x faster than
    Gathers in ONNX Runtime (``benchmarks/onnx_forms.py``: 25 us against 1.5 ms, 64 channels
    of 28x28 doubled); where they floor apart (torch.onnx's own export of 14 to 16 pixels
    read other rows, up to 5.2 off), a Gather per axis.

    The Resize is given its output's sizes, not its scales: from scales ONNX's shape inference
    computes a size in double precision, ONNX Runtime's kernel in single, and they disagree for
    a quarter of the pairs of sizes up to 24 and 40 (5 to 7 pixels: 6 inferred, 7 made), which
    broke the session of any segment that declared the value's shape."""
    (x,) = _tensor_types(b, node, 1)
    rows = [_rows_read(node, x, axis) for axis in range(2, x.rank)]
    if all(np.array_equal(read, _resize_rows(size, len(read))) for read, size in zip(rows, x.shape[2:])):
        sizes = b.init(np.array([*x.shape[:2], *(len(read) for read in rows)], np.int64), f"{node.name}_sizes")
        b.add("Resize", [_operand(b, node, 0), "", "", sizes], node.name, mode="nearest",
              coordinate_transformation_mode="asymmetric", nearest_mode="floor")
        return
    gathers = [(axis, read) for axis, read in enumerate(rows, start=2)
               if not np.array_equal(read, np.arange(x.shape[axis]))]  # an axis kept as it was needs none
    made = _operand(b, node, 0)
    if not gathers:
        b.add("Identity", [made], node.name)
    for k, (axis, index) in enumerate(gathers):
        made = b.add("Gather", [made, b.init(index, f"{node.name}_rows{axis}")],
                     node.name if k == len(gathers) - 1 else b.fresh(f"{node.name}_axis{axis}"), axis=axis)


#: ONNX's GridSample modes and paddings (its names since opset 20), by PyTorch's enumerations.
_GRID_MODES, _GRID_PADDINGS = ("linear", "nearest", "cubic"), ("zeros", "border", "reflection")


def _grid_sample(b: OnnxBuilder, node: Node) -> None:
    """``F.grid_sample`` (``grid_sampler``: deformable attention's sampling, spatial transformers,
    optical flow's warps) as ONNX's GridSample, whose modes, paddings and corner alignment are
    PyTorch's, over images and volumes alike."""
    _tensor_types(b, node, 2)  # both operands of a type ONNX holds, else NotExportable
    how = arguments(node)
    b.add("GridSample", [_operand(b, node, 0), _operand(b, node, 1)], node.name,
          mode=_GRID_MODES[how["interpolation_mode"]], padding_mode=_GRID_PADDINGS[how["padding_mode"]],
          align_corners=int(how["align_corners"]))


def _rows_read(node: Node, x: TensorType, axis: int) -> np.ndarray:
    """The input rows along ``axis`` that an upsampling ``node`` of ``x`` reads, one per output row."""
    rows = torch.arange(x.shape[axis], dtype=torch.float64)
    probe = rows.reshape([-1 if d == axis else 1 for d in range(x.rank)]).expand(1, 1, *x.shape[2:])
    read = run_on(node, [probe])[tuple(slice(None) if d == axis else 0 for d in range(x.rank))]
    return np.asarray(read.to(torch.int64).numpy(), np.int64)


def _resize_rows(size: int, out: int) -> np.ndarray:
    """The rows ONNX's nearest Resize (asymmetric coordinates, floor) reads making ``out`` rows
    of ``size``, as ONNX Runtime computes them: at the scale out/in, in float32."""
    scale = np.float32(out) / np.float32(size)
    rows: np.ndarray = np.minimum(np.floor(np.arange(out, dtype=np.float32) / scale), size - 1).astype(np.int64)
    return rows


def _tensor_types(b: OnnxBuilder, node: Node, n: int) -> list[TensorType]:
    """The types of a generic node's first ``n`` arguments, all tensors."""
    from opsched.ir.ops.onnx_builder import ONNX_DTYPES

    types = [b.operand_type(node, ref) for ref in node.attrs["args"][:n]]
    for t in types:
        if t is None or t.dtype not in ONNX_DTYPES:
            raise NotExportable(f"{node.attrs['target']}: ONNX has no {t.dtype if t else 'such operand'}")
    return [t for t in types if t is not None]


def _operand(b: OnnxBuilder, node: Node, position: int) -> str:
    """The ONNX value of a generic node's tensor argument at ``position``."""
    return b.operand(node, node.attrs["args"][position])


#: ONNX forms of overloads that torch.onnx cannot export on their own, by target.
ONNX_FORMS: dict[str, Callable[[OnnxBuilder, Node], None]] = {
    "aten::_to_copy.default": _cast, "aten::slice_scatter.default": _slice_scatter,
    "aten::select_scatter.default": _select_scatter, "aten::fill.Scalar": _fill, "aten::fill.Tensor": _fill,
    "aten::copy.default": _copy, "aten::col2im.default": _col2im, "aten::im2col.default": _im2col,
    "aten::index_add.default": _index_add, "aten::unfold.default": _windows,
    **{f"aten::{name}": _uninitialized for name in ("empty_like.default", "empty.memory_format", "new_empty.default",
                                                     "empty_strided.default", "new_empty_strided.default")},
    **{f"aten::{name}.default": _grid_sample for name in ("grid_sampler", "grid_sampler_2d", "grid_sampler_3d")},
    **{f"aten::{name}.{form}": _nearest for name in ("upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
                                                     "_upsample_nearest_exact1d", "_upsample_nearest_exact2d",
                                                     "_upsample_nearest_exact3d") for form in ("default", "vec")},
    **PAIR_FORMS, **EINSUM_FORMS, **ATTENTION_FORMS}

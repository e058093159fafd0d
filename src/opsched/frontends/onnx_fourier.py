"""The ONNX converters of Fourier transforms: ``DFT`` (opsets 17 and 20) and ``STFT``.

ONNX Runtime's CPU DFT and STFT are far slower than torch's FFT (:mod:`opsched.ir.ops.fourier`).
A transform large enough to pay for the session cut that running it outside ONNX Runtime costs
is imported as ATen calls, which run on torch between sessions: the signal as a tensor torch
transforms (the real one squeezed, ONNX's pairs viewed as complex numbers), the FFT, and the
spectrum viewed as pairs again. A transform of what another such transform made reads its
complex spectrum directly. A smaller one stays ONNX Runtime's node (the converter refuses it).
Registered in :mod:`opsched.frontends.onnx_ops`'s table when this module is imported.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import torch

from opsched.frontends._common import In, Unsupported
from opsched.frontends.onnx_ops import Value, onnx_converter
from opsched.ir.ops.fourier import pays_outside_ort
from opsched.ir.types import TensorType

if TYPE_CHECKING:
    from opsched.frontends.onnx import _OnnxConverter

__all__: list[str] = []


def _outside_ort(signals: int, size: int, what: str) -> None:
    """Leave to ONNX Runtime a transform of ``signals`` of ``size`` values too small to pay for a cut."""
    if not pays_outside_ort([(signals, size)]):
        raise Unsupported(f"a {what} of {signals} signals of {size}, too small to pay for a session cut")


_aten = torch.ops.aten


def _fourier_input(c: _OnnxConverter, x: Value, what: str, rank: int | None = None) -> tuple[str, TensorType]:
    """The signal of a transform, which must be ``[..., 1]`` (real) or ``[..., 2]`` (pairs), of ``rank``."""
    x = c.tensor(x)
    t = c.ctx.type(x)
    if t.dtype not in ("float32", "float64") or t.rank < 2 or t.rank != (rank or t.rank) or t.shape[-1] not in (1, 2):
        raise Unsupported(f"a {what} of {t}: expected float32 or float64 signals ending in 1 (real) or 2 (complex)")
    return x, t


def _signal(c: _OnnxConverter, x: str, name: str) -> str:
    """``x`` (ONNX's signal: ``[..., 1]`` real, ``[..., 2]`` pairs) as a tensor torch transforms."""
    if c.ctx.type(x).shape[-1] == 1:
        return c.ctx.aten(_aten.squeeze.dim, [x], [In(0), -1], name=f"{name}_signal")
    if x in c.complex_of:
        return c.complex_of[x]
    dense = c.ctx.aten(_aten.clone.default, [x], [In(0)], {"memory_format": torch.contiguous_format},
                       name=f"{name}_pairs")  # view_as_complex needs the pairs adjacent in memory
    return c.ctx.aten(_aten.view_as_complex.default, [dense], [In(0)], name=f"{name}_signal")


def _spectrum(c: _OnnxConverter, signal: str, onesided: bool, inverse: bool, size: int, axis: int,
              name: str) -> str:
    """The FFT of ``signal`` along ``axis``, as ONNX's pairs."""
    op = _aten.fft_rfft.default if onesided else _aten.fft_ifft.default if inverse else _aten.fft_fft.default
    shape = c.ctx.type(signal).shape
    transforms = math.prod(shape) // shape[axis]
    spectrum = c.ctx.aten(op, [signal], [In(0), size, axis, None], name=f"{name}_spectrum",
                          flops=int(5 * transforms * size * math.log2(size)))  # the usual count for an FFT
    out = c.ctx.aten(_aten.view_as_real.default, [spectrum], [In(0)], name=name)
    c.complex_of[out] = spectrum
    return out


def _dft(c: _OnnxConverter, x: Value, length: Value | None, axis: int, a: dict[str, Any]) -> str:
    x, t = _fourier_input(c, x, "DFT")
    axis = axis + t.rank if axis < 0 else axis
    if not 0 <= axis < t.rank - 1:
        raise Unsupported(f"a DFT along axis {axis} of a signal of rank {t.rank}")
    if length is not None and not isinstance(length, np.ndarray):
        raise Unsupported("a DFT length computed at run time")
    size = int(length) if length is not None else t.shape[axis]
    _outside_ort(math.prod(t.shape[:-1]) // t.shape[axis], size, "DFT")
    inverse, onesided = bool(a.get("inverse", 0)), bool(a.get("onesided", 0))
    if onesided and (inverse or t.shape[-1] == 2):
        raise Unsupported("a one-sided DFT of a complex signal, or an inverse one")
    name = c.out_name()
    return _spectrum(c, _signal(c, x, name), onesided, inverse, size, axis, name)


@onnx_converter("DFT", 17)
def _dft_v17(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    return _dft(c, ins[0], ins[1] if len(ins) > 1 else None, int(a.get("axis", 1)), a)


@onnx_converter("DFT", 20)
def _dft_v20(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    axis = ins[2] if len(ins) > 2 and ins[2] is not None else np.array(-2)
    if not isinstance(axis, np.ndarray):
        raise Unsupported("a DFT axis computed at run time")
    return _dft(c, ins[0], ins[1] if len(ins) > 1 else None, int(axis), a)


@onnx_converter("STFT", 17)
def _stft(c: _OnnxConverter, n: onnx.NodeProto, ins: list[Value], a: dict[str, Any]) -> str:
    """Frames of ``frame_length`` every ``frame_step`` samples, each times the window, transformed."""
    x, t = _fourier_input(c, ins[0], "STFT", rank=3)
    step, window, length = (ins[k] if len(ins) > k else None for k in (1, 2, 3))
    if not all(v is None or isinstance(v, np.ndarray) for v in (step, window, length)):
        raise Unsupported("an STFT whose step, window or frame length is computed at run time")
    if step is None:
        raise Unsupported("an STFT without a frame step")
    if length is not None:
        size = int(length)
    elif window is not None:
        size = len(window)
    else:
        raise Unsupported("an STFT with neither a window nor a frame length")
    if window is not None and window.shape != (size,):
        raise Unsupported(f"an STFT window of shape {window.shape}, for frames of {size}")
    _outside_ort(t.shape[0] * ((t.shape[1] - size) // int(step) + 1), size, "STFT")
    onesided = bool(a.get("onesided", 1))
    if onesided and t.shape[-1] == 2:
        raise Unsupported("a one-sided STFT of a complex signal")
    name = c.out_name()
    frames = c.ctx.aten(_aten.unfold.default, [_signal(c, x, name)], [In(0), 1, size, int(step)],
                        name=f"{name}_frames")
    if window is not None:
        frames = c.ctx.aten(_aten.mul.Tensor, [frames, c.tensor(window, f"{name}_window")], [In(0), In(1)],
                            name=f"{name}_windowed")
    return _spectrum(c, frames, onesided, False, size, 2, name)

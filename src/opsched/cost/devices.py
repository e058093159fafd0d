"""Device presets for the analytic cost model.

Figures are vendor peak numbers (dense fp32 without tensor cores, HBM/DRAM bandwidth), and
occupancy figures from the architecture manuals; launch and synchronisation overheads are
typical measured values for CUDA 11-12 and for a Python thread hand-off. They are a model,
not a measurement: the measured cost model is what a real search should use.

Every precision is priced at the fp32 peak, tensor cores or not: the zoo's convolutions do not
come near the tensor cores' peak. Captured on an H200 in float16 at batch 64 and 128, the kernels
of Inception V3, GoogLeNet and ResNet-50 ran 47-79 TFLOPS, 0.70-1.18x the fp32 peak of 67 and
5-8% of the dense float16 tensor-core peak (``python benchmarks/memory_gpu_explained.py``, its
*graph TFLOPS* column).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from opsched.errors import CostModelError

__all__ = ["DeviceSpec", "DEVICES", "device_spec", "host_cpu_spec"]

_GPU_EFFICIENCY = MappingProxyType({"conv": 0.65, "depthwise": 0.12, "gemm": 0.7, "default": 0.5})
_CPU_EFFICIENCY = MappingProxyType({"conv": 0.55, "depthwise": 0.15, "gemm": 0.6, "default": 0.4})


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """What the analytic model needs to know about a device.

    ``slots`` are SMs (GPU) or cores (CPU). Dense convolutions and GEMMs run as tiles of
    ``tile`` = (output pixels, output channels), ``tiles_per_slot`` resident per slot: an
    operator with fewer tiles than ``slots * tiles_per_slot`` occupies only that fraction of the
    device (a 56x56x154 convolution at batch 1 is 50 tiles of 128x64: 31% of a V100). Other
    operators are spread over threads, ``saturation`` output elements per slot.
    ``overlap`` is how much of the other groups' time hides behind the longest group when
    operators run at once (1 = perfectly, 0 = not at all): co-running kernels contend for
    caches, bandwidth and the block scheduler even when the device has room.
    ``async_launch``: kernels are issued by a host thread and run asynchronously (GPUs), so
    issue overhead overlaps execution; on a CPU each operator's dispatch is on its own thread.
    ``cut_us``: what a stage of several groups costs the plan beyond its barrier, where the
    device's backend runs one-lane segments and running groups at once cuts them
    (:class:`~opsched.cost.SegmentCut`). On a CPU that backend is ONNX Runtime: the call of the
    segment that resumes, and the fusion and weight prepacking lost at the two cuts; the
    measured model's calibration on the project's 2-core machine found 0.03 ms per call and
    0.4 ms per cut (Inception V3); CPU16 assumes the same, unmeasured. GPU plans are captured
    whole into one CUDA graph: nothing.
    """

    name: str
    kind: str  # "gpu" or "cpu"
    peak_gflops: float
    mem_gbps: float
    slots: int
    saturation: int
    tile: tuple[int, int]
    tiles_per_slot: int
    launch_us: float
    sync_us: float
    async_launch: bool
    efficiency: Mapping[str, float] = field(default_factory=lambda: _GPU_EFFICIENCY)
    overlap: float = 0.5
    cut_us: float = 0.0

    def efficiency_of(self, category: str) -> float:
        """The fraction of peak an operator of ``category`` reaches (the default's where unlisted)."""
        return self.efficiency.get(category, self.efficiency["default"])

    def occupancy(self, elems: int, category: str, channels: int = 0, slots: int | None = None) -> float:
        """The fraction of ``slots`` slots (None: all of them) an operator alone keeps busy: a
        tiled one (dense convolution, GEMM, with ``channels`` output channels over ``elems``
        output elements) by its tiles, any other by ``elems``, the elements its threads share."""
        n = self.slots if slots is None else slots
        if category in ("conv", "gemm") and channels:
            rows = max(elems // channels, 1)
            tiles = -(-rows // self.tile[0]) * -(-channels // self.tile[1])
            return min(1.0, tiles / (n * self.tiles_per_slot))
        return min(1.0, max(elems, 1) / (n * self.saturation))


DEVICES: dict[str, DeviceSpec] = {d.name: d for d in (
    DeviceSpec("V100", "gpu", 15_700, 900, 80, 4096, (64, 64), 2, 4.0, 6.0, True),
    DeviceSpec("A100", "gpu", 19_500, 1_555, 108, 4096, (64, 64), 2, 4.0, 6.0, True),
    DeviceSpec("H100", "gpu", 67_000, 3_350, 132, 4096, (64, 64), 2, 3.0, 5.0, True),
    DeviceSpec("H200", "gpu", 67_000, 4_800, 132, 4096, (64, 64), 2, 3.0, 5.0, True),
    DeviceSpec("RTX3090", "gpu", 35_600, 936, 82, 3072, (64, 64), 2, 4.0, 6.0, True),
    DeviceSpec("K80", "gpu", 2_800, 240, 13, 4096, (64, 64), 2, 7.0, 10.0, True),
    # a 2-core AVX2 server (two FMA units x 8 fp32 lanes x 2 flops x ~2.5 GHz per core)
    DeviceSpec("CPU2", "cpu", 160, 20, 2, 4096, (64, 16), 4, 8.0, 25.0, False, _CPU_EFFICIENCY, cut_us=800.0),
    DeviceSpec("CPU16", "cpu", 1_280, 80, 16, 4096, (64, 16), 4, 8.0, 40.0, False, _CPU_EFFICIENCY, cut_us=800.0),
)}


def device_spec(name: str) -> DeviceSpec:
    for key, spec in DEVICES.items():
        if key.lower() == name.lower():
            return spec
    raise CostModelError(f"no device preset {name!r}; presets: {', '.join(DEVICES)}")


def gpu_spec_named_in(name: str) -> DeviceSpec | None:
    """The GPU preset whose name appears in a device's name ("NVIDIA H100 80GB HBM3 sm_90 ..." ->
    H100), or None."""
    flat = name.lower().replace(" ", "")
    return next((s for key, s in DEVICES.items() if s.kind == "gpu" and key.lower() in flat), None)


def preset_for(device: str) -> DeviceSpec:
    """The preset that models ``device`` (a cost model's device string): the preset of that name,
    else the GPU preset named in it, else this machine's CPU."""
    return DEVICES.get(device) or gpu_spec_named_in(device) or host_cpu_spec()


def host_cpu_spec() -> DeviceSpec:
    """The CPU preset with this machine's core count."""
    cores = os.cpu_count() or 1
    return dataclasses.replace(DEVICES["CPU2"], name=f"CPU{cores}", slots=cores)

"""Memory hierarchies: the levels a device keeps data in (per-core caches or shared memory, a
shared last-level cache, DRAM or HBM), their capacities and bandwidths.

What the memory-aware scheduler (:mod:`opsched.schedulers.memory`) splits sub-graphs to fit and
what its traffic simulator charges bytes to. The CPU preset reads this machine's caches from
``/sys/devices/system/cpu/cpu0/cache`` (sizes and which cores share each), with bandwidths
that are typical figures for a server core; ``cpu-measured`` (and a measured cost model's
hierarchy, :func:`hierarchy_for`) measures them instead, by copying a working set sized for each
level (:mod:`opsched.cost.bandwidth`), once per machine where a profile store keeps them. GPU
presets are vendor figures (shared memory per SM, L2, HBM). A GPU runs an instance's kernels
on all of its SMs, so its instances fit L2 and run one after another on one lane; a CPU runs an
instance on one core, so its instances fit a core's L2 and run on several lanes at once.
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from opsched.cost.bandwidth import copy_gbps
from opsched.cost.devices import DEVICES, DeviceSpec, gpu_spec_named_in, host_cpu_spec
from opsched.errors import CostModelError

if TYPE_CHECKING:
    from opsched.cost.measured import Calibrations
    from opsched.progress import Progress

__all__ = ["MemoryLevel", "Hierarchy", "register_hierarchy", "hierarchy", "hierarchy_names", "hierarchy_for",
           "host_hierarchy", "measured_host_hierarchy", "probe_sizes", "read_cpu_caches", "BUILTIN", "HOST_PRESETS"]

KIB = 1024
MIB = 1024 * KIB


@dataclass(frozen=True, slots=True)
class MemoryLevel:
    """One level: ``capacity`` bytes per instance of it (``None``: unbounded, the DRAM), each
    instance shared by ``shared_by`` cores and moving ``bandwidth_gbps`` GB/s. ``persists``:
    data stays in it from one kernel to the next (a cache does; a GPU's shared memory, which a
    kernel fills and leaves, does not, so the traffic simulator passes over it).
    ``measured_at``: the working set (bytes) whose copies measured ``bandwidth_gbps`` on this
    machine; None where the figure is a preset's."""

    name: str
    capacity: int | None
    bandwidth_gbps: float
    shared_by: int = 1
    persists: bool = True
    measured_at: int | None = None

    def __post_init__(self) -> None:
        if self.capacity is not None and self.capacity <= 0:
            raise CostModelError(f"memory level {self.name!r}: capacity must be positive, got {self.capacity}")
        if self.bandwidth_gbps <= 0 or self.shared_by < 1:
            raise CostModelError(f"memory level {self.name!r}: bandwidth and sharing must be positive")

    def __str__(self) -> str:
        size = "unbounded" if self.capacity is None else _size(self.capacity)
        share = "unshared" if self.shared_by == 1 else f"shared by {self.shared_by}"
        source = "" if self.measured_at is None else f" (measured, {_size(self.measured_at)} copies)"
        gbps = f"{self.bandwidth_gbps:,.0f}" if self.bandwidth_gbps >= 100 else f"{self.bandwidth_gbps:.3g}"
        return f"{self.name} {size} {share}, {gbps} GB/s{source}"


@dataclass(frozen=True)
class Hierarchy:
    """A device's levels, fastest first, the last unbounded; ``fit`` names the level an
    instance's live activations must fit (a core's L2 on a CPU, the L2 on a GPU); ``cores``
    are the units instances are bound to (CPU cores; 1 on a GPU, whose instances use every SM);
    ``device`` the analytic preset that prices an instance's compute; ``slots_per_core`` how
    many of its slots one core drives (1 on a CPU; every SM on a GPU, where one lane's kernels
    spread over the whole chip)."""

    name: str
    cores: int
    levels: tuple[MemoryLevel, ...]
    fit: str
    device: DeviceSpec
    slots_per_core: int = 1

    def __post_init__(self) -> None:
        names = [lv.name for lv in self.levels]
        if not self.levels or self.levels[-1].capacity is not None:
            raise CostModelError(f"hierarchy {self.name!r}: the last level must be unbounded (the DRAM), got {names}")
        if any(lv.capacity is None for lv in self.levels[:-1]):
            raise CostModelError(f"hierarchy {self.name!r}: only the last level is unbounded, got {names}")
        if self.fit not in names[:-1]:
            raise CostModelError(f"hierarchy {self.name!r}: instances must fit a bounded level, one of "
                                 f"{names[:-1]}; got {self.fit!r}")
        if self.cores < 1 or self.slots_per_core < 1:
            raise CostModelError(f"hierarchy {self.name!r}: cores and slots per core must be at least 1, got "
                                 f"{self.cores} and {self.slots_per_core}")

    def slots(self, cores: int = 1) -> int:
        """The device's slots (SMs, CPU cores) that ``cores`` of its cores drive."""
        return cores * self.slots_per_core

    def gflops(self, cores: int = 1) -> float:
        """The peak compute of ``cores`` cores."""
        return self.device.peak_gflops * self.slots(cores) / max(self.device.slots, 1)

    def compute_s(self, flops: float, category: str, cores: int = 1) -> float:
        """Seconds of ``flops`` on ``cores`` cores at the device's efficiency for ``category``."""
        return flops / (self.gflops(cores) * 1e9 * self.device.efficiency_of(category))

    def share_gbps(self, level: MemoryLevel, cores: int = 1) -> float:
        """The bandwidth of ``level`` that ``cores`` cores get (a shared level split evenly)."""
        return level.bandwidth_gbps * min(self.slots(cores), level.shared_by) / level.shared_by

    def level(self, name: str) -> MemoryLevel:
        for lv in self.levels:
            if lv.name == name:
                return lv
        raise CostModelError(f"hierarchy {self.name!r} has no level {name!r}; it has "
                             f"{[lv.name for lv in self.levels]}")

    @property
    def fit_level(self) -> MemoryLevel:
        return self.level(self.fit)

    @property
    def fit_bytes(self) -> int:
        """The capacity an instance's live activations must fit."""
        capacity = self.fit_level.capacity
        assert capacity is not None  # checked in __post_init__
        return capacity

    @property
    def dram(self) -> MemoryLevel:
        return self.levels[-1]

    def __str__(self) -> str:
        return f"{self.name} ({self.cores} cores; fit {self.fit}): " + "; ".join(str(lv) for lv in self.levels)


def _size(n: int) -> str:
    return f"{n / MIB:g} MiB" if n >= MIB else f"{n / KIB:g} KiB"


def _parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": KIB, "M": MIB, "G": 1024 * MIB}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _cpu_count(cpu_list: str) -> int:
    count = 0
    for part in cpu_list.strip().split(","):
        a, _, b = part.partition("-")
        count += int(b) - int(a) + 1 if b else 1
    return count


def read_cpu_caches(root: str | os.PathLike[str] = "/sys/devices/system/cpu/cpu0/cache") -> list[tuple[int, int, int]]:
    """This machine's data caches as ``(level, bytes, cores sharing it)``, fastest first, read
    from sysfs; empty where it cannot be read."""
    out = []
    for d in sorted(Path(root).glob("index*")):
        try:
            if (d / "type").read_text().strip() == "Instruction":
                continue
            out.append((int((d / "level").read_text()), _parse_size((d / "size").read_text()),
                        _cpu_count((d / "shared_cpu_list").read_text())))
        except (OSError, ValueError):
            continue
    return sorted(out)


#: Per-core bandwidths of a server core (GB/s) by cache level, and of DRAM per socket: typical
#: figures (a Sapphire Rapids core reads ~150 GB/s from L1, ~60 from L2, ~20 from L3).
_CPU_GBPS = {1: 150.0, 2: 60.0, 3: 20.0}
_DRAM_GBPS = 20.0
#: Where sysfs says nothing: a common server core.
_DEFAULT_CACHES = [(1, 48 * KIB, 1), (2, 2 * MIB, 1), (3, 32 * MIB, 0)]


def host_hierarchy(root: str | os.PathLike[str] = "/sys/devices/system/cpu/cpu0/cache") -> Hierarchy:
    """This CPU: its caches from sysfs (a common server core's where unreadable), DRAM below."""
    cores = os.cpu_count() or 1
    caches = read_cpu_caches(root) or _DEFAULT_CACHES
    levels = []
    for level, size, shared in caches:
        shared = shared or cores
        per_core = _CPU_GBPS.get(level, _DRAM_GBPS)
        levels.append(MemoryLevel(f"L{level}", size, per_core * shared, shared))
    levels.append(MemoryLevel("DRAM", None, _DRAM_GBPS, cores))
    fit = "L2" if any(lv.name == "L2" for lv in levels) else levels[0].name
    return Hierarchy(f"cpu{cores}", cores, tuple(levels), fit, host_cpu_spec())


#: The largest working set the bandwidth probe copies (source and destination together).
_PROBE_MAX = 1024 * MIB


def probe_sizes(h: Hierarchy) -> dict[str, tuple[int, int]]:
    """Per level of ``h``, the working set (bytes) and the threads that measure its bandwidth:
    for a cache, half its capacity but at least twice the level above's, copied on one core (a
    cache's figure is per core, times the cores that share it, as the presets' are); for the
    DRAM, four times the last cache's capacity (at most 1 GiB, or an eighth of the machine's
    memory) copied on every core."""
    sizes, above = {}, 0
    for lv in h.levels[:-1]:
        assert lv.capacity is not None  # only the last level is unbounded (checked by Hierarchy)
        sizes[lv.name] = (max(lv.capacity // 2, 2 * above), 1)
        above = lv.capacity
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        memory = 8 * _PROBE_MAX
    sizes[h.dram.name] = (max(min(4 * above, _PROBE_MAX, memory // 8), 2 * above), h.cores)
    return sizes


@functools.cache
def _probe(nbytes: int, threads: int) -> float:
    return copy_gbps(nbytes, threads) or 0.0


def measured_host_hierarchy(calibrations: Calibrations | None = None,
                            root: str | os.PathLike[str] = "/sys/devices/system/cpu/cpu0/cache",
                            progress: Progress | None = None) -> Hierarchy:
    """This CPU (:func:`host_hierarchy`) with every level's bandwidth measured where a copy can
    measure it (:func:`probe_sizes`, :func:`opsched.cost.bandwidth.copy_gbps`); a level whose copy
    is mostly the call's own cost (the L1, typically) keeps the typical figure. With
    ``calibrations`` (a measured cost model) each figure comes from its profile store, measured
    the first time; without, once per process. ``progress`` hears of each level (the first
    measurement takes seconds)."""
    h = host_hierarchy(root)
    sizes = probe_sizes(h)
    levels = []
    for k, lv in enumerate(h.levels):
        nbytes, threads = sizes[lv.name]
        if progress:
            progress(k, len(h.levels), f"{lv.name} bandwidth")
        if calibrations is None:
            gbps = _probe(nbytes, threads)
        else:
            gbps = calibrations.remember(f"bandwidth/{lv.name}/{nbytes}B/{threads}t",
                                         functools.partial(_probe, nbytes, threads))
        if gbps > 0:  # 0: not measurable, the preset stays
            total = gbps * lv.shared_by if threads == 1 else gbps
            lv = dataclasses.replace(lv, bandwidth_gbps=total, measured_at=nbytes)
        levels.append(lv)
    if progress:
        progress(len(h.levels), len(h.levels), "memory bandwidths")
    return dataclasses.replace(h, name=f"{h.name}-measured", levels=_no_slower_than_outside(levels))


def _no_slower_than_outside(levels: list[MemoryLevel]) -> tuple[MemoryLevel, ...]:
    """``levels`` with each cache that kept its preset (its copies too quick to time: a 1 MiB L2's
    half-megabyte copy) moving, per core, at least what the level outside it moves: a core reads
    its own cache no slower than one it shares (on a 2-core EPYC the preset gave the L2 60 GB/s
    beside a measured L3's 74 per core)."""
    out = list(levels)
    for k in range(len(out) - 2, -1, -1):
        inner, outer = out[k], out[k + 1]
        floor = outer.bandwidth_gbps / outer.shared_by * inner.shared_by
        if inner.measured_at is None and inner.bandwidth_gbps < floor:
            out[k] = dataclasses.replace(inner, bandwidth_gbps=floor)
    return tuple(out)


def _gpu(name: str, sms: int, smem_kib: int, l2_mib: int, l2_gbps: float, hbm_gbps: float) -> Callable[[], Hierarchy]:
    def make() -> Hierarchy:
        levels = (MemoryLevel("SMEM", smem_kib * KIB, 128.0 * 1.5, 1, persists=False),  # ~128 B/clk/SM, ~1.5 GHz
                  MemoryLevel("L2", l2_mib * MIB, l2_gbps, sms),
                  MemoryLevel("HBM", None, hbm_gbps, sms))
        return Hierarchy(name, 1, levels, "L2", DEVICES[name], slots_per_core=sms)
    return make


_PRESETS: dict[str, Callable[[], Hierarchy]] = {
    "cpu": host_hierarchy,
    "cpu-measured": measured_host_hierarchy,
    # shared memory per SM, L2, L2 and HBM bandwidths: vendor whitepapers
    "H100": _gpu("H100", 132, 228, 50, 12_000, 3_350),
    "H200": _gpu("H200", 132, 228, 50, 12_000, 4_800),
    "A100": _gpu("A100", 108, 164, 40, 7_000, 1_555),
    "V100": _gpu("V100", 80, 96, 6, 2_500, 900),
}


#: The presets opsched ships (others are registered by users and tests), and what the
#: machine-dependent ones are, for the options reference.
BUILTIN = tuple(_PRESETS)
HOST_PRESETS = {
    "cpu": "this machine: its caches from sysfs, typical bandwidths of a server core",
    "cpu-measured": "this machine: its caches from sysfs, bandwidths measured by timed copies "
                    "(a few seconds, once per profile store); what a measured cost model's graphturbo uses",
}


def register_hierarchy(name: str, make: Callable[[], Hierarchy]) -> None:
    """Add a preset (``make`` is called when it is asked for, so it may read the machine)."""
    if name in _PRESETS:
        raise CostModelError(f"memory hierarchy {name!r} is registered twice")
    _PRESETS[name] = make


def hierarchy_names() -> list[str]:
    return list(_PRESETS)


def hierarchy(name: str) -> Hierarchy:
    """The preset ``name`` (case-insensitive): ``cpu`` (this machine), ``cpu-measured`` (its
    bandwidths measured), ``H100``, ``H200``, ``A100``, ``V100``, or one registered."""
    for key, make in _PRESETS.items():
        if key.lower() == name.lower():
            return make()
    raise CostModelError(f"no memory hierarchy {name!r}; presets: {', '.join(_PRESETS)}")


def hierarchy_for(device: str, cores: int | None = None, calibrations: Calibrations | None = None,
                  progress: Progress | None = None) -> Hierarchy:
    """The hierarchy of a cost model's device string: the GPU preset named in it ("NVIDIA H100
    80GB HBM3" -> H100, an unknown GPU's "cuda..." -> H100), else this CPU, with ``cores`` where
    given, and its bandwidths measured where ``calibrations`` (a measured cost model) are given
    (``progress`` hears of that)."""
    spec = gpu_spec_named_in(device)
    if spec is not None and spec.name in _PRESETS:
        return hierarchy(spec.name)
    if "cuda" in device.lower() or spec is not None:
        return hierarchy("H100")
    made = host_hierarchy() if calibrations is None else measured_host_hierarchy(calibrations, progress=progress)
    return made if cores is None else dataclasses.replace(made, cores=cores)

"""Processing units as data: what each unit of a heterogeneous platform runs, fuses and costs,
and the links between them.

A :class:`Platform` is a set of :class:`Unit` s (a CPU core pool, a GPU, an NPU that exists
only as a model) and the :class:`Link` s between them. Each unit says which ops it runs
(PartitionTuner's supported / non-supported lists, plus a shape rule for convolutions such as
VTA's "channels a multiple of 16, not grouped"), which chains of op categories it fuses into
one kernel, the analytic preset that models it, and where it really runs (a torch device and a
core count), if anywhere. The default unit holds the model's inputs and outputs and runs
whatever no other unit supports.

Presets (:func:`platform`):

* ``cpu+npu``: a quad Cortex-A53 beside a VTA-like NPU on one DRAM, modelled on
  PartitionTuner's evaluation board (CPU + ETRI's extended VTA on an FPGA). The NPU runs dense
  convolutions whose channel counts are multiples of 16 and nothing else (the paper's device
  config: "supportedNodes: Convolution"). A switch between units costs the paper's fixed 2 ms
  beside the copy (cache flushes and the call into the accelerator's runtime). Simulation only;
* ``cpu-pools``: this machine's cores as two equal pools (two identical units), both real: the
  one platform whose plans run here as they are scheduled;
* ``cpu+cuda``: this machine's CPU beside ``cuda:0`` over PCIe; real where a GPU is present.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from opsched.cost.devices import DeviceSpec, device_spec, gpu_spec_named_in, host_cpu_spec
from opsched.errors import CostModelError
from opsched.ir import Graph, Node, op_schema

__all__ = ["Link", "ConvRule", "Unit", "Platform", "platform", "register_platform", "platform_names",
           "costs_nothing"]


def costs_nothing(node: Node) -> bool:
    """Views and constants: no kernel, so every unit runs them, at no cost."""
    schema = op_schema(node.op)
    return schema.is_view or schema.category == "const"


@dataclass(frozen=True, slots=True)
class Link:
    """Moving a value between two units: a fixed ``switch_us`` (synchronising, flushing,
    calling into the other unit's runtime) plus its bytes at ``gbps``."""

    gbps: float
    switch_us: float = 0.0

    def copy_ms(self, nbytes: int) -> float:
        return self.switch_us / 1e3 + nbytes / (self.gbps * 1e6)


@dataclass(frozen=True, slots=True)
class ConvRule:
    """Which convolutions a unit accepts: input and output channels multiples of
    ``channel_multiple``; grouped (depthwise) ones only with ``grouped``."""

    channel_multiple: int = 1
    grouped: bool = True

    def accepts(self, graph: Graph, node: Node) -> bool:
        if node.attr("groups", 1) > 1 and not self.grouped:
            return False
        cin = graph.types[node.inputs[0]].shape[1]
        return cin % self.channel_multiple == 0 and node.out.shape[1] % self.channel_multiple == 0


@dataclass(frozen=True)
class Unit:
    """One processing unit.

    ``supports``: op names or categories it runs (``None``: every op); ``refuses``: ones it does
    not, even so. Views and constants cost nothing and run anywhere. ``fuses``: chains of op
    categories it runs as one kernel when they follow each other on it (one value passed
    along, read by nothing else). ``spec``: its analytic preset. ``device``/``cores``: the torch
    device and CPU threads it really is (``device=None``: it exists only in the simulator).
    ``kind``: units of one kind are identical (schedulers balance work over them).
    """

    name: str
    spec: DeviceSpec
    device: str | None = "cpu"
    cores: int | None = None
    backend: str = "torch"
    supports: frozenset[str] | None = None
    refuses: frozenset[str] = frozenset()
    conv_rule: ConvRule | None = None
    fuses: tuple[tuple[str, ...], ...] = ()
    kind: str = ""

    def __post_init__(self) -> None:
        if self.supports is not None:
            object.__setattr__(self, "supports", frozenset(self.supports))
        object.__setattr__(self, "refuses", frozenset(self.refuses))
        object.__setattr__(self, "fuses", tuple(tuple(c) for c in self.fuses))
        if not self.kind:
            object.__setattr__(self, "kind", self.name)

    def runs(self, graph: Graph, node: Node) -> bool:
        """Whether this unit can run ``node``."""
        if costs_nothing(node):
            return True
        names = {node.op, op_schema(node.op).category}
        if self.refuses & names or (self.supports is not None and not self.supports & names):
            return False
        return node.op != "conv2d" or self.conv_rule is None or self.conv_rule.accepts(graph, node)

    def fuse_pattern(self, categories: tuple[str, ...]) -> bool:
        return categories in self.fuses


@dataclass(frozen=True)
class Platform:
    """Units (the first is the default unless ``default`` names another), the links between
    them (``links[(a, b)]``, either order; ``link`` for pairs not named)."""

    name: str
    units: tuple[Unit, ...]
    link: Link
    links: Mapping[tuple[str, str], Link] = field(default_factory=dict)
    default: str = ""

    def __post_init__(self) -> None:
        names = [u.name for u in self.units]
        if not names or len(set(names)) != len(names):
            raise CostModelError(f"platform {self.name!r}: units need distinct names, got {names}")
        if not self.default:
            object.__setattr__(self, "default", names[0])
        if self.default not in names:
            raise CostModelError(f"platform {self.name!r}: default unit {self.default!r} is not one of {names}")
        for a, b in self.links:
            if a not in names or b not in names:
                raise CostModelError(f"platform {self.name!r}: link {a}-{b} names a unit it does not have")

    def unit(self, name: str) -> Unit:
        for u in self.units:
            if u.name == name:
                return u
        raise CostModelError(f"platform {self.name!r} has no unit {name!r}; it has "
                             f"{', '.join(u.name for u in self.units)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(u.name for u in self.units)

    def between(self, a: str, b: str) -> Link | None:
        """The link from ``a`` to ``b``; None for a unit and itself (nothing to copy)."""
        if a == b:
            return None
        return self.links.get((a, b)) or self.links.get((b, a)) or self.link

    def shares_memory(self, a: str, b: str) -> bool:
        """Whether a value made on ``a`` is readable on ``b`` as it is (two pools of one CPU)."""
        ua, ub = self.unit(a), self.unit(b)
        return a == b or (ua.device is not None and ua.device == ub.device and ua.device == "cpu")

#: An embedded board's quad Cortex-A53 (4 cores x 1.2 GHz x 8 fp32 flops) on LPDDR4, running a
#: compiler's generic CPU kernels (PartitionTuner's CPU backend is Glow's LLVM one, not a tuned
#: library): a quarter of peak on convolutions.
A53 = DeviceSpec("A53x4", "cpu", 38, 4, 4, 4096, (64, 16), 4, 10.0, 30.0, False,
                 {"conv": 0.25, "depthwise": 0.08, "gemm": 0.3, "default": 0.2})
#: A VTA-like NPU: a 16x16 int8 GEMM core at 200 MHz (102 GOP/s) on the same DRAM; every call
#: pays the instruction stream and cache maintenance of the accelerator's runtime.
VTA = DeviceSpec("VTA", "npu", 102, 4, 1, 4096, (16, 16), 64, 150.0, 0.0, False,
                 {"conv": 0.7, "depthwise": 0.1, "gemm": 0.7, "default": 0.3})


def _cpu_npu() -> Platform:
    cpu = Unit("cpu", A53, device=None, fuses=(("elementwise", "activation"),))
    npu = Unit("npu", VTA, device=None, supports=frozenset({"conv2d"}), conv_rule=ConvRule(16, grouped=False))
    return Platform("cpu+npu", (cpu, npu), Link(gbps=2.0, switch_us=2000.0))


def _cpu_pools() -> Platform:
    cores = os.cpu_count() or 1
    half = max(1, cores // 2)
    spec = dataclasses.replace(host_cpu_spec(), name=f"CPU{half}", slots=half)
    pools = tuple(Unit(f"cpu{k}", spec, device="cpu", cores=half, kind="cpu") for k in range(2))
    # a value made by one pool is read by the other in place: a hand-off between threads
    return Platform("cpu-pools", pools, Link(gbps=1e6, switch_us=spec.sync_us))


def _cpu_cuda() -> Platform:
    cpu = Unit("cpu", host_cpu_spec(), device="cpu", cores=os.cpu_count())
    here = torch.cuda.get_device_name(0) if torch.cuda.is_available() else ""
    # measured as the CUDA backend times stages: captured replays, no launch overhead
    gpu = Unit("cuda:0", gpu_spec_named_in(here) or device_spec("H100"), device="cuda:0", backend="cuda")
    return Platform("cpu+cuda", (cpu, gpu), Link(gbps=12.0, switch_us=15.0))


_PLATFORMS: dict[str, Callable[[], Platform]] = {
    "cpu+npu": _cpu_npu, "cpu-pools": _cpu_pools, "cpu+cuda": _cpu_cuda,
}


def register_platform(name: str, make: Callable[[], Platform]) -> None:
    """Make ``platform(name)`` return ``make()`` (a preset of your own hardware)."""
    if name in _PLATFORMS:
        raise ValueError(f"platform {name!r} is registered twice")
    _PLATFORMS[name] = make


def platform_names() -> list[str]:
    return list(_PLATFORMS)


def platform(name: str | Platform) -> Platform:
    """The platform preset ``name`` (a :class:`Platform` is returned as it is)."""
    if isinstance(name, Platform):
        return name
    make = _PLATFORMS.get(name)
    if make is None:
        close = difflib.get_close_matches(str(name), _PLATFORMS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise CostModelError(f"no platform {name!r}{hint}; presets: {', '.join(_PLATFORMS)}")
    return make()


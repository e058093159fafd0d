"""How a plan is to run: the device, the cores, capture and layout (one record for every backend)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["RunOptions"]


@dataclass(frozen=True)
class RunOptions:
    """What an executor is built for (:meth:`opsched.backends.Backend.prepare`).

    ``cores``: CPU threads a plan may use (None: torch's setting). ``graphs``: on a GPU, capture
    the plan into one CUDA graph. ``channels_last``: 4-D values in channels-last layout (GPU).
    ``spin``: let idle CPU threads spin between kernels where the backend can (ONNX Runtime,
    a plan that is one session) within a call: faster calls, the threads stopping when the call
    returns; plans being measured never spin. ``platform``: the platform preset
    whose units a placed plan's lanes name (:mod:`opsched.cost.units`), for the units backend.
    """

    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    cores: int | None = None
    graphs: bool = True
    channels_last: bool = False
    spin: bool = False
    platform: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "device", torch.device(self.device))

"""Cost models: the protocol, device presets, the analytic model (and the measured one)."""

from opsched.cost.analytic import AnalyticCostModel
from opsched.cost.base import CostModel, SegmentCut
from opsched.cost.devices import DEVICES, DeviceSpec, device_spec
from opsched.cost.random import RandomCostModel

__all__ = ["AnalyticCostModel", "CostModel", "DEVICES", "DeviceSpec", "RandomCostModel", "SegmentCut", "device_spec"]

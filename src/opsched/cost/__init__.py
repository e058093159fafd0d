"""Cost models: the protocol, device presets, the analytic model, the measured one, the profile
store, and what schedulers build on them (stage pricing, cut costs, resource demands)."""

from opsched.cost.analytic import AnalyticCostModel
from opsched.cost.base import CostModel, SegmentCut
from opsched.cost.coster import StageCoster, estimate_stages
from opsched.cost.demands import resources_for
from opsched.cost.devices import DEVICES, DeviceSpec, device_spec, host_cpu_spec
from opsched.cost.measured import MeasuredCostModel, StageTiming, TimingPolicy
from opsched.cost.random import RandomCostModel
from opsched.cost.resources import OpDemand, ResourceModel
from opsched.cost.store import ProfileContext, ProfileStore

__all__ = [
    "AnalyticCostModel", "CostModel", "DEVICES", "DeviceSpec", "MeasuredCostModel", "OpDemand", "ProfileContext",
    "ProfileStore", "RandomCostModel", "ResourceModel", "SegmentCut", "StageCoster", "StageTiming", "TimingPolicy",
    "device_spec", "estimate_stages", "host_cpu_spec", "resources_for",
]

"""Frontends: PyTorch modules (torch.fx) and ONNX files into :class:`opsched.ir.Graph`."""

from opsched.frontends.onnx import from_onnx
from opsched.frontends.pytorch import TRACERS, from_torch

__all__ = ["TRACERS", "from_onnx", "from_torch"]

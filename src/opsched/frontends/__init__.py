"""Frontends: PyTorch modules (torch.fx) and ONNX files into :class:`opsched.ir.Graph`."""

from opsched.frontends.onnx import from_onnx
from opsched.frontends.torch_fx import from_torch

__all__ = ["from_onnx", "from_torch"]

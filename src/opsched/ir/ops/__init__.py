"""The op families: per op kind, in one place, its schema (shape rule, FLOPs, category), its
torch kernel, its ONNX export and, for convolutions, the merge rule.

Importing this package registers every family (:mod:`opsched` does so on import). To add an op:
one :class:`OpDef` in the module of its family (or a new module imported here).
"""

from opsched.ir.ops import activation, aten, constant, conv, elementwise, linear, norm, onnx_node, pool, reduce, shape
from opsched.ir.ops._common import pair
from opsched.ir.ops.activation import ACTIVATIONS, Activation
from opsched.ir.ops.registry import Kernel, NotExportable, OpDef, op_def, op_defs, torch_kernel

__all__ = [
    "ACTIVATIONS", "Activation", "Kernel", "NotExportable", "OpDef", "activation", "aten", "constant", "conv",
    "elementwise", "linear", "norm", "onnx_node", "op_def", "op_defs", "pair", "pool", "reduce", "shape",
    "torch_kernel",
]

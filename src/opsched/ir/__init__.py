"""The graph IR: frozen nodes in topological order, parameters beside them, one op registry."""

from opsched.ir.builder import GraphBuilder
from opsched.ir.graph import Graph, GraphInput, tensor_type
from opsched.ir.hashing import group_wiring, node_signature, stage_key, structural_hash
from opsched.ir.node import Node
from opsched.ir.ops import ACTIVATIONS, OpSchema, node_bytes, node_flops, op_schema, registered_ops
from opsched.ir.types import FrozenAttrs, TensorType

__all__ = [
    "ACTIVATIONS", "FrozenAttrs", "Graph", "GraphBuilder", "GraphInput", "Node", "OpSchema",
    "TensorType", "node_bytes", "node_flops", "node_signature", "op_schema", "registered_ops",
    "stage_key", "structural_hash", "group_wiring", "tensor_type",
]

"""The graph IR: frozen nodes in topological order, parameters beside them, one op schema registry."""

from opsched.ir.builder import GraphBuilder
from opsched.ir.graph import Graph, GraphInput, random_inputs, tensor_type
from opsched.ir.hashing import cost_signature, group_wiring, node_signature, stage_key, structural_hash
from opsched.ir.node import Node
from opsched.ir.schema import CATEGORIES, OpSchema, node_bytes, node_flops, op_schema, register_op, registered_ops
from opsched.ir.types import FrozenAttrs, TensorType

__all__ = [
    "CATEGORIES", "FrozenAttrs", "Graph", "GraphBuilder", "GraphInput", "Node", "OpSchema", "TensorType", "ops",
    "cost_signature", "group_wiring", "node_bytes", "node_flops", "node_signature", "op_schema", "random_inputs",
    "register_op", "registered_ops", "stage_key", "structural_hash", "tensor_type",
]

# The op families register their schemas, kernels and exports: the IR always knows its ops.
from opsched.ir import ops  # noqa: E402

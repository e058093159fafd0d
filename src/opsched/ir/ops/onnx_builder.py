"""The builder every ONNX export writes into: fresh names under the step's label, initializers
(weights held apart from the model: :mod:`opsched.ir.ops.onnx_session`).

Every ONNX node and value made for a step is named after the step (its node, or
``merge(a,b)``), so that ONNX Runtime's profile, whose kernels keep such names even after
fusing or converting nodes, can be read back per step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper

from opsched.ir.graph import Graph
from opsched.ir.node import Node
from opsched.ir.ops.onnx_session import INLINE_BYTES, OnnxModel, external
from opsched.ir.ops.registry import NotExportable
from opsched.ir.types import COMPLEX_PARTS, TensorType

__all__ = ["NotExportable", "OnnxBuilder", "ONNX_DTYPES", "OPSET"]

#: The opset every segment is exported at: the newest that torch.onnx's TorchScript exporter
#: (which exports generic ATen nodes) writes, so that what exporters write today (opset 18-20:
#: ``Col2Im``, ``GroupNormalization``, ``Gelu``) joins segments as it is.
OPSET = 20

#: The IR's dtype names as ONNX element types.
ONNX_DTYPES: dict[str, int] = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
                               "float64": TensorProto.DOUBLE, "int64": TensorProto.INT64,
                               "int32": TensorProto.INT32, "int16": TensorProto.INT16, "int8": TensorProto.INT8,
                               "uint8": TensorProto.UINT8, "bool": TensorProto.BOOL,
                               "bfloat16": TensorProto.BFLOAT16}


class OnnxBuilder:
    """Collects ONNX nodes and initializers; a ``dry_run`` builder only checks exportability
    (no weights are copied)."""

    def __init__(self, graph: Graph, dry_run: bool = False) -> None:
        self.graph = graph
        self.dry_run = dry_run
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.weights: dict[str, np.ndarray] = {}  # initializers held apart, by name
        self._n = 0
        self.owner = ""  # the step being exported: a prefix of every name made for it
        self.domains: dict[str, int] = {}  # operator sets besides ai.onnx that the nodes use: their versions

    def fresh(self, hint: str) -> str:
        self._n += 1
        return f"{self.owner}/{hint}__{self._n}"

    def init(self, value: np.ndarray | torch.Tensor, hint: str) -> str:
        """A constant (an initializer) named after ``hint``; one larger than
        :data:`~opsched.ir.ops.onnx_session.INLINE_BYTES` is held apart (not copied)."""
        name = self.fresh(hint)
        if self.dry_run:
            return name
        arr = np.asarray(value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else value, order="C")
        if arr.nbytes > INLINE_BYTES:
            self.weights[name] = arr
            self.inits.append(external(name, arr))
        else:
            self.inits.append(numpy_helper.from_array(arr, name))  # 0-d stays 0-d
        return name

    def param(self, node: Node, i: int) -> str:
        """The node's i-th parameter as an initializer."""
        return self.init(self.graph.params[node.params[i]], f"{node.name}_p{i}")

    def operand(self, node: Node, ref: Sequence[Any]) -> str:
        """The ONNX value a node's operand reference names: ``("t", k)`` its k-th input,
        ``("p", k)`` its k-th parameter (as an initializer), ``("-",)`` an input left out ("")."""
        tag = ref[0]
        return node.inputs[ref[1]] if tag == "t" else self.param(node, ref[1]) if tag == "p" else ""

    def operand_type(self, node: Node, ref: Sequence[Any]) -> TensorType | None:
        """The type of the operand ``ref`` names (:meth:`operand`); None for one left out."""
        tag = ref[0]
        return self.graph.types[node.inputs[ref[1]]] if tag == "t" else \
            self.graph.param_types[node.params[ref[1]]] if tag == "p" else None

    def promoted_inputs(self, node: Node) -> list[str]:
        """``node``'s inputs, each cast to its output's dtype where it differs: torch promotes the
        operands of arithmetic and concatenation (``mask * x``), ONNX takes them of one type."""
        dtype = node.out.dtype
        return [v if self.graph.types[v].dtype == dtype else
                self.add("Cast", [v], self.fresh(f"{node.name}_{dtype}"), to=ONNX_DTYPES[dtype]) for v in node.inputs]

    def declare(self, domain: str, version: int) -> None:
        """Have the model import ``domain`` (``com.microsoft``) at ``version``; a segment holds
        one version of each."""
        if self.domains.setdefault(domain, version) != version:
            raise NotExportable(f"operator set {domain} at version {version}, where the segment uses version "
                                f"{self.domains[domain]}")

    def add(self, op: str, inputs: Sequence[str], output: str | None = None, **attrs: Any) -> str:
        """An ONNX node ``op`` reading ``inputs``; returns its (one) output's name."""
        out = output or self.fresh(op)
        self.nodes.append(helper.make_node(op, list(inputs), [out], name=self.fresh(op), **attrs))
        return out

    def add_multi(self, op: str, inputs: Sequence[str], outputs: Sequence[str], **attrs: Any) -> None:
        """An ONNX node with several outputs."""
        self.nodes.append(helper.make_node(op, list(inputs), list(outputs), name=self.fresh(op), **attrs))

    def model(self, inputs: Sequence[str], outputs: Sequence[str]) -> OnnxModel:
        """The model of everything added, reading ``inputs`` and producing ``outputs`` (graph values),
        declared at :data:`OPSET`, or at :data:`~opsched.ir.ops.onnx_opsets.OLDEST` where every node
        means the same there, and its weights held apart."""
        from opsched.ir.ops.onnx_opsets import declared_oldest

        def info(v: str) -> onnx.ValueInfoProto:
            t = self.graph.types[v]
            if t.dtype in COMPLEX_PARTS:  # as its pairs of parts (opsched.ir.ops.fourier)
                return helper.make_tensor_value_info(v, ONNX_DTYPES[COMPLEX_PARTS[t.dtype]], [*t.shape, 2])
            return helper.make_tensor_value_info(v, ONNX_DTYPES[t.dtype], list(t.shape))

        g = helper.make_graph(self.nodes, "segment", [info(v) for v in inputs], [info(v) for v in outputs],
                              self.inits)
        opsets = [helper.make_opsetid("", OPSET), *(helper.make_opsetid(d, v) for d, v in self.domains.items())]
        model = helper.make_model(g, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets, True))
        # ONNX Runtime's older kernels where they mean the same
        return OnnxModel(declared_oldest(model, OPSET), dict(self.weights))

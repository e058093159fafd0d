"""Export a segment of a graph (an ordered list of nodes or merged convolutions) to ONNX.

Used by the ONNX Runtime backend: each lane segment of a plan becomes one ONNX model whose
inputs are the values it reads from elsewhere and whose outputs are the values read elsewhere.
Every op exports through its family's exporter (:attr:`opsched.ir.ops.OpDef.onnx`); an op without
one, or a configuration its exporter refuses (:class:`~opsched.ops.NotExportable`), is not
exportable and the backend runs that step with torch.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from opsched.ir import Graph, Node
from opsched.ir.ops import NotExportable, op_def
from opsched.ir.ops.conv import export_merged
from opsched.ir.ops.fourier import PAIR_FORMS
from opsched.ir.ops.onnx_builder import ONNX_DTYPES, OnnxBuilder
from opsched.ir.types import COMPLEX_PARTS
from opsched.runtime.plan import step_label

__all__ = ["export_segment", "exportable"]


def exportable(graph: Graph, node: Node) -> bool:
    """Whether ``node`` exports to ONNX: its op has an exporter that accepts its configuration,
    and ONNX has a type for every value it reads and makes; complex values, which ONNX Runtime's
    kernels do not take, only as pairs of parts, read and made by the overloads that have a form
    on pairs (:mod:`opsched.ir.ops.fourier`: a small enough Fourier transform, say)."""
    export = op_def(node.op).onnx
    held = (node.out, *(graph.types[v] for v in node.inputs), *(graph.param_types[p] for p in node.params))
    unheld = {t.dtype for t in held} - set(ONNX_DTYPES)
    on_pairs = unheld <= set(COMPLEX_PARTS) and node.attrs.get("target") in PAIR_FORMS and not node.params
    if export is None or (unheld and not on_pairs):
        return False
    try:
        export(OnnxBuilder(graph, dry_run=True), node)
    except NotExportable:
        return False
    return True


def export_segment(graph: Graph, items: Sequence[tuple[str, ...]], inputs: Sequence[str],
                   outputs: Sequence[str]) -> onnx.ModelProto:
    """``items``: per step, its node names (one, or several for a merged convolution)."""
    b = OnnxBuilder(graph)
    for names in items:
        b.owner = step_label(names)
        if len(names) > 1:
            export_merged(b, names)
        else:
            node = graph.node(names[0])
            export = op_def(node.op).onnx
            assert export is not None, f"step {names[0]!r} is not exportable; the backend checks first"
            export(b, node)
    return b.model(inputs, outputs)

"""Export a segment of a graph (an ordered list of nodes or merged convolutions) to ONNX.

Used by the ONNX Runtime backend: each lane segment of a plan becomes one ONNX model whose
inputs are the values it reads from elsewhere and whose outputs are the values read elsewhere.
Every op exports through its family's exporter (:attr:`opsched.ir.ops.OpDef.onnx`); an op without
one, or a configuration its exporter refuses (:class:`~opsched.ir.ops.NotExportable`), is not
exportable and the backend runs that step with torch. So is a node for whose types ONNX Runtime's
CPU provider lacks a kernel: it has one of every op for float32, and for float64, float16 and the
integers only of some (no float64 ``Conv``, say).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from opsched._text import first_line
from opsched.ir import Graph, Node
from opsched.ir.ops import NotExportable, op_def
from opsched.ir.ops.conv import export_merged
from opsched.ir.ops.fourier import PAIR_FORMS
from opsched.ir.ops.onnx_builder import ONNX_DTYPES, OnnxBuilder
from opsched.ir.ops.onnx_node import ort_errors
from opsched.ir.ops.onnx_session import OnnxModel
from opsched.ir.types import COMPLEX_PARTS
from opsched.runtime.plan import step_label

__all__ = ["export_segment", "exportable", "refusal"]

log = logging.getLogger(__name__)


#: The element types for which ONNX Runtime's CPU provider has a kernel of every op we export.
_EVERY_KERNEL = frozenset({"float32"})

#: Per node signature (op, configuration and types): why ONNX Runtime builds no session of it,
#: None where it does.
_NO_KERNEL: dict[tuple[Any, ...], str | None] = {}


def exportable(graph: Graph, node: Node) -> bool:
    """Whether ``node`` exports to ONNX and runs there (:func:`refusal`)."""
    return refusal(graph, node) is None


def refusal(graph: Graph, node: Node) -> str | None:
    """Why ``node`` does not export to ONNX and run there, or None where it does: its op has an
    exporter that accepts its configuration, ONNX has a type for every value it reads and makes,
    and ONNX Runtime a kernel for each at those types; complex values, which ONNX Runtime's
    kernels do not take, only as pairs of parts, read and made by the overloads that have a form
    on pairs (:mod:`opsched.ir.ops.fourier`: a small enough Fourier transform, say)."""
    opdef = op_def(node.op)
    held = (node.out, *(graph.types[v] for v in node.inputs), *(graph.param_types[p] for p in node.params))
    dtypes = {t.dtype for t in held}
    unheld = dtypes - set(ONNX_DTYPES)
    on_pairs = unheld <= set(COMPLEX_PARTS) and node.attrs.get("target") in PAIR_FORMS and not node.params
    if opdef.onnx is None:
        return opdef.no_onnx
    if unheld and not on_pairs:
        return f"ONNX has no {', '.join(sorted(unheld))} for it to take"
    try:
        opdef.onnx(OnnxBuilder(graph, dry_run=True), node)
    except NotExportable as e:
        return str(e)
    return None if dtypes <= _EVERY_KERNEL else _kernel_refusal(graph, node)


def _kernel_refusal(graph: Graph, node: Node) -> str | None:
    """Why ONNX Runtime's CPU provider makes no session of ``node`` alone (it lacks a kernel for
    an ONNX node the node exports to, at its types, or refuses the form it exports to, which is a
    bug of the export's, logged), or None. Asked once per op, configuration and types."""
    key = (node.op, node.attrs, tuple(graph.types[v] for v in node.inputs),
           tuple(graph.param_types[p] for p in node.params), node.out)
    if key not in _NO_KERNEL:
        from onnxruntime.capi.onnxruntime_pybind11_state import NotImplemented as NoKernel

        from opsched.backends.ort_program import ort_session

        model = export_segment(graph, [(node.name,)], list(dict.fromkeys(node.inputs)), [node.name])
        try:
            ort_session(model, threads=1)
            _NO_KERNEL[key] = None
        except NoKernel as e:
            found = re.search(r"Could not find an implementation for (\w+\(\d+\))", str(e))
            kernel = found.group(1) if found else "one of its ONNX nodes"
            types = ", ".join(sorted({t.dtype for t in (node.out, *(graph.types[v] for v in node.inputs))}))
            _NO_KERNEL[key] = f"ONNX Runtime's CPU provider has no {kernel} kernel for {types}"
        except ort_errors() as e:  # our export's fault: the node runs with torch, and says so
            _NO_KERNEL[key] = f"ONNX Runtime refuses its ONNX form ({first_line(e)})"
            log.warning("node %r (%s): %s; it runs with torch. This is opsched's bug: please report it",
                        node.name, node.attrs.get("target", node.op), _NO_KERNEL[key])
    return _NO_KERNEL[key]


def export_segment(graph: Graph, items: Sequence[tuple[str, ...]], inputs: Sequence[str],
                   outputs: Sequence[str]) -> OnnxModel:
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

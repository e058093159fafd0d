"""A generic ATen call (:mod:`opsched.ir.ops.aten`) in ONNX.

Through an ONNX form of ours where the overload has one (:mod:`opsched.ir.ops.aten_onnx`), else
through torch.onnx's TorchScript symbolic for it, run on the one call (or, for a composite
overload without a working symbolic, on the calls it is made of: ``aten::multiply`` as
``aten::mul``, ``aten::tile`` as ``repeat``) and spliced into the segment. The symbolics are
someone else's code and some are wrong without a word, so every export is prepared and checked
here: dimensions counted from the end are counted up first, overloads whose symbolic is known
wrong are exported as one that computes the same (``floor_divide``) or refused (tie-ordered
indices), and each signature's export is run once by ONNX Runtime on drawn tensors against the
overload; one that differs is refused (:class:`NotExportable`), so the call runs with torch.
"""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch

from opsched.ir.node import Node
from opsched.ir.ops.aten import arguments, decode_arg, overload
from opsched.ir.ops.registry import Kernel, NotExportable
from opsched.ir.types import TensorType

if TYPE_CHECKING:
    import onnx

    from opsched.ir.ops.onnx_builder import OnnxBuilder

__all__ = ["export_as", "export_call", "export_default"]


class _OneCall(torch.nn.Module):
    def __init__(self, call: Kernel) -> None:
        super().__init__()
        self.call = call

    def forward(self, *tensors: torch.Tensor) -> Any:
        return self.call(*tensors)


def _example(t: TensorType, integers: int = 0) -> torch.Tensor:
    """A tensor of type ``t`` to trace a call on: floats drawn, integers all ``integers`` (zeros are
    an index into anything; a divisor needs ones)."""
    dtype = getattr(torch, t.dtype)
    return torch.rand(t.shape, dtype=dtype) if dtype.is_floating_point else torch.full(t.shape, integers, dtype=dtype)


def _exported(target: str, args: Any, kwargs: Any, index: int | None, inputs: tuple[TensorType, ...],
              params: tuple[TensorType, ...]) -> onnx.ModelProto:
    """One call exported by torch.onnx, its parameters as model inputs after its inputs (so the
    model is the same for every node of this signature, whatever its weights), and checked: run
    by ONNX Runtime, it gives what the overload gives (:func:`_checked_export`)."""
    made = _checked_export(target, args, kwargs, index, inputs, params)
    if isinstance(made, str):
        raise NotExportable(made)
    return made


# Every signature of a large model held at once: TimesFM 2.5's unrolled loop has 1,084, and a cache of
# 1,024 evicted them between the check of which nodes export and the export of the segments, so each
# was exported and checked twice (2,153 misses). An entry is one call's ONNX model, without weights.
@functools.lru_cache(maxsize=16_384)
def _checked_export(target: str, args: Any, kwargs: Any, index: int | None, inputs: tuple[TensorType, ...],
                    params: tuple[TensorType, ...]) -> onnx.ModelProto | str:
    """:func:`_exported`'s model, or why there is none; a refusal is kept like a model, so that
    a signature torch.onnx cannot export, or exports wrongly, costs one attempt per process.

    torch.onnx's symbolics are checked because some are wrong, silently: its ``unfold`` over a
    negative dimension slices another axis (PatchTST's patching gave a tensor of another shape)
    and its ``floor_divide`` truncates. The check runs the export and the overload on the same
    drawn tensors (floats from a normal distribution, so signs vary; integers as the export's
    examples) and wants equal integers and floats equal within :data:`_AGREE` of the dtype."""
    from opsched.ir.ops.onnx_builder import OPSET

    op = overload(target)
    # its own symbolic, then, for a composite, what it is made of: an alias without a symbolic
    # (aten::multiply as aten::mul), or one whose symbolic makes an If (aten::tile, as repeat)
    runs = [run for run, ok in ((op, _has_symbolic(op._schema.name)), (op.decompose, _composite(op))) if ok]
    if not runs:
        return f"{target}: torch.onnx has no export for it at opset {OPSET}"
    reasons = []
    for run in runs:
        made = _export_by(run, target, args, kwargs, index, inputs, params)
        if not isinstance(made, str):
            return made
        reasons.append(made)
    return reasons[0]


def _export_by(run: Any, target: str, args: Any, kwargs: Any, index: int | None, inputs: tuple[TensorType, ...],
               params: tuple[TensorType, ...]) -> onnx.ModelProto | str:
    """The call exported by torch.onnx as ``run`` computes it (the overload ``target`` names, or
    what it is made of), checked against the overload (:func:`_checked_export`); or why there
    is no such model."""
    import onnx

    from opsched.ir.ops.onnx_builder import OPSET

    op = overload(target)
    n_in = len(inputs)

    def calling(fn: Any) -> Any:
        def call(*tensors: torch.Tensor) -> Any:
            ins, ps = tensors[:n_in], tensors[n_in:]
            a = [decode_arg(x, ins, ps, torch.device("cpu"), None) for x in args]
            k = {key: decode_arg(v, ins, ps, torch.device("cpu"), None) for key, v in kwargs}
            out = fn(*a, **k)
            return out if index is None else out[index]
        return call

    held = (*inputs, *params)
    fills = (0, 1) if any(not getattr(torch, t.dtype).is_floating_point for t in held) else (0,)
    for fill in fills:  # integers as zeros, then (an integer division by zeros fails) as ones
        examples, buf = tuple(_example(t, fill) for t in held), io.BytesIO()
        try:
            with warnings.catch_warnings(), _no_output(), _autocast_cache_kept():
                warnings.simplefilter("ignore")
                torch.onnx.export(_OneCall(calling(run)), examples, buf,  # type: ignore[arg-type]  # a file works
                                  dynamo=False, opset_version=OPSET,
                                  input_names=[f"in{i}" for i in range(len(examples))], output_names=["out"])
            break
        except Exception as e:  # noqa: BLE001 (torch.onnx's refusals come in many types)
            if fill == fills[-1]:
                return f"{target}: torch.onnx has no export for it ({type(e).__name__}: {str(e).splitlines()[0][:200]})"
    model = onnx.load_model_from_string(buf.getvalue())
    for n in model.graph.node:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in n.attribute):
            return f"{target}: its ONNX form has a sub-graph ({n.op_type})"
    if len(model.graph.output) != 1:
        return f"{target}: its ONNX form has {len(model.graph.output)} outputs, expected one"
    if torch.Tag.nondeterministic_seeded in op.tags:
        return model  # draws random numbers: nothing to compare
    apart = _apart(model, calling(op), held, fill)
    return f"{target}: {apart}" if apart else model


#: How far a float result of ONNX Runtime may be from the overload's and agree, relative and
#: absolute, by dtype: far above what two kernels' orders of summation make, far below a wrong
#: export. (No bfloat16: its tensors cannot reach ONNX Runtime's Python API to be checked.)
_AGREE = {torch.float16: 1e-2, torch.float32: 1e-3, torch.float64: 1e-7}


def _apart(model: onnx.ModelProto, call: Kernel, held: tuple[TensorType, ...], fill: int) -> str:
    """How torch.onnx's export, run by ONNX Runtime's CPU provider, and ``call`` differ on drawn
    tensors of the types ``held``, or why it cannot be run to know; empty where they agree."""
    import numpy as np
    import onnxruntime as ort

    draw = torch.Generator().manual_seed(0)
    examples = [torch.randn(t.shape, generator=draw).to(dtype) if (dtype := getattr(torch, t.dtype)).is_floating_point
                else _example(t, fill) for t in held]
    if any(e.dtype == torch.bfloat16 for e in examples):
        return "its export cannot be checked: ONNX Runtime's Python API takes no bfloat16 tensors"
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = 1, 3
    present = {i.name for i in model.graph.input}
    try:
        session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        (got,) = session.run(None, {f"in{k}": e.numpy() for k, e in enumerate(examples) if f"in{k}" in present})
    except Exception as e:  # noqa: BLE001 (ONNX Runtime raises its own types for every refusal)
        return f"ONNX Runtime cannot run torch.onnx's export of it: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
    want = call(*examples)
    if tuple(got.shape) != tuple(want.shape):
        return f"torch.onnx's export gives shape {tuple(got.shape)} where the overload gives {tuple(want.shape)}"
    computed = torch.from_numpy(np.ascontiguousarray(got)).to(want.dtype)
    bound = _AGREE.get(want.dtype)
    if bound is None:
        agree = torch.equal(computed, want)
    else:
        agree = torch.allclose(computed, want, rtol=bound, atol=bound, equal_nan=True)
    return "" if agree else "torch.onnx's export computes otherwise than the overload on drawn tensors"


@contextlib.contextmanager
def _autocast_cache_kept() -> Iterator[None]:
    """Autocast's weight cache on or off as found: torch.onnx's TorchScript exporter turns it off
    while it traces and, where the trace raises, leaves it off for the rest of the process (where
    every torch.compile'd function's guards then fail, and it compiles again)."""
    before = torch.is_autocast_cache_enabled()
    try:
        yield
    finally:
        torch.set_autocast_cache_enabled(before)


@contextlib.contextmanager
def _no_output() -> Iterator[None]:
    """The process's standard output closed to what is written meanwhile: where an export fails,
    torch.onnx's TorchScript exporter prints the traced graph there from C++ (it turns its log on
    for every export and, checking whether it was on by the function rather than its value, never
    turns it off)."""
    sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no standard output to close
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 1)
            yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def _composite(op: torch._ops.OpOverload) -> bool:
    """Whether ``op`` is defined as other ATen calls (CompositeImplicitAutograd), which
    ``op.decompose`` makes."""
    return bool(op.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd))


@functools.cache
def _has_symbolic(name: str) -> bool:
    """Whether torch.onnx's TorchScript exporter has a symbolic for ``name`` (``aten::cumsum``).

    Asked first, so that an op without one costs no trace and no failed export (an op with one
    can still fail to export: :func:`_no_output` keeps the graph it prints off the screen). The
    registry fills as the exporter imports its symbolics, on its first export: asked before, it
    lacked those of later opsets (``grid_sampler``'s, of opset 16, was missing until some other
    call had been exported), so they are imported first. The registry is private: where it
    moved, every call is tried."""
    from opsched.ir.ops.onnx_builder import OPSET

    try:
        from torch.onnx._internal.torchscript_exporter.registration import registry
        from torch.onnx._internal.torchscript_exporter.utils import _trigger_symbolic_function_registration
    except ImportError:
        return True
    _trigger_symbolic_function_registration()
    return bool(registry.is_registered_op(name, OPSET))


#: The outputs that ONNX Runtime and PyTorch's CPU kernels make differently from tied values: the
#: indices of ``topk`` and of an unstable ``sort`` or ``argsort``, which ORT gives lowest first
#: and PyTorch in its algorithm's order (RT-DETR picks its queries by topk over scores that tie
#: where anchors are masked out: 0.2 off). A stable sort's are ORT's, but have no export.
_TIES_APART = frozenset({("aten::topk.default", 1), ("aten::sort.default", 1), ("aten::argsort.default", None)})


def _unfaithful(node: Node) -> str | None:
    """Why torch.onnx's export of the call computes otherwise than PyTorch, where it does."""
    target = node.attrs["target"]
    if (target, node.attrs.get("index")) in _TIES_APART:
        return "ONNX Runtime orders tied values by index, PyTorch's kernel otherwise: the indices would differ"
    if target == "aten::index_put.default" and arguments(node).get("accumulate"):
        return "its export writes each repeated index once, where PyTorch accumulates every write"
    if target == "aten::as_strided.default":  # the import made a gather of every one that reads its input's elements
        return "it reads memory beyond its input's elements, by a layout that ONNX values do not have"
    return None


#: Overloads exported as another that computes the same, whose symbolic is right where theirs is
#: not: torch.onnx's ``floor_divide`` truncates (``-7 // 3`` gave -2, ``-2.1 // 0.7`` gave -3.0).
_EXPORTED_AS: dict[str, tuple[str, tuple[tuple[str, Any], ...]]] = {
    "aten::floor_divide.default": ("aten::div.Tensor_mode", (("rounding_mode", ("v", "floor")),)),
}


#: The arguments that name dimensions, by their schema names.
_DIMS = frozenset({"dim", "dims", "dim0", "dim1", "dim2", "dimension", "start_dim", "end_dim", "source",
                   "destination"})
#: Overloads whose dimension arguments count in their result, which has one axis more.
_ADD_AN_AXIS = frozenset({"aten::unsqueeze", "aten::stack"})


def _dims_counted_up(target: str, args: Any, kwargs: Any, inputs: tuple[TensorType, ...],
                     params: tuple[TensorType, ...]) -> tuple[Any, Any]:
    """The encoded arguments with every negative dimension counted up from zero (``-2`` of a
    rank-3 tensor is ``1``): several of torch.onnx's symbolics take them as they come, and so
    ``permute(x, [0, -2, -1, 1])`` exported a Transpose that ONNX refuses (Mamba-2) and
    ``unfold(x, -2, ...)`` one that slices another axis. The rank is that of the call's first
    tensor argument (the first of a list: ``cat``)."""
    op = overload(target)
    first = args[0] if args else None
    while first is not None and first[0] == "list":
        first = first[1][0] if first[1] else None
    if first is None or first[0] not in ("t", "p"):
        return args, kwargs
    rank = len((inputs if first[0] == "t" else params)[first[1]].shape) + (op._schema.name in _ADD_AN_AXIS)

    def up(enc: Any) -> Any:
        tag, value = enc
        if tag == "list":
            return ("list", tuple(up(v) for v in value))
        return ("v", value + rank) if tag == "v" and isinstance(value, int) and not isinstance(value, bool) \
            and value < 0 else enc

    names = [a.name for a in op._schema.arguments]
    counted = tuple(up(a) if i < len(names) and names[i] in _DIMS else a for i, a in enumerate(args))
    return counted, tuple((k, up(v) if k in _DIMS else v) for k, v in kwargs)


def export_call(b: OnnxBuilder, node: Node) -> None:
    """The call's exported nodes, spliced in: its inputs and parameters renamed to the
    segment's values, its output to the node's, everything else fresh under the step's name.

    Where the ONNX form gives another element type than the ATen op (torch.onnx exports
    ``cumsum`` of int32 as an int32 CumSum, where ATen promotes to int64), a Cast to the op's
    type follows, so the segment's declared types hold."""
    from opsched.ir.ops.aten_onnx import ONNX_FORMS

    if node.attrs["target"] in ONNX_FORMS:
        return ONNX_FORMS[node.attrs["target"]](b, node)
    export_default(b, node)


def export_default(b: OnnxBuilder, node: Node) -> None:
    """The call exported by torch.onnx's symbolic for it (or for what it is exported as), checked:
    :func:`export_call` where no form of ours takes its place, and a form's own fallback."""
    unfaithful = _unfaithful(node)
    if unfaithful:
        raise NotExportable(f"{node.attrs['target']}: {unfaithful}")
    target, kwargs = _EXPORTED_AS.get(node.attrs["target"], (node.attrs["target"], node.attrs["kwargs"]))
    g = b.graph
    export_as(b, node, target, node.attrs["args"], kwargs, list(node.inputs), [g.types[v] for v in node.inputs])


def export_as(b: OnnxBuilder, node: Node, target: str, args: Any, kwargs: Any, inputs: list[str],
              types: list[TensorType], output: str | None = None) -> None:
    """``node`` exported as the call ``target(*args, **kwargs)`` by torch.onnx (checked), reading
    the segment's values ``inputs`` (of ``types``) where ``args`` name its inputs, and its own
    parameters: what :func:`export_call` splices in, and what a form of ours can splice in on
    operands it made (an attention's key and value heads, repeated). Its result is named
    ``output``, the node's own name unless given (a form that works on it further)."""
    from onnx import helper, numpy_helper

    from opsched.ir.ops.onnx_builder import ONNX_DTYPES

    g = b.graph
    params = tuple(g.param_types[p] for p in node.params)
    args, kwargs = _dims_counted_up(target, args, kwargs, tuple(types), params)
    model = _exported(target, args, kwargs, node.attrs.get("index"), tuple(types), params)
    # by name: the exporter drops inputs the call does not read (type_as reads only its other's dtype)
    present = {i.name for i in model.graph.input}
    names = {f"in{k}": v for k, v in enumerate(inputs)}
    names.update({f"in{len(inputs) + k}": b.param(node, k) for k in range(len(node.params))
                  if f"in{len(inputs) + k}" in present})
    names[""] = ""  # an optional input left out
    for init in model.graph.initializer:
        names[init.name] = b.init(numpy_helper.to_array(init), init.name)
    out = model.graph.output[0].name
    exported_type, wanted_type = model.graph.output[0].type.tensor_type.elem_type, ONNX_DTYPES[node.out.dtype]
    cast = exported_type not in (0, wanted_type)
    computed = {v for n in model.graph.node for v in n.output}
    output = output or node.name
    if out in computed and not cast:
        names[out] = output

    def renamed(v: str) -> str:
        if v not in names:
            names[v] = b.fresh(v.rsplit("/", 1)[-1] or "v")
        return names[v]

    for n in model.graph.node:
        made = helper.make_node(n.op_type, [renamed(v) for v in n.input], [renamed(v) for v in n.output],
                                name=b.fresh(n.op_type), domain=n.domain or None)
        made.attribute.extend(n.attribute)
        b.nodes.append(made)
    if cast:
        b.add("Cast", [renamed(out)], output, to=wanted_type)
    elif out not in computed:  # the call gives back an input or a constant: ONNX needs a node to name it
        b.add("Identity", [names[out]], output)

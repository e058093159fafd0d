"""ONNX import: opset-versioned converters, constant folding of shape arithmetic, one error
listing every unsupported op.

A converter is registered for an op type and the first opset its form applies to; for a model
of opset v the converter with the largest ``since <= v`` is used (ONNX changed, for example,
Split, Slice, Clip and ReduceMean from attributes to inputs over its versions). Values are
either graph tensors (names) or compile-time constants (NumPy arrays): initializers, Constant
nodes, and any foldable op whose inputs are all constants (the Shape/Gather/Concat arithmetic
exporters emit around reshapes).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnx.reference
import torch
from numpy.typing import ArrayLike
from onnx import helper, numpy_helper

from opsched._text import first_line, value_name
from opsched.errors import FrontendError, MalformedModelError, UnsupportedOpError
from opsched.frontends import onnx_fourier  # noqa: F401 (registers the DFT and STFT converters)
from opsched.frontends._common import ConversionContext, Unsupported, report_opaque
from opsched.frontends.onnx_file import at_our_opset, declared_dims, read_onnx
from opsched.frontends.onnx_fold import FOLDABLE
from opsched.frontends.onnx_functions import expand_functions
from opsched.frontends.onnx_ops import Value, converter_for, supported_onnx_ops
from opsched.ir import Graph, tensor_type
from opsched.ir.ops.onnx_builder import ONNX_DTYPES, OPSET
from opsched.ir.ops.onnx_node import (
    ONNX_GENERIC_OPS,
    captured,
    encode_proto,
    one_node_session,
    onnx_category,
    ort_errors,
    subgraphs,
)
from opsched.ir.types import FrozenAttrs, TensorType
from opsched.structure import FixedInput
from opsched.transforms import canonicalize

__all__ = ["from_onnx", "supported_onnx_ops"]

log = logging.getLogger("opsched.frontends")


def from_onnx(model: str | os.PathLike[str] | onnx.ModelProto, *, name: str | None = None,
              input_shapes: Mapping[str, Sequence[int]] | None = None,
              input_values: Mapping[str, ArrayLike] | None = None, canonical: bool = True) -> Graph:
    """Import an ONNX model (a path or a loaded ``ModelProto``) as a :class:`~opsched.ir.Graph`.

    Dynamic input dimensions must be fixed with ``input_shapes={"input": (1, 3, 224, 224)}``.
    ``input_values={"sr": 16000}`` fixes inputs at a value instead: the graph computes with it
    as a constant and no longer takes it (a sample rate, a mode flag: an input whose value
    selects what the model computes, which the drawn inputs opsched times plans on would not;
    an ``If`` it decides is replaced by the branch it takes).
    Raises :class:`MalformedModelError` for a file that is missing, truncated or invalid, and
    :class:`UnsupportedOpError` listing every op the model uses that opsched cannot convert.
    """
    file = read_onnx(model)
    name = name or file.model.graph.name or "onnx_model"
    initializers = {init.name for init in file.model.graph.initializer} | set(file.weights)
    real_inputs = [i.name for i in file.model.graph.input if i.name not in initializers]
    for given, names in (("input_shapes", input_shapes), ("input_values", input_values)):
        if unknown := sorted(set(names or {}) - set(real_inputs)):
            raise FrontendError(f"{file.source}: {given} names {', '.join(map(repr, unknown))}, but the model's "
                                f"inputs are {', '.join(map(repr, real_inputs))}")
    if both := sorted(set(input_shapes or {}) & set(input_values or {})):
        raise FrontendError(f"{file.source}: {', '.join(map(repr, both))} given both a shape and a value: a value "
                            f"has its shape")
    file = at_our_opset(file)
    if file.opset > OPSET:  # kept newer: ops the segments lack, as ONNX defines them in older ones
        expanded = expand_functions(file)
        file = at_our_opset(expanded) if expanded is not file else file
    source = file.source
    converter = _OnnxConverter(file.model, file.opset, name, source, dict(input_shapes or {}), file.weights,
                               dict(input_values or {}))
    graph = converter.run().verify()
    if canonical:
        graph = canonicalize(graph)
    report_opaque(graph, f"from_onnx({source})")
    return graph


def _array(tensor: onnx.TensorProto, source: str) -> np.ndarray:
    try:
        return numpy_helper.to_array(tensor)
    except Exception as e:
        raise MalformedModelError(f"{source}: initializer {tensor.name!r} (shape {list(tensor.dims)}): its data "
                                  f"cannot be read: {first_line(e)}") from e


class _Failed:
    """The value of a node that cannot be imported (reported once, with every other)."""


_FAILED = _Failed()


class _OnnxConverter:
    def __init__(self, model: onnx.ModelProto, opset: int, name: str, source: str,
                 input_shapes: dict[str, Sequence[int]], weights: Mapping[str, onnx.TensorProto],
                 input_values: dict[str, ArrayLike]) -> None:
        self.model, self.g, self.opset, self.source = model, model.graph, opset, source
        self.weights = weights  # initializers the model lists as inputs (see _skeleton)
        self.ctx = ConversionContext(name)
        self.env: dict[str, Value] = {}
        self.input_shapes, self.input_values = input_shapes, input_values
        self.failures: list[tuple[onnx.NodeProto, str]] = []
        self.complex_of: dict[str, str] = {}  # a DFT's output (pairs of reals) -> its complex spectrum
        self._opsets = {o.domain or "": o.version for o in model.opset_import}

    def value_name(self, onnx_name: str) -> str:
        return value_name(onnx_name)

    def run(self) -> Graph:
        for init in (*self.g.initializer, *self.weights.values()):
            self.env[init.name] = _array(init, self.source)
        # an input keeps its name where it is an identifier; a name made one (input.1 -> input_1) that
        # another input holds already (input_1) is numbered
        taken = {inp.name for inp in self.g.input if value_name(inp.name) == inp.name}
        fixed: list[FixedInput] = []
        for inp in [inp for inp in self.g.input if inp.name not in self.env]:  # not an initializer listed as one
            if inp.name in self.input_values:
                self.env[inp.name] = value = self._input_value(inp)
                before = len(fixed) + len(self.ctx.b.inputs)  # the model's inputs before it
                fixed.append(FixedInput(value_name(inp.name), torch.from_numpy(value.copy()), before))
                continue
            name = value_name(inp.name)
            if name != inp.name and (name in taken or self.ctx.b.holds(name)):
                name = self.ctx.b.fresh(name)
            self.env[inp.name] = self.ctx.b.input(name, self._input_shape(inp), _dtype(inp, self.source))
        self.inferred = self._infer_types()
        for node in self.g.node:
            self._convert(node)
        if self.failures:
            listing = "; ".join(f"node {n.name or n.output[0]!r} ({_op(n)}): {why}" for n, why in self.failures)
            raise UnsupportedOpError(f"{self.source}: {len(self.failures)} node(s) cannot be imported: {listing}",
                                     sorted({_op(n) for n, _ in self.failures}))
        outputs = []
        for out in self.g.output:
            v = self.env[out.name]
            if not isinstance(v, str):
                v = self._const_node(v, out.name)
            outputs.append(v)
        return self.ctx.b.build(outputs).replace(fixed_inputs=tuple(fixed))

    def _infer_types(self) -> dict[str, TensorType]:
        """Every value's type that ONNX shape inference can tell, the inputs at their fixed shapes."""
        model = onnx.ModelProto()
        model.CopyFrom(self.model)
        # the file's own annotations are inferred again: they may predate the fixed sizes (Paddle2ONNX's -1, or
        # an output declared at the batch it was exported at where only the inputs' batch was made dynamic)
        del model.graph.value_info[:]
        for out in model.graph.output:
            out.type.tensor_type.ClearField("shape")
        for inp in model.graph.input:
            v = self.env.get(inp.name)
            if isinstance(v, (str, np.ndarray)):
                del inp.type.tensor_type.shape.dim[:]
                for d in self.ctx.type(v).shape if isinstance(v, str) else v.shape:
                    inp.type.tensor_type.shape.dim.add().dim_value = d
        try:
            model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception:  # noqa: BLE001 (types then come from running each generic node once)
            return {}
        known = {vi.name: t for vi in [*model.graph.value_info, *model.graph.output] if (t := _static(vi))}
        # an output whose shape inference cannot tell (an Expand to a shape the model is given) is as declared
        known.update({vi.name: t for vi in self.g.output if vi.name not in known and (t := _static(vi))})
        return known

    def _input_shape(self, inp: onnx.ValueInfoProto) -> tuple[int, ...]:
        dims = declared_dims(inp)
        shown = "no declared shape" if dims is None else f"dimensions [{', '.join(map(str, dims))}]"
        if inp.name in self.input_shapes:
            given = tuple(int(d) for d in self.input_shapes[inp.name])
            if dims is not None and (len(given) != len(dims) or
                                     any(isinstance(d, int) and d != g for d, g in zip(dims, given))):
                raise FrontendError(f"{self.source}: input_shapes gives input {inp.name!r} the shape {given}, but the "
                                    f"file declares {shown}: only its dynamic ones can be chosen")
            return given
        if dims is None:
            raise FrontendError(f"{self.source}: input {inp.name!r} declares no shape; give it with "
                                f"input_shapes={{{inp.name!r}: (...)}}")
        if dynamic := [d for d in dims if isinstance(d, str)]:
            raise FrontendError(f"{self.source}: input {inp.name!r} has dynamic dimension(s) "
                                f"{', '.join(map(repr, dynamic))} ({shown}); fix them with "
                                f"input_shapes={{{inp.name!r}: (...)}}")
        return tuple(int(d) for d in dims)

    def _input_value(self, inp: onnx.ValueInfoProto) -> np.ndarray:
        """The value ``input_values`` fixes ``inp`` at, of its declared type and a shape that fits."""
        dims, dtype = declared_dims(inp), helper.tensor_dtype_to_np_dtype(int(inp.type.tensor_type.elem_type))
        try:
            value = np.asarray(self.input_values[inp.name], dtype=dtype)
        except (TypeError, ValueError) as e:
            raise FrontendError(f"{self.source}: input_values gives input {inp.name!r} a value that is not of its "
                                f"type, {dtype}: {e}") from e
        if dims is not None and (value.ndim != len(dims) or
                                 any(isinstance(d, int) and d != n for d, n in zip(dims, value.shape))):
            raise FrontendError(f"{self.source}: input_values gives input {inp.name!r} a value of shape "
                                f"{value.shape}, but the file declares dimensions [{', '.join(map(str, dims))}]")
        return value

    def _convert(self, node: onnx.NodeProto) -> None:
        ins = [self.env[i] if i else None for i in node.input]
        outer = {v: self.env[v] for v in captured(node)}  # what its sub-graphs read from here
        if any(i is _FAILED for i in (*ins, *outer.values())):  # downstream of a reported failure
            self.env.update({o: _FAILED for o in node.output})
            return
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: (v.decode() if isinstance(v, bytes) else v) for k, v in attrs.items()}
        where = f"{self.source}: node {node.name or node.output[0]!r} ({node.op_type})"
        if _foldable(node, [*ins, *outer.values()]):
            try:
                folded = self._fold(node, ins, attrs, outer)
            except Exception as e:
                raise FrontendError(f"{where}: constant folding failed: {e}") from e
            self.env.update({o: np.asarray(v) for o, v in zip(node.output, folded) if o})
            return
        if node.op_type == "If" and not node.domain and isinstance(ins[0], np.ndarray):
            self._inline(node, attrs["then_branch" if ins[0].item() else "else_branch"])
            return
        if outer:  # no converter of ours models a sub-graph
            self._generic(node, ins, outer)
            return
        if node.op_type == "Shape" and not node.domain:
            x = ins[0]
            shape = np.array(x.shape if isinstance(x, np.ndarray) else self.ctx.type(self.tensor(x)).shape, np.int64)
            start, end = attrs.get("start", 0), attrs.get("end")
            self.env[node.output[0]] = shape[start:end]
            return
        conv = converter_for(node.op_type, self.opset) if not node.domain else None
        self._node = node
        if conv is not None:
            try:
                made = conv(self, node, ins, attrs)
            except Unsupported as e:  # a form ours does not model: ONNX Runtime runs the node as it is
                log.debug("%s: %s; imported as a generic ONNX node", where, e)
            else:
                outs = made if isinstance(made, list) else [made]
                self.env.update(zip(node.output, outs))
                return
        self._generic(node, ins)

    def _inline(self, node: onnx.NodeProto, branch: onnx.GraphProto) -> None:
        """An ``If`` whose condition is a constant as the branch it takes: that branch's nodes, in
        its place (ONNX names a value once across a model and its sub-graphs, so theirs stay)."""
        for init in branch.initializer:
            self.env[init.name] = _array(init, self.source)
        for inner in branch.node:
            self._convert(inner)
        self.env.update({o: self.env[out.name] for o, out in zip(node.output, branch.output) if o})

    def _fold(self, node: onnx.NodeProto, ins: list[Value], attrs: dict[str, Any],
              outer: Mapping[str, Value]) -> list[np.ndarray]:
        """A node whose inputs (and the outer values its sub-graphs read) are all constants,
        evaluated now: by our NumPy rule where there is one, else by ONNX's reference
        implementation, else (where that fails) by ONNX Runtime."""
        if node.op_type in FOLDABLE and not node.domain:
            return [FOLDABLE[node.op_type](self, ins, attrs)]
        feeds = {i: np.asarray(v) for i, v in (*zip(node.input, ins), *outer.items()) if i}
        inputs = [helper.make_tensor_value_info(i, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
                  for i, v in feeds.items()]
        one = helper.make_graph([node], "fold", inputs, [onnx.ValueInfoProto(name=o) for o in node.output if o])
        model = helper.make_model(one, opset_imports=[helper.make_opsetid(d, v) for d, v in self._opsets.items()])
        try:
            return list(onnx.reference.ReferenceEvaluator(model).run(None, feeds))
        except Exception:  # noqa: BLE001 (the reference implementation has gaps; ONNX Runtime is the authority)
            import onnxruntime

            session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
            return list(session.run(None, feeds))

    def _generic(self, node: onnx.NodeProto, ins: list[Value], outer: Mapping[str, Value] | None = None) -> None:
        """``node`` as a generic ONNX node (:mod:`opsched.ir.ops.onnx_node`), one per output, the
        ``outer`` values its sub-graphs read as inputs after its own; what ONNX Runtime cannot
        run is recorded for the error :meth:`run` raises."""
        inputs: list[str] = []
        params: list[str] = []
        slots: list[tuple[Any, ...]] = []
        for k, v in enumerate([*ins, *(outer or {}).values()]):
            if v is None:
                slots.append(("-",))
            elif isinstance(v, str):
                slots.append(("t", len(inputs)))
                inputs.append(v)
            else:
                slots.append(("p", len(params)))
                params.append(self.param(np.asarray(v), f"{node.output[0]}_in{k}"))
        base: dict[str, Any] = {"op_type": node.op_type, "domain": node.domain, "proto": encode_proto(node),
                                "opset": self._opsets.get("", self.opset), "slots": tuple(slots)}
        if outer:
            base["captures"] = tuple(outer)
        if node.domain:
            base["domain_version"] = self._opsets.get(node.domain, 1)
        types = [*(self.ctx.type(v) for v in inputs), *(tensor_type(self.ctx.b.params[p]) for p in params)]
        # shape inference typed the node from its inputs' types as it inferred them; where one of ours differs
        # (ONNX's rule for a pool with ceil_mode and padding is not ONNX Runtime's), the node is run instead, as
        # one with sub-graphs is: their outputs' types are the file's word, which inference takes as it stands
        agrees = all(self.inferred.get(name) in (None, self.ctx.type(v))
                     for name, v in zip(node.input, ins) if isinstance(v, str))
        agrees = agrees and not subgraphs(node)
        values = [self.ctx.b.params[p].numpy() for p in params]
        why = ""
        for open_shapes in (False, True) if outer else (False,):
            # ONNX Runtime's shape inference in sub-graphs may fail at sizes the file left open: then open they stay
            if open_shapes:
                base["open_shapes"] = True
            try:
                outs = self._generic_types(node, base, types, values, agrees and not open_shapes)
                break
            except ort_errors() as e:
                why = why or f"ONNX Runtime cannot run it: {first_line(e)}"
            except Unsupported as e:
                why = str(e)
        else:
            self.failures.append((node, why))
            self.env.update({o: _FAILED for o in node.output})
            return
        kind = ONNX_GENERIC_OPS[onnx_category(node.op_type)]
        for i, (o, t) in enumerate(zip(node.output, outs)):
            if o and t is not None:
                self.env[o] = self.ctx.add(kind, inputs, name=self.value_name(o), params=params, out=t,
                                           **base, index=i)

    def _generic_types(self, node: onnx.NodeProto, base: dict[str, Any], types: list[TensorType],
                       params: list[np.ndarray], inferred: bool) -> list[TensorType | None]:
        """Each output's type: from shape inference where it is ``inferred`` right, else from
        running the node once (on zeros for its inputs, its parameters' values). ONNX Runtime must
        be able to run it either way: its sessions are built here."""
        values = [*(np.zeros(t.shape, t.dtype) for t in types[:len(types) - len(params)]), *params]
        feeds = [{f"in{k}": v for k, v in enumerate(values)}]
        if node.op_type == "If" and not node.domain and base["slots"][0][0] == "t":
            # a computed condition: either branch may be taken, and one may not run at the sizes given at all
            # (Silero VAD's 8 kHz branch on a 16 kHz window), so each is tried; where both run, they must agree
            feeds.append({**feeds[0], "in0": np.ones(types[0].shape, bool)})
        out: list[TensorType | None] = []
        for i, o in enumerate(node.output):
            session = one_node_session(FrozenAttrs({**base, "index": i}), types) if o else None
            if session is None or (inferred and o in self.inferred):
                out.append(self.inferred.get(o))
                continue
            out.append(_one_type(session, feeds, o))
        return out

    # helpers for converters
    def out_name(self, i: int = 0) -> str:
        return self.value_name(self._node.output[i])

    def tensor(self, v: Value, hint: str = "const") -> str:
        if isinstance(v, str):
            return v
        if isinstance(v, np.ndarray):
            return self._const_node(v, hint)
        raise Unsupported("a required input is missing")

    def _const_node(self, arr: np.ndarray, hint: str) -> str:
        t = torch.from_numpy(np.array(arr, order="C"))
        name = self.value_name(hint)
        return self.ctx.add("constant", [], name=name, params=[self.ctx.param(name, t)])

    def param(self, v: Value, hint: str) -> str:
        if not isinstance(v, np.ndarray):
            raise Unsupported(f"{hint} must be a constant (an initializer)")
        return self.ctx.param(self.value_name(hint), torch.from_numpy(np.array(v, order="C")))


#: ONNX element types as the IR's dtype names: every type a value of a segment may have.
_DTYPES: dict[int, str] = {elem: name for name, elem in ONNX_DTYPES.items()}


def _dtype(inp: onnx.ValueInfoProto, source: str) -> str:
    """The IR's dtype of a graph input: a uint8 image, int32 token ids and a boolean mask keep
    their types (they were imported as float32 once, and the module then refused them)."""
    elem = int(inp.type.tensor_type.elem_type)
    if inp.type.HasField("tensor_type") and elem in _DTYPES:
        return _DTYPES[elem]
    kind = inp.type.WhichOneof("value")
    what = (f"a tensor of {helper.tensor_dtype_to_string(elem).removeprefix('TensorProto.').lower()}" if elem else
            "a tensor of no declared element type") if kind == "tensor_type" else f"a {kind or 'value of no type'}"
    raise FrontendError(f"{source}: input {inp.name!r} is {what}; opsched takes tensors of "
                        f"{', '.join(sorted(ONNX_DTYPES))}")


def _static(value: onnx.ValueInfoProto) -> TensorType | None:
    """The type ``value`` declares, where it is a tensor of a dtype of ours and every size is fixed."""
    dtype = _DTYPES.get(int(value.type.tensor_type.elem_type))
    dims = declared_dims(value)
    if not dtype or dims is None or not all(isinstance(d, int) for d in dims):
        return None
    return TensorType(tuple(int(d) for d in dims), dtype)


def _one_type(session: Any, feeds: Sequence[Mapping[str, np.ndarray]], output: str) -> TensorType:
    """The type of what ``session`` returns on each feed it runs on; ONNX Runtime's error where it
    runs on none, and :class:`Unsupported` where they differ (one type per value)."""
    found: dict[TensorType, None] = {}
    error: Exception | None = None
    for feed in feeds:
        try:
            (r,) = session.run(None, dict(feed))
        except ort_errors() as e:
            error = error or e
            continue
        if not isinstance(r, np.ndarray):
            raise Unsupported(f"its output {output!r} is a {type(r).__name__} (an ONNX sequence or map); opsched's "
                              f"values are tensors")
        found[TensorType(tuple(int(d) for d in r.shape), str(r.dtype))] = None
    if not found:
        assert error is not None
        raise error
    if len(found) > 1:
        raise Unsupported(f"its output {output!r} is {' or '.join(map(str, found))} by the branch taken, and the "
                          f"condition is computed: a value has one type (where an input decides the condition, "
                          f"input_values= fixes it)")
    return next(iter(found))


def _op(node: onnx.NodeProto) -> str:
    return f"{node.domain}::{node.op_type}" if node.domain else node.op_type


def _foldable(node: onnx.NodeProto, ins: list[Value]) -> bool:
    """Computable now: a constant, or a deterministic node whose every input is a constant."""
    if node.op_type.startswith("Random"):
        return False
    if node.op_type == "DequantizeLinear" and not node.domain:
        # a quantized weight stays quantized: ONNX Runtime fuses DequantizeLinear -> Conv/MatMul ->
        # QuantizeLinear into its integer kernels, which a float weight would rule out
        return False
    if node.op_type == "Constant":
        return True
    return bool(ins) and all(i is None or isinstance(i, np.ndarray) for i in ins) and \
        any(isinstance(i, np.ndarray) for i in ins)

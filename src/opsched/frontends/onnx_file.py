"""An ONNX file as the converter reads it, read as ONNX Runtime would.

:func:`read_onnx` loads a path (with weights stored beside the file, as ``torch.onnx.export``
writes them) or takes a loaded model; sets large initializers aside so that ONNX's passes do
not serialise them; checks it with ``onnx.checker``, and where that refuses a file ONNX Runtime
loads (an output without a shape, nodes out of order) imports it all the same, nodes sorted.
:func:`at_our_opset` brings it to the segments' opset with ``onnx.version_converter``, mending
what the converter's Resize adapters get wrong (onnx/onnx#8480, #5266).
:func:`onnx_input_dims` reads a file's declared input dimensions without its weights.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass

import onnx
from onnx import external_data_helper, helper, numpy_helper, version_converter

from opsched._text import first_line
from opsched._toposort import topological_order
from opsched.errors import FrontendError, MalformedModelError
from opsched.ir.ops.onnx_builder import OPSET
from opsched.ir.ops.onnx_node import captured
from opsched.ir.ops.onnx_session import copy_fields, inference_session, tensor_bytes

__all__ = ["OnnxFile", "at_our_opset", "declared_dims", "onnx_input_dims", "read_onnx",
           "with_nodes"]

log = logging.getLogger("opsched.frontends")


@dataclass(frozen=True)
class OnnxFile:
    """An ONNX model as the converter reads it: checked, its nodes in order, its large
    initializers set aside as ``weights`` (the ``model`` lists them as inputs of their type)."""

    model: onnx.ModelProto
    opset: int  #: its ai.onnx opset
    weights: dict[str, onnx.TensorProto]
    source: str  #: the file's path, or ``"<ModelProto>"``
    checked: bool  #: whether ``onnx.checker`` passed it (else ONNX Runtime loads it)


def read_onnx(model: str | os.PathLike[str] | onnx.ModelProto) -> OnnxFile:
    """A path or a loaded model, read (:class:`OnnxFile`); :class:`MalformedModelError` for a file
    that is missing, truncated or invalid, or whose weights stored beside it are not at hand."""
    source = "<ModelProto>"
    if not isinstance(model, onnx.ModelProto):
        source = os.fspath(model)
        model = _load(source)
    elif outside := [t for t in model.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL]:
        where = next((e.value for e in outside[0].external_data if e.key == "location"), "?")
        raise MalformedModelError(f"{source}: {len(outside)} initializer(s), {outside[0].name!r} first, are stored "
                                  f"outside the model, in {where!r}, which was not read: pass the file's path, or "
                                  f"load it with onnx.load(path)")
    skeleton, weights = _skeleton(model)
    checked = _checked(skeleton, model, source)
    if not checked:
        skeleton = _in_topological_order(skeleton)
    opset = next((o.version for o in skeleton.opset_import if o.domain in ("", "ai.onnx")), None)
    if opset is None:
        if plain := [n for n in skeleton.graph.node if n.domain in ("", "ai.onnx")]:
            raise MalformedModelError(f"{source}: the model imports no default-domain opset, which its node "
                                      f"{plain[0].name or plain[0].output[0]!r} ({plain[0].op_type}) is of")
        # every node of another domain (scikit-learn's converters write ai.onnx.ml alone): nothing to upgrade
        declared = onnx.ModelProto()
        declared.CopyFrom(skeleton)  # the skeleton may be the caller's model itself
        declared.opset_import.append(helper.make_opsetid("", OPSET))
        skeleton, opset = declared, OPSET
    return OnnxFile(skeleton, opset, weights, source, checked)


#: Initializers larger than this (bytes) stay out of the copy of the model that ONNX's checker,
#: version converter and shape inference work on: each serialises the model it is given, and
#: the weights of a 256 MB EfficientNet export made them take 4.6 of its import's 6 s.
_SKELETON_BYTES = 4096


def _skeleton(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, onnx.TensorProto]]:
    """``model`` with its large initializers turned into graph inputs of their type (all that
    ONNX's passes need of them), and those initializers by name; the model itself where it has
    none. The converter reads them as constants, as it does initializers listed as inputs."""
    weights = {t.name: t for t in model.graph.initializer
               if t.data_location != onnx.TensorProto.EXTERNAL and tensor_bytes(t) > _SKELETON_BYTES}
    if not weights:
        return model, {}
    skeleton = onnx.ModelProto()
    copy_fields(model, skeleton, skip="graph")
    copy_fields(model.graph, skeleton.graph, skip="initializer")
    skeleton.graph.initializer.extend(t for t in model.graph.initializer if t.name not in weights)
    listed = {i.name for i in model.graph.input}
    skeleton.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                                for t in weights.values() if t.name not in listed)
    return skeleton, weights


def _checked(model: onnx.ModelProto, full: onnx.ModelProto, source: str) -> bool:
    """Whether ``model`` passes ``onnx.checker``. One that does not is still imported where ONNX
    Runtime loads it (``full``: the model with its weights), as files in the wild often do with a
    graph output declared without a shape, or nodes out of topological order; where ONNX Runtime
    refuses it too, :class:`MalformedModelError` gives both reasons."""
    try:
        onnx.checker.check_model(model)
        return True
    except Exception as e:
        checker = " ".join(str(e).split())[:300]
        refused = _ort_refusal(full)
        if refused is not None:
            raise MalformedModelError(f"{source}: not a valid ONNX model: {checker}; ONNX Runtime refuses it too: "
                                      f"{refused}") from e
        log.warning("%s: onnx.checker: %s; ONNX Runtime loads it, so it is imported as ONNX Runtime reads it",
                    source, checker)
        return False


def _in_topological_order(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with its nodes in topological order, each as early as the file has it (a copy;
    ``model`` itself where they already are). ONNX Runtime sorts a graph it loads; ONNX's passes
    and the converter read the nodes in file order."""
    nodes = list(model.graph.node)
    producer = {o: k for k, n in enumerate(nodes) for o in n.output if o}
    needs = {k: {producer[i] for i in _reads(n) if i in producer} - {k} for k, n in enumerate(nodes)}
    order, stuck = topological_order(needs, rank=lambda k: k)
    order += sorted(stuck)  # a cycle: left in file order, for the converter to name
    if order == list(range(len(nodes))):
        return model
    return with_nodes(model, [nodes[k] for k in order])


def with_nodes(model: onnx.ModelProto, nodes: Sequence[onnx.NodeProto]) -> onnx.ModelProto:
    """A copy of ``model`` whose graph holds ``nodes`` in place of its own."""
    copy = onnx.ModelProto()
    copy_fields(model, copy, skip="graph")
    copy_fields(model.graph, copy.graph, skip="node")
    copy.graph.node.extend(nodes)
    return copy


def _reads(node: onnx.NodeProto) -> set[str]:
    """The values a node reads: its inputs, and those its sub-graphs (If, Loop, Scan) read."""
    return {i for i in node.input if i} | set(captured(node))


def _ort_refusal(model: onnx.ModelProto) -> str | None:
    """Why ONNX Runtime cannot load ``model``, or None where it can."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    try:
        inference_session(model, so)
    except Exception as e:
        return first_line(e)
    return None


def at_our_opset(file: OnnxFile) -> OnnxFile:
    """The file at the opset segments are exported at (:data:`OPSET`), by ``onnx.version_converter``:
    older files are upgraded (an upgrade that fails is an error naming why), with what the
    converter's adapters get wrong mended; newer ones are converted down where the converter
    can, and kept at their opset otherwise (their generic nodes then join segments only where
    they mean the same, :mod:`opsched.ir.ops.onnx_opsets`). The result is checked by
    ``onnx.checker`` where the file passed it."""
    model, opset, source = file.model, file.opset, file.source
    if opset == OPSET:
        return file
    try:
        model, training = _batch_norms_in_training(model, source) if opset < 14 else (model, [])
        converted = version_converter.convert_version(_at_ir_4(model), OPSET)
        _mark_training(converted, training)
        if opset < 7:
            _prelu_6_slopes(model, converted)
        if opset < 11:
            _resize_10_semantics(model, converted, source)
        if opset < 13:
            _resize_without_empty_scales(converted)
        if file.checked:
            onnx.checker.check_model(converted)
    except Exception as e:
        if opset > OPSET:
            return file
        raise FrontendError(f"{source}: opset {opset} cannot be upgraded to {OPSET} by onnx.version_converter: "
                            f"{first_line(e)}") from e
    return dataclasses.replace(file, model=converted, opset=OPSET)


def _at_ir_4(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` at IR version 4 at least (a copy where it was older). Before 4 every initializer
    had to be a graph input too, and the converter's adapters add initializers that are not
    (Pad's opset-11 form takes its pads as an input): at IR 3 it refused its own result, so that
    a file PyTorch exports at opset 7 with a padding could not be upgraded."""
    if model.ir_version >= 4:
        return model
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    copy.ir_version = 4
    return copy


def _batch_norms_in_training(model: onnx.ModelProto, source: str) -> tuple[onnx.ModelProto, list[str]]:
    """The outputs (``Y``) of the BatchNormalization nodes that run in training mode, which before
    opset 14 is said by having more outputs than ``Y`` (weight-standardised convolutions, as in
    BiT and NFNet, export so), and the model without their ``saved_mean`` and ``saved_var``
    outputs (a copy where it had any), which opset 14 lacks and ``onnx.version_converter``
    refuses: they are dropped where nothing reads them, and refused where something does."""
    training = [node for node in model.graph.node
                if node.op_type == "BatchNormalization" and not node.domain and len(node.output) > 1]
    if not any(len(node.output) > 3 for node in training):
        return model, [node.output[0] for node in training]
    read = {i for node in model.graph.node for i in (*node.input, *captured(node))}
    read |= {o.name for o in model.graph.output}
    for node in training:
        if used := [o for o in node.output[3:] if o and o in read]:
            raise FrontendError(f"{source}: node {node.name or node.output[0]!r} (BatchNormalization): its training "
                                f"statistics {', '.join(map(repr, used))} are read, and opset 14 has no such outputs")
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        if node.op_type == "BatchNormalization" and not node.domain:
            del node.output[3:]
    return copy, [node.output[0] for node in training]


def _mark_training(converted: onnx.ModelProto, outputs: list[str]) -> None:
    """Say ``training_mode=1`` on the converted BatchNormalization nodes making ``outputs``: the
    13 -> 14 adapter keeps their running-statistics outputs but leaves the attribute at its
    default, 0, which normalises by the running statistics instead of the batch's."""
    wanted = set(outputs)
    for node in converted.graph.node:
        if node.op_type == "BatchNormalization" and node.output[0] in wanted:
            kept = [a for a in node.attribute if a.name != "training_mode"]
            del node.attribute[:]
            node.attribute.extend([*kept, helper.make_attribute("training_mode", 1)])


def _prelu_6_slopes(before: onnx.ModelProto, converted: onnx.ModelProto) -> None:
    """Give each PRelu of an opset-6 file its slope per channel, as it was: a slope of C values
    applied along axis 1, where from opset 7 it broadcasts from the last axis. The converter's
    6 -> 7 adapter keeps the slope as it is, so a (C,) slope of an (N, C, H, W) input was broadcast
    against W (and ONNX Runtime refused the node where W != C): it becomes a (C, 1, 1) constant."""
    constants = _constant_tensors(before)
    try:
        inferred = onnx.shape_inference.infer_shapes(before).graph
    except Exception:  # noqa: BLE001 (without ranks, nothing is known to need it)
        return
    ranks = {v.name: len(v.type.tensor_type.shape.dim) for v in (*inferred.input, *inferred.value_info)
             if v.type.tensor_type.HasField("shape")}
    made = {t.name for t in converted.graph.initializer}
    for node in (n for n in converted.graph.node if n.op_type == "PRelu" and not n.domain):
        slope = constants.get(node.input[1])
        rank = ranks.get(node.input[0], 0)
        if slope is None or len(slope.dims) != 1 or slope.dims[0] == 1 or rank < 3:
            continue
        name = f"{node.input[1]}__per_channel"
        if name not in made:  # one slope shared by several PRelus is reshaped once
            values = numpy_helper.to_array(slope).reshape(-1, *[1] * (rank - 2))
            converted.graph.initializer.append(numpy_helper.from_array(values, name))
            made.add(name)
        node.input[1] = name


def _resize_10_semantics(before: onnx.ModelProto, converted: onnx.ModelProto, source: str) -> None:
    """Give each Resize that ``onnx.version_converter`` made of an opset-10 Resize or an older
    Upsample what ONNX Runtime computes for those: the source coordinate ``x_resized / scale``,
    and for nearest its floor where the node enlarges, its ceiling where it shrinks. The
    converter's 10 -> 11 adapter sets neither, so opset 11's defaults (half_pixel,
    round_prefer_floor) silently change the values (onnx/onnx#8480: 0.3 off on a 2x linear
    upsampling)."""
    constants = _constant_tensors(before)
    rounding: list[str] = []  # per Upsample or Resize, in graph order
    for node in before.graph.node:
        if node.op_type not in ("Upsample", "Resize"):
            continue
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        scales = (attrs.get("scales") if len(node.input) < 2 else
                  numpy_helper.to_array(constants[node.input[1]]).tolist() if node.input[1] in constants else None)
        resized = [s for s in scales or () if s != 1]
        rounding.append("ceil" if resized and all(s < 1 for s in resized) else "floor")
        mixed = 0 < sum(s < 1 for s in resized) < len(resized)
        if attrs.get("mode", b"nearest") == b"nearest" and (scales is None or mixed):
            log.warning("%s: %s %r: its scales %s, so its nearest rounding is taken as floor (ONNX Runtime rounds "
                        "up where it shrinks an axis)", source, node.op_type, node.name or node.output[0],
                        "are computed" if scales is None else "enlarge one axis and shrink another")
    resizes = [n for n in converted.graph.node if n.op_type == "Resize"]  # the converter keeps their order,
    if len(resizes) != len(rounding):  # not always their outputs' names
        raise FrontendError(f"{source}: onnx.version_converter made {len(resizes)} Resize nodes of "
                            f"{len(rounding)} Upsample and Resize nodes; their opset-10 meaning cannot be kept")
    for node, nearest in zip(resizes, rounding):
        have = {a.name for a in node.attribute}
        for name, value in (("coordinate_transformation_mode", "asymmetric"), ("nearest_mode", nearest)):
            if name not in have:
                node.attribute.append(helper.make_attribute(name, value))


def _resize_without_empty_scales(converted: onnx.ModelProto) -> None:
    """Resize 11 and 12 took an empty ``scales`` tensor beside ``sizes``; from 13, where the
    converter puts them, only one of the two may be given (onnx/onnx#5266), and ONNX Runtime
    refuses the node. This is the form torch.onnx writes ``interpolate(size=...)`` in at opset
    11: the empty scales become an absent input."""
    empty = {name for name, t in _constant_tensors(converted).items() if 0 in t.dims}
    for node in converted.graph.node:
        if node.op_type == "Resize" and len(node.input) == 4 and node.input[3] and node.input[2] in empty:
            node.input[2] = ""


def _constant_tensors(model: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    """The model's constant values by name: its initializers and its Constant nodes' tensors."""
    constants = {t.name: t for t in model.graph.initializer}
    constants.update({n.output[0]: n.attribute[0].t for n in model.graph.node
                      if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value"})
    return constants


def onnx_input_dims(model: str | os.PathLike[str] | onnx.ModelProto) -> dict[str, tuple[int | str, ...] | None]:
    """Per input of an ONNX model that is not an initializer: its declared dimensions, an int where
    fixed and the dimension's name (``"?"`` if unnamed) where dynamic; ``None`` where the file
    declares no shape. A file's weights stored beside it are not read."""
    if not isinstance(model, onnx.ModelProto):
        model = _load(os.fspath(model), external=False)
    initializers = {t.name for t in model.graph.initializer}
    return {i.name: declared_dims(i) for i in model.graph.input if i.name not in initializers}


def declared_dims(value: onnx.ValueInfoProto) -> tuple[int | str, ...] | None:
    """A value's declared dimensions (see :func:`onnx_input_dims`); None where it has no shape. A
    negative size is dynamic too: exporters that predate named dimensions (Paddle2ONNX's) write -1."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return tuple(int(d.dim_value) if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or "?")
                 for d in tensor.shape.dim)


def _load(path: str, external: bool = True) -> onnx.ModelProto:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise MalformedModelError(f"cannot read ONNX file {path!r}: {e.strerror}") from e
    if not data:
        raise MalformedModelError(f"{path}: the file is empty")
    try:
        model = onnx.load_model_from_string(data)
    except Exception as e:
        raise MalformedModelError(f"{path}: not an ONNX protobuf, or truncated ({len(data)} bytes): {e}") from e
    if not model.graph.node and not model.graph.output:
        raise MalformedModelError(f"{path}: parsed as an empty model: truncated, or not an ONNX file")
    if external and any(t.data_location == onnx.TensorProto.EXTERNAL for t in model.graph.initializer):
        # torch.onnx.export(model, args, "model.onnx") writes its weights to model.onnx.data by default
        try:
            external_data_helper.load_external_data_for_model(model, os.path.dirname(os.path.abspath(path)))
        except Exception as e:
            raise MalformedModelError(f"{path}: its weights are stored in files beside it, which cannot be read: "
                                      f"{first_line(e)}") from e
    return model

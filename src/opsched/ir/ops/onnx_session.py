"""ONNX models whose weights are held apart, and ONNX Runtime sessions of them, of any size.

A session is made from a model's serialized bytes, and protobuf refuses to serialize a message of
2 GiB or more, or to copy one tensor of that size into a graph: a float32 segment of about 540
million parameters (a language model's embedding, say) could be neither built nor loaded. So a
model opsched builds (:class:`~opsched.ir.ops.onnx_builder.OnnxBuilder`) keeps its small
initializers (shapes, scalars: shape inference reads them) and holds its weights apart, as
arrays; the model marks them external, and its session is handed them from memory
(``SessionOptions.add_external_initializers``), which ONNX Runtime copies in before it optimizes
the graph. A model read from a file is loaded whole where it fits, and held apart the same way
where it does not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
from google.protobuf.message import EncodeError
from onnx import helper, numpy_helper

__all__ = ["INLINE_BYTES", "PROTO_LIMIT", "OnnxModel", "copy_fields", "external", "fits", "inference_session",
           "tensor_bytes"]

#: The most bytes protobuf serializes a message into: 2 GiB less one.
PROTO_LIMIT = 2**31 - 1

#: Initializers of this many bytes or fewer stay in the model: shape inference reads them (a
#: Reshape's shape, a Clip's bounds), and ONNX Runtime keeps no in-memory data under 128 bytes.
INLINE_BYTES = 1024

#: Where an initializer held apart says its data is. ONNX Runtime matches the data handed over by
#: name and checks that the initializer is external with the same type and dimensions.
_IN_MEMORY = "opsched: handed over from memory"


@dataclass(frozen=True)
class OnnxModel:
    """An ONNX model and its weights held apart: ``proto``'s initializers of those names are
    external (:func:`external`), their values the arrays in ``weights``."""

    proto: onnx.ModelProto
    weights: Mapping[str, np.ndarray] = field(default_factory=dict)

    @staticmethod
    def of(proto: onnx.ModelProto) -> OnnxModel:
        """``proto`` as it is where it fits :data:`PROTO_LIMIT`; else a copy of it whose
        initializers larger than :data:`INLINE_BYTES` are held apart, each read out of ``proto``
        as an array (``proto`` itself is left as it is)."""
        if fits(proto):
            return OnnxModel(proto)
        graph = proto.graph
        apart = {t.name for t in graph.initializer
                 if t.data_location != onnx.TensorProto.EXTERNAL and tensor_bytes(t) > INLINE_BYTES}
        weights = {t.name: numpy_helper.to_array(t) for t in graph.initializer if t.name in apart}
        out = onnx.ModelProto()
        copy_fields(proto, out, skip="graph")
        copy_fields(graph, out.graph, skip="initializer")
        out.graph.initializer.extend(external(t.name, weights[t.name]) if t.name in apart else t
                                     for t in graph.initializer)
        return OnnxModel(out, weights)


def fits(message: Any) -> bool:
    """Whether protobuf can serialize ``message`` (its C implementations refuse even to measure
    one past :data:`PROTO_LIMIT`)."""
    try:
        return bool(message.ByteSize() <= PROTO_LIMIT)
    except EncodeError:
        return False


def tensor_bytes(t: onnx.TensorProto) -> int:
    """The bytes of ``t``'s data, from its element type and dimensions (a string's as a pointer's),
    without measuring the message, which protobuf cannot do past :data:`PROTO_LIMIT`."""
    return int(np.prod(t.dims, dtype=np.int64)) * helper.tensor_dtype_to_np_dtype(t.data_type).itemsize


def external(name: str, value: np.ndarray) -> onnx.TensorProto:
    """An initializer of ``value``'s type and shape whose data is held apart (no data of its own)."""
    stub = onnx.TensorProto(name=name, data_type=helper.np_dtype_to_tensor_dtype(value.dtype),
                            dims=value.shape, data_location=onnx.TensorProto.EXTERNAL)
    stub.external_data.add(key="location", value=_IN_MEMORY)
    return stub


def inference_session(model: OnnxModel | onnx.ModelProto, options: Any,
                      providers: tuple[str, ...] = ("CPUExecutionProvider",)) -> Any:
    """An ``onnxruntime.InferenceSession`` of ``model`` with ``options``, handed the weights held
    apart. They are added to ``options``, so make ``options`` afresh for each session."""
    import onnxruntime as ort

    if isinstance(model, onnx.ModelProto):
        model = OnnxModel.of(model)
    if model.weights:
        names = list(model.weights)
        options.add_external_initializers(names, [ort.OrtValue.ortvalue_from_numpy(model.weights[n]) for n in names])
    return ort.InferenceSession(model.proto.SerializeToString(), options, providers=list(providers))


def copy_fields(src: Any, dst: Any, skip: str) -> None:
    """Every field of the protobuf message ``src`` that is set, but ``skip``, copied into ``dst``."""
    for f, value in src.ListFields():
        if f.name == skip:
            continue
        target = getattr(dst, f.name)
        if hasattr(target, "extend"):  # a repeated field
            target.extend(value)
        elif hasattr(target, "CopyFrom"):  # a message
            target.CopyFrom(value)
        else:
            setattr(dst, f.name, value)

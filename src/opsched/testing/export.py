"""A model exported to ONNX as its users export it: ``torch.onnx.export``, the dynamo exporter
first and the TorchScript one where that fails, so that the ONNX frontend meets the files real
exporters write (the corpora's models, the sweeps', the benchmarks' files)."""

from __future__ import annotations

import io
import logging
import warnings
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    import onnx

__all__ = ["ExportFailed", "export_onnx", "quiet"]


def export_onnx(model: nn.Module, inputs: tuple[torch.Tensor, ...], opset: int | None = None, *,
                torchscript: bool = False) -> tuple[onnx.ModelProto, str]:
    """``model`` exported as users export it: ``torch.onnx.export`` with its default (dynamo)
    exporter, else the TorchScript one (which some models need: Swin's decompositions fail in
    the first), at the exporter's default opset or ``opset``; with ``torchscript``, the
    TorchScript one alone (the files of older tools: ``input.1`` names, opsets before 14).
    Returns the model and which exporter made it. Where every exporter tried fails, raises
    :class:`ExportFailed` with each one's reason (the innermost cause of the dynamo exporter's
    error, which names the operator it had no ONNX function for)."""
    import onnx

    dynamo_failure = ""
    with quiet():
        if not torchscript:
            try:
                program = torch.onnx.export(model, inputs, dynamo=True, verbose=False, opset_version=opset)
                assert program is not None
                return program.model_proto, "dynamo"
            except Exception as e:  # noqa: BLE001 (the exporter raises many types; the reasons are reported)
                dynamo_failure = f"the dynamo exporter: {_innermost_line(e)}; "
        buf = io.BytesIO()
        # called with positional inputs only: the TorchScript exporter would fill in every
        # default argument positionally, which Hugging Face forward wrappers refuse
        # the wrapper in the model's mode: the exporter leaves the wrapper, and so the model, in the
        # wrapper's mode, and a new module is in training mode
        wrapper = _Positional(model).train(model.training)
        try:
            torch.onnx.export(wrapper, inputs, buf, dynamo=False,  # type: ignore[arg-type]  # a file
                              opset_version=opset)
        except Exception as e:  # noqa: BLE001 (as above)
            raise ExportFailed(f"torch.onnx cannot export {type(model).__name__}: {dynamo_failure}the TorchScript "
                               f"exporter: {_innermost_line(e)}") from e
        return onnx.load_model_from_string(buf.getvalue()), "torchscript"


class ExportFailed(RuntimeError):
    """``torch.onnx`` could not export a model by any exporter :func:`export_onnx` tried."""


def _innermost_line(e: BaseException) -> str:
    """The first line of the innermost cause of ``e`` (the exporters wrap the reason in
    errors about which step failed)."""
    while e.__cause__ is not None:
        e = e.__cause__
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


class _Positional(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> Any:
        return self.model(*inputs)


class quiet:
    """Silence transformers' chatter (random-init notices) and warnings (the exporters') while a
    model is built or exported."""

    def __enter__(self) -> None:
        self._level = logging.getLogger("transformers").level
        logging.getLogger("transformers").setLevel(logging.ERROR)
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: Any) -> None:
        self._warnings.__exit__(*exc)
        logging.getLogger("transformers").setLevel(self._level)

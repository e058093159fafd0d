"""The fuzzer's runner: one :class:`~opsched.testing.fuzz.FuzzNet` model through every
configuration, against eager PyTorch.

:func:`check_model` runs one model through the torch frontend and through ``torch.onnx`` export
and :func:`opsched.from_onnx`, each with every scheduler on every CPU backend, and compares with
eager PyTorch on the example input and on a fresh one. An ONNX import that refuses a model with
a named error is ``refused``, not a failure. ``benchmarks/fuzz.py`` tallies many.
"""

from __future__ import annotations

import contextlib
import re
import signal
import tempfile
import threading
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from opsched.testing import mismatch
from opsched.testing.fuzz import FuzzNet

__all__ = ["Outcome", "check_model", "SCHEDULERS", "BACKENDS", "cause_of"]

SCHEDULERS = ("sequential", "greedy", "ios", "est", "nimble", "opara")
BACKENDS = ("torch", "ort")


@dataclass(frozen=True)
class Outcome:
    """One configuration of one model: ``status`` is ``equal``, ``wrong`` (ran, but differs from
    eager), ``error`` (an exception where none was expected), ``refused`` (the ONNX importer
    named what it cannot import) or ``unexportable`` (torch.onnx itself could not export the
    model); ``cause`` says why, in a form that groups alike failures."""

    seed: int
    frontend: str
    scheduler: str
    backend: str
    status: str
    cause: str = ""


def cause_of(error: BaseException) -> str:
    """An exception as a cause to tally: its type and message, with names and numbers blanked."""
    text = str(error).split("\n")[0]
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return f"{type(error).__name__}: {text[:120]}"


def _leaves(out: Any) -> list[torch.Tensor]:
    return [t for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def check_model(seed: int, schedulers: Sequence[str] = SCHEDULERS, backends: Sequence[str] = BACKENDS,
                frontends: Sequence[str] = ("torch", "onnx")) -> list[Outcome]:
    """Every configuration of the model of ``seed`` against eager PyTorch (module docstring)."""
    import opsched
    from opsched.api import host_cpu_model
    from opsched.check import fresh_inputs
    from opsched.errors import FrontendError, OpschedError

    model = FuzzNet(seed).eval()
    x = torch.randn(model.input_shape, generator=torch.Generator().manual_seed(seed + 1))
    cases = [(x,), fresh_inputs((x,), seed=seed + 2)]
    after = [tuple(t.clone() for t in c) for c in cases]  # a model may change its inputs: as it leaves them
    with torch.no_grad():
        expected = [(model(*a), a) for a in after]
    out: list[Outcome] = []
    for frontend in frontends:
        try:  # a clone: the model may change its input, and torch.onnx runs it
            source: Any = model if frontend == "torch" else _onnx_export(model, x.clone())
        except Exception as e:  # noqa: BLE001 (torch.onnx's own refusal: not the importer's to pass)
            out += [Outcome(seed, frontend, s, b, "unexportable", cause_of(e)) for s in schedulers for b in backends]
            continue
        try:
            graph = opsched.from_torch(model, (x,)) if frontend == "torch" else opsched.from_onnx(source)
        except (FrontendError, OpschedError) as e:
            status = "refused" if frontend == "onnx" else "error"
            out += [Outcome(seed, frontend, s, b, status, cause_of(e)) for s in schedulers for b in backends]
            continue
        except Exception as e:  # noqa: BLE001 (a raw exception is what the fuzzer is for)
            out += [Outcome(seed, frontend, s, b, "error", cause_of(e) + " @ " + _where(e))
                    for s in schedulers for b in backends]
            continue
        for scheduler in schedulers:
            for backend in backends:
                out.append(_run(seed, frontend, graph, scheduler, backend, cases, expected, host_cpu_model()))
    return out


#: How long torch.onnx may take to export one fuzz model (they take well under a second): its
#: TorchScript exporter can run away on a random graph (seed 73069: minutes, and all of a 24 GiB
#: machine's memory), which then counts as the exporter's refusal.
EXPORT_SECONDS = 60.0


@contextlib.contextmanager
def _deadline(seconds: float, what: str) -> Iterator[None]:
    """Raise TimeoutError in the block once ``seconds`` have passed (at the next Python line it
    runs: the exporter calls back into Python for every node). Only where a timer signal can
    be had: on Unix, in the main thread; elsewhere the block runs unbounded."""
    if not hasattr(signal, "SIGALRM") or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} ran past {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _onnx_export(model: nn.Module, x: torch.Tensor) -> Any:
    """The model's torch.onnx export; raises where ONNX Runtime cannot run the file either (the
    exporter bakes sizes from ONNX's shape inference into Reshape targets, and ONNX's rule for a
    pool with ceil_mode and padding is not the one PyTorch and ONNX Runtime follow), or where
    what it computes is not what eager PyTorch does: the importer answers for the file alone."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp, _deadline(EXPORT_SECONDS, "torch.onnx.export"):
        path = Path(tmp) / "model.onnx"
        torch.onnx.export(model, (x,), path, dynamo=False, opset_version=17, input_names=["x"])
        proto = onnx.load(path)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = [torch.from_numpy(v) for v in session.run(None, {"x": x.numpy()})]
    with torch.no_grad():
        why = mismatch(theirs, _leaves(model(x.clone())))
    if why:
        raise ValueError(f"ONNX Runtime's session of the export differs from eager PyTorch: {why}")
    return proto


def _run(seed: int, frontend: str, graph: Any, scheduler: str, backend: str, cases: list[tuple[torch.Tensor, ...]],
         expected: list[tuple[Any, tuple[torch.Tensor, ...]]], cost: Any) -> Outcome:
    """One configuration: equal where the module returns what the model returned and leaves its
    inputs as the model left them."""
    import opsched
    from opsched.module import OutputStructure

    try:
        # wide random graphs: a bounded search
        options: dict[str, Any] = {"budget_s": 2.0} if scheduler == "ios" else {}
        module = opsched.optimize_graph(graph, scheduler=scheduler, backend=backend, cost=cost, check=False,
                                        progress=False, **options)
        structure = OutputStructure.of(expected[0][0])
        module.outputs = structure if structure.tensors == len(graph.returns) else module.outputs
        with torch.no_grad():
            for case, (want, left) in zip(cases, expected):
                given = [t.clone() for t in case]
                why = mismatch(_leaves(module(*given)), _leaves(want))
                if frontend == "torch":  # an ONNX file computes values alone: torch.onnx drops writes to inputs
                    why = why or mismatch(given, list(left), "input after")
                if why:
                    return Outcome(seed, frontend, scheduler, backend, "wrong", why)
    except Exception as e:  # noqa: BLE001 (every failure is counted, by cause)
        return Outcome(seed, frontend, scheduler, backend, "error", cause_of(e) + " @ " + _where(e))
    return Outcome(seed, frontend, scheduler, backend, "equal")


def _where(error: BaseException) -> str:
    """The innermost opsched frame of a traceback: where a raw exception escaped."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if "opsched" in f.filename]
    return f"{frames[-1].filename.rsplit('/', 1)[-1]}:{frames[-1].lineno}" if frames else "outside opsched"

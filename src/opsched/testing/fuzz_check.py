"""The fuzzer's runner: one :class:`~opsched.testing.fuzz.FuzzNet` model through every
configuration, against eager PyTorch.

:func:`check_model` runs one model through the torch frontend and through ``torch.onnx`` export
and :func:`opsched.from_onnx`, each with every scheduler on every CPU backend, and compares with
eager PyTorch on the example input and on a fresh one. An ONNX import that refuses a model with
a named error is ``refused``, not a failure. The ``dynamo`` frontend, on request, runs the model
through ``torch.compile(backend="opsched")`` with each scheduler and backend as its options.
``benchmarks/fuzz.py`` tallies many.
"""

from __future__ import annotations

import multiprocessing
import re
import resource
import signal
import tempfile
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.context import ForkContext, SpawnContext
from pathlib import Path
from typing import Any

import torch
from torch import nn

from opsched.testing import mismatch
from opsched.testing.fuzz import FuzzNet

__all__ = ["Outcome", "check_model", "in_worker", "WorkerError", "SCHEDULERS", "BACKENDS", "FRONTENDS",
           "cause_of"]

SCHEDULERS = ("sequential", "greedy", "ios", "est", "nimble", "opara")
BACKENDS = ("torch", "ort")
#: ``torch``: :func:`opsched.from_torch`; ``onnx``: ``torch.onnx`` export, then
#: :func:`opsched.from_onnx`; ``dynamo``: ``torch.compile(backend="opsched")``.
FRONTENDS = ("torch", "onnx", "dynamo")


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
    """An exception as a cause to tally: its type (in the worker, where it was raised in one) and
    message, with names and numbers blanked."""
    text = str(error).split("\n")[0]
    text = re.sub(r"'[^']*'", "'…'", text)
    text = re.sub(r"\d+(\.\d+)?", "N", text)
    return f"{getattr(error, 'kind', type(error).__name__)}: {text[:120]}"


def check_model(seed: int, schedulers: Sequence[str] = SCHEDULERS, backends: Sequence[str] = BACKENDS,
                frontends: Sequence[str] = ("torch", "onnx")) -> list[Outcome]:
    """Every configuration of the model of ``seed`` against eager PyTorch (module docstring)."""
    import opsched
    from opsched.check import fresh_inputs
    from opsched.errors import FrontendError, OpschedError

    unknown = sorted(set(frontends) - set(FRONTENDS))
    if unknown:
        raise ValueError(f"frontends {unknown} are not among {list(FRONTENDS)}")

    model = FuzzNet(seed).eval()
    x = torch.randn(model.input_shape, generator=torch.Generator().manual_seed(seed + 1))
    cases = [(x,), fresh_inputs((x,), seed=seed + 2)]
    after = [tuple(t.clone() for t in c) for c in cases]  # a model may change its inputs: as it leaves them
    with torch.no_grad():
        expected = [(model(*a), a) for a in after]
    out: list[Outcome] = []
    for frontend in frontends:
        if frontend == "dynamo":
            out += [_run(seed, frontend, _compiled(model, s, b), s, b, cases, expected)
                    for s in schedulers for b in backends]
            continue
        try:  # a clone: the model may change its input, and torch.onnx runs it
            source: Any = model if frontend == "torch" else _onnx_export(seed, model, x.clone())
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
        out += [_run(seed, frontend, _scheduled(graph, s, b, expected), s, b, cases, expected)
                for s in schedulers for b in backends]
    return out


def _search_options(scheduler: str) -> dict[str, Any]:
    return {"budget_s": 2.0} if scheduler == "ios" else {}  # wide random graphs: a bounded search


def _scheduled(graph: Any, scheduler: str, backend: str,
               expected: list[tuple[Any, tuple[torch.Tensor, ...]]]) -> Callable[[], Any]:
    """How a configuration of an imported graph is made: its scheduled module, returning what the
    model returns where the import's outputs are the model's."""
    def make() -> Any:
        import opsched
        from opsched.costing import host_cpu_model
        from opsched.module import OutputStructure

        module = opsched.optimize_graph(graph, scheduler=scheduler, backend=backend, cost=host_cpu_model(),
                                        check=False, progress=False, **_search_options(scheduler))
        structure = OutputStructure.of(expected[0][0])
        module.outputs = structure if structure.tensors == len(graph.returns) else module.outputs
        return module
    return make


def _compiled(model: nn.Module, scheduler: str, backend: str) -> Callable[[], Any]:
    """How a configuration through the ``torch.compile`` backend is made: the model compiled with
    the scheduler and backend as options (analytic costs, so no race: the plan is the scheduler's),
    every graph scheduled or the call raising (no fallback), in a fresh Dynamo (no configuration
    meets another's graphs, or Dynamo's limit of recompiles), searched every time (no schedule
    cache: a second run of a seed tests the scheduler again, not a file the first one left)."""
    def make() -> Any:
        import opsched.dynamo

        torch._dynamo.reset()
        opsched.dynamo.reset()
        return torch.compile(model, backend="opsched", options={
            "scheduler": scheduler, "backend": backend, "cost": "analytic", "verify": False, "fallback": False,
            "progress": False, "schedule_cache": False, **_search_options(scheduler)})
    return make


#: What torch.onnx may spend exporting one fuzz model (they take well under a second and a few
#: hundred MB). Its TorchScript exporter can run away on a random graph (seed 73069: minutes,
#: and all of a 24 GiB machine's memory) or kill its process (seed 10267: a division by zero in
#: its shape inference, SIGFPE, which took a 1000-model run down with it), so it runs in a
#: process of its own, within these bounds, and its failure is the model's, counted.
EXPORT_SECONDS = 60.0
EXPORT_MEMORY = 8 * 2**30


class WorkerError(Exception):
    """What a worker process raised (``kind``: its type's name there), or how the process ended."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _export(seed: int, x: torch.Tensor, path: str) -> None:
    """In a worker: the model of ``seed`` exported by torch.onnx to ``path``."""
    torch.onnx.export(FuzzNet(seed).eval(), (x,), path, dynamo=False, opset_version=17, input_names=["x"])


def _work(conn: Connection, memory: int, fn: Callable[..., None], args: tuple[Any, ...]) -> None:
    """A worker's body: ``fn(*args)`` within ``memory`` bytes of address space, on one thread (a
    forked process has none of its parent's OpenMP threads, which a parallel region would wait
    for); sends None, or the kind and first lines of what it raised."""
    resource.setrlimit(resource.RLIMIT_AS, (memory, resource.getrlimit(resource.RLIMIT_AS)[1]))
    torch.set_num_threads(1)
    try:
        fn(*args)
        conn.send(None)
    except BaseException as e:  # noqa: BLE001 (everything it raises is the caller's to see)
        conn.send((type(e).__name__, str(e)[:2000]))


def in_worker(fn: Callable[..., None], *args: Any, seconds: float = EXPORT_SECONDS, memory: int = EXPORT_MEMORY,
              what: str = "the worker") -> None:
    """``fn(*args)`` in a process of its own, within ``seconds`` and ``memory`` bytes. Raises
    :class:`WorkerError` with what it raised, where it ran past its time, or where its process
    died (by signal). The process is a fork of this one where the platform forks (milliseconds,
    nothing imported again, and no main module run again, which a fork server or a spawned
    process does to a script without a ``__main__`` guard), else spawned."""
    if "fork" in multiprocessing.get_all_start_methods():
        context: ForkContext | SpawnContext = multiprocessing.get_context("fork")
    else:
        context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    process = context.Process(target=_work, args=(send, memory, fn, args), daemon=True)
    process.start()
    send.close()
    try:
        answered = receive.poll(seconds)
        answer = receive.recv() if answered else None
    except EOFError:  # the process ended without a word
        answered, answer = False, None
    finally:
        receive.close()
    process.join(None if answered else 1.0)
    if process.is_alive():
        process.kill()
        process.join()
        raise WorkerError("TimeoutError", f"{what} ran past {seconds:.0f} s")
    if not answered:
        code = process.exitcode or 0
        how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        raise WorkerError("Crash", f"{what} killed its process ({how})")
    if answer is not None:
        raise WorkerError(*answer)


def _onnx_export(seed: int, model: nn.Module, x: torch.Tensor) -> Any:
    """The torch.onnx export of the model of ``seed`` (in a worker: :data:`EXPORT_SECONDS`);
    raises where ONNX Runtime cannot run the file either (the exporter bakes sizes from ONNX's
    shape inference into Reshape targets, and ONNX's rule for a pool with ceil_mode and padding
    is not the one PyTorch and ONNX Runtime follow), or where what it computes is not what eager
    PyTorch does: the importer answers for the file alone."""
    import onnx
    import onnxruntime as ort

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.onnx"
        # a copy: the export runs the model, which may change its input, and a worker not forked
        # shares a tensor argument's memory; ORT and eager are compared on the input as given
        in_worker(_export, seed, x.clone(), str(path), what="torch.onnx.export")
        proto = onnx.load(path)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = [torch.from_numpy(v) for v in session.run(None, {"x": x.numpy()})]
    with torch.no_grad():
        why = mismatch(theirs, model(x.clone()))
    if why:
        raise ValueError(f"ONNX Runtime's session of the export differs from eager PyTorch: {why}")
    return proto


def _run(seed: int, frontend: str, make: Callable[[], Any], scheduler: str, backend: str,
         cases: list[tuple[torch.Tensor, ...]], expected: list[tuple[Any, tuple[torch.Tensor, ...]]]) -> Outcome:
    """One configuration, its module made by ``make``: equal where the module returns what the
    model returned and leaves its inputs as the model left them."""
    try:
        module = make()
        with torch.no_grad():
            for case, (want, left) in zip(cases, expected):
                given = [t.clone() for t in case]
                why = mismatch(module(*given), want)
                if frontend != "onnx":  # an ONNX file computes values alone: torch.onnx drops writes to inputs
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

""":func:`from_torch`: a PyTorch module into a graph, by torch.export or, failing that, torch.fx.

torch.export (:mod:`opsched.frontends.export_trace`) sees the ATen operators a module runs, and
:mod:`opsched.frontends.torch_export` converts them: every one becomes an op of ours or a
generic ATen node, nothing is opaque, and in-place calls are functionalised by PyTorch itself.
torch.fx (:mod:`opsched.frontends.torch_fx`) traces modules torch.export refuses, at the cost of
opaque nodes for calls without a converter; it is also the tracer that keeps ``leaf_modules``
whole.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import sys
import warnings
from collections.abc import Collection, Iterable, Sequence
from typing import Any, Literal, TypeAlias

import torch
import torch.utils._pytree as pytree
from torch import nn

from opsched.errors import FrontendError, StatefulModelError
from opsched.frontends._common import quieted, report_opaque
from opsched.frontends.export_trace import export_graph
from opsched.frontends.torch_fx import fx_graph
from opsched.ir import Graph
from opsched.structure import ExampleInputs, InputStructure, bind_example, split_example
from opsched.transforms import canonicalize

__all__ = ["from_torch", "as_module", "register_dataclasses", "script_arguments", "Model", "ProgramModule", "TRACERS",
           "Tracer"]

log = logging.getLogger("opsched.frontends")

Tracer = Literal["auto", "export", "fx"]
TRACERS: tuple[str, ...] = ("auto", "export", "fx")

#: What the PyTorch entry points take: a module, or a torch.export program
#: (``torch.export.export(...)``, or one saved and read back with ``torch.export.load("model.pt2")``).
Model: TypeAlias = nn.Module | torch.export.ExportedProgram


def as_module(model: Model, example_inputs: ExampleInputs | None, caller: str) -> tuple[nn.Module, ExampleInputs, str]:
    """``model`` as the module to import, the inputs to import it at, and its name. A
    torch.export program becomes the module it runs (``ExportedProgram.module()``, whose
    train/eval mode was fixed when it was exported), at its own example inputs (saved with it)
    where none are given; one exported with dynamic sizes is imported at the sizes given."""
    if isinstance(model, torch.export.ExportedProgram):
        module = ProgramModule(model)
        return module, module.example_inputs() if example_inputs is None else example_inputs, module.name
    if isinstance(model, torch.jit.ScriptModule):
        if example_inputs is None:
            raise FrontendError(f"{caller} needs example inputs of the TorchScript module {model.original_name}: how "
                                f"it is called (a tensor, or a tuple of positional arguments)")
        module = _from_script(model, example_inputs)
        return module, module.example_inputs(), module.name
    if not isinstance(model, nn.Module):
        raise FrontendError(f"{caller} takes a torch.nn.Module or a torch.export program, got {type(model).__name__}: "
                            f"wrap a function in an nn.Module whose forward calls it")
    _register_caches(model)
    if example_inputs is None:
        raise FrontendError(f"{caller} needs example inputs of {type(model).__name__}: how it is called (a tensor, a "
                            f"tuple of positional arguments, or a dict of keyword arguments such as a tokenizer's "
                            f"output); only a torch.export program carries its own")
    return model, example_inputs, type(model).__name__


def _register_caches(model: nn.Module) -> None:
    """A Hugging Face decoder returns its key-value cache (``DynamicCache``, ...), whose tensors
    pytree, and so torch.export, cannot see: register the cache types the model may return as
    pytree nodes, as transformers' own exporter does, so that they are outputs like any other
    and the module returns the cache rebuilt."""
    transformers = sys.modules.get("transformers")
    if transformers is None or not isinstance(model, transformers.PreTrainedModel):
        return
    try:
        from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model
    except ImportError:  # transformers before 5: DynamicCache, what decoders return
        try:
            from transformers.integrations.executorch import register_dynamic_cache_export_support
        except ImportError:
            return
        register_dynamic_cache_export_support()  # type: ignore[no-untyped-call]  # transformers, unannotated
        return
    register_cache_pytrees_for_model(model)


def register_dataclasses(value: Any) -> list[type]:
    """Register the dataclasses among ``value``'s leaves (a model's output: ``Out(logits=...)``)
    as pytree nodes, as ``torch.export.register_dataclass`` does, so that their tensors are
    outputs like any other, for torch.export and torch.fx alike, and the module returns them
    rebuilt. Returns the types registered (nested ones too)."""
    registered: list[type] = []
    while found := {type(leaf) for leaf in pytree.tree_leaves(value) if dataclasses.is_dataclass(leaf)
                    and not isinstance(leaf, type) and all(f.init for f in dataclasses.fields(leaf))  # rebuildable
                    } - set(pytree.SUPPORTED_NODES):
        for kind in sorted(found, key=lambda k: k.__qualname__):
            torch.export.register_dataclass(kind)
            log.info("registered the dataclass %s as a pytree node, so that its tensors are outputs", kind.__qualname__)
            registered.append(kind)
    return registered


def _from_script(script: torch.jit.ScriptModule, example_inputs: ExampleInputs) -> ProgramModule:
    """A TorchScript module (``torch.jit.load("model.pt")``, ``torch.jit.script``, ``torch.jit.trace``)
    as the torch.export program PyTorch's converter makes of it, traced at ``example_inputs`` in
    eval mode, called by its own argument names and run, as the reference, by TorchScript."""
    from torch._export.converter import TS2EPConverter

    names = script_arguments(script)
    args, kwargs = split_example(example_inputs)
    try:
        bound = inspect.Signature([inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in names]
                                  ).bind_partial(*args, **kwargs)
    except TypeError as e:
        raise FrontendError(f"the TorchScript module {script.original_name} is called as forward({', '.join(names)}), "
                            f"not with these example inputs: {e}") from None
    given = tuple(bound.arguments.values())
    if list(bound.arguments) != names[:len(given)]:
        raise FrontendError(f"the TorchScript module {script.original_name}: give its arguments "
                            f"{', '.join(names)} in order, leaving out only trailing ones")
    training = script.training
    try:
        script.eval()
        with quieted("torch.export", "torch._export"), warnings.catch_warnings():
            # that an unused buffer (a batch norm's count) is carried over
            warnings.filterwarnings("ignore", message="Manually populate", category=UserWarning)
            program = TS2EPConverter(script, given).convert()
    except Exception as e:  # the converter raises many types for what it cannot convert
        raise FrontendError(f"cannot convert the TorchScript module {script.original_name} to a torch.export "
                            f"program: {type(e).__name__}: {str(e).strip().splitlines()[0][:300]}") from e
    finally:
        script.train(training)
    return ProgramModule(program, runs=script, names=names[:len(given)], name=script.original_name)


def script_arguments(script: torch.jit.ScriptModule) -> list[str]:
    """The names of a TorchScript module's ``forward`` arguments, as its schema gives them."""
    return [a.name for a in script.forward.schema.arguments[1:]]  # type: ignore[attr-defined]  # past self


class ProgramModule(nn.Module):
    """A torch.export program as a module called as the model it was exported from: arguments
    exported as positional ones by position or by name, keyword ones by name. (The module
    ``ExportedProgram.module()`` makes takes each argument only as it was passed at export.) The
    program's train/eval mode was fixed when it was exported: ``train()`` and ``eval()`` leave it
    (and set the mode of a TorchScript module it was made of, which ``runs`` its calls)."""

    def __init__(self, program: torch.export.ExportedProgram, *, runs: nn.Module | None = None,
                 names: Sequence[str] | None = None, name: str | None = None) -> None:
        super().__init__()
        self.program = program.module()
        self.runs = runs  # what calls run, where not the program itself (a TorchScript module it was made of)
        self.name = name or _program_name(program)
        self.exported_with = program.example_inputs
        positional, keywords = program.call_spec.in_spec.children()
        names = list(names or inspect.signature(self.program.forward).parameters)[:positional.num_children]
        self.positional, self.keywords = tuple(names), tuple(keywords.context)
        inputs = set(program.graph_signature.user_inputs)
        self.fixed_batch = tuple(n.name for n in program.graph.nodes if n.op == "placeholder" and n.name in inputs
                                 and isinstance(v := n.meta.get("val"), torch.Tensor) and v.dim()
                                 and not isinstance(v.shape[0], torch.SymInt))  # inputs whose batch is fixed
        call = functools.partial(self._call)  # the forward: an instance's own, with this program's signature
        call.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in self.positional]
            + [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY) for k in self.keywords])
        self.__dict__["forward"] = call

    def _call(self, *args: Any, **kwargs: Any) -> Any:
        given = self.forward.__signature__.bind(*args, **kwargs).arguments  # type: ignore[attr-defined]
        run = self.program if self.runs is None else self.runs
        return run(*(given[n] for n in self.positional), **{k: given[k] for k in self.keywords if k in given})

    def train(self, mode: bool = True) -> ProgramModule:
        self.training = mode
        if self.runs is not None:  # a TorchScript module has a mode; the program was made in eval mode
            self.runs.train(mode)
        return self

    def example_inputs(self, batch: int | None = None) -> ExampleInputs:
        """The example inputs the program was exported with, as :func:`from_torch` takes them:
        positional arguments, or (where any was passed by keyword) every argument by name; with
        ``batch``, each tensor's first dimension that size (its first row repeated: token ids stay
        valid), for a program exported with a dynamic batch."""
        if self.exported_with is None:
            raise FrontendError(f"the torch.export program of {self.name} carries no example inputs: pass them (a "
                                f"tensor, a tuple of positional arguments or a dict of keyword arguments)")
        args, kwargs = self.exported_with
        if batch is not None and self.fixed_batch:
            raise FrontendError(f"the torch.export program of {self.name} fixes the first dimension of "
                                f"{', '.join(self.fixed_batch)}: export it with dynamic_shapes (torch.export.Dim) "
                                f"to run it at another batch size")
        if batch is not None:
            args, kwargs = pytree.tree_map_only(
                torch.Tensor, lambda t: t[:1].expand(batch, *t.shape[1:]).clone() if t.dim() else t, (args, kwargs))
        if not kwargs:
            return tuple(args)
        return {**dict(zip(self.positional, args)), **kwargs}


def _program_name(program: torch.export.ExportedProgram) -> str:
    """The class name of the module ``program`` was exported from, as its calls record it."""
    for n in program.graph.nodes:
        for path, kind in n.meta.get("nn_module_stack", {}).values():
            if path == "":
                return str(kind).rpartition(".")[2]
    return "ExportedProgram"


def from_torch(module: Model, example_inputs: ExampleInputs | None = None, *, name: str | None = None,
               leaf_modules: Iterable[type[nn.Module]] = (), canonical: bool = True, tracer: Tracer = "auto",
               fixed_values: Collection[str] = ()) -> Graph:
    """Import ``module`` as a :class:`~opsched.ir.Graph` specialised to ``example_inputs``: one
    tensor, the positional arguments, or a mapping of keyword arguments (a tokenizer's output).
    The graph's inputs are the tensors among them, in the order of ``forward``'s parameters
    (:class:`~opsched.structure.InputStructure`); other arguments (``None``, flags) are fixed.
    ``module`` may be a torch.export program (:func:`as_module`), whose own example inputs are
    taken where none are given.

    ``tracer``: ``"export"`` (torch.export, ATen level), ``"fx"`` (torch.fx) or ``"auto"``:
    torch.export, and torch.fx where torch.export cannot trace the module (an error gives both
    reasons when neither can). ``leaf_modules`` are submodule types to keep whole (opaque)
    instead of tracing into them, the fix for a submodule torch.fx cannot trace; they imply
    torch.fx. With ``canonical`` (default), batch norms are folded and activations fused
    (:func:`opsched.transforms.canonicalize`).

    ``fixed_values`` names tensor arguments (or places within one: ``"xs[1]"``) whose values the
    graph is specialised to, as it is to a flag's: they are not its inputs, and what the model
    computes of them alone is computed here. A vision tower sizes its tensors by the numbers in
    its ``grid_thw`` (an image's frames, rows and columns of patches), which one static graph can
    hold only for given values: ``from_torch(tower, {"hidden_states": x, "grid_thw": grid},
    fixed_values=("grid_thw",))``. What the model computes of the fixed values alone is computed
    while it is traced (:mod:`opsched.frontends.fixed_values`), else it is traced by
    :func:`torch.export.draft_export` and refused where it branches on a number read out of any
    other tensor (the branch would hold for the example alone). A module made of the graph
    refuses other values.
    """
    if tracer not in TRACERS:
        raise FrontendError(f"tracer must be one of {', '.join(TRACERS)}, got {tracer!r}")
    if isinstance(fixed_values, str):
        raise FrontendError(f"fixed_values: a sequence of argument names, got the string {fixed_values!r} "
                            f"(write ({fixed_values!r},))")
    module, example_inputs, own_name = as_module(module, example_inputs, "from_torch()")
    structure, inputs = bind_example(module.forward, example_inputs, fixed_values)
    name = name or own_name
    leaves = tuple(leaf_modules)
    if leaves and tracer == "export":
        raise FrontendError("leaf_modules are kept whole by torch.fx; torch.export cannot: pass tracer='fx' "
                            "(or 'auto')")
    # a program's own module is traced (weights named as in the model), called as it was exported: the
    # canonical call's positional arguments by position, its keyword-only ones by name
    traced = module.program if isinstance(module, ProgramModule) else module
    with _dynamo_compiling():
        graph = _trace(traced, structure, inputs, name, leaves, "fx" if leaves else tracer)
    graph = graph.verify()
    if canonical:
        graph = canonicalize(graph)
    report_opaque(graph, f"from_torch({name})")
    return graph


def _dynamo_compiling() -> contextlib.AbstractContextManager[Any]:
    """Dynamo's compile lock, held while a model is traced: torch.export's tracer is process-wide
    state that Dynamo, compiling a frame in another thread at the same time, takes for its own
    (a server's threads, each meeting a new input shape of ``torch.compile(model,
    backend="opsched")``, whose plans are made at the call: Dynamo failed on "s50 is not tracked
    with proxy for _ModuleStackTracer", and the trace fell back to torch.fx, which broke the other
    threads' calls). Dynamo holds it for each compile; without it (another torch), nothing."""
    lock = _compile_lock()
    return contextlib.nullcontext() if lock is None else lock


def in_dynamo_compile() -> bool:
    """Whether this thread holds Dynamo's compile lock: it is compiling a frame, and the caller
    runs within (a torch.compile backend of a user's own that calls :func:`opsched.optimize`)."""
    owned = getattr(_compile_lock(), "_is_owned", None)  # a threading.RLock's, as Condition uses it
    return bool(owned is not None and owned())


def _compile_lock() -> Any:
    try:
        from torch._dynamo.convert_frame import compile_lock
    except ImportError:  # pragma: no cover - a torch without it
        return None
    return compile_lock


def _trace(module: nn.Module, structure: InputStructure, inputs: tuple[torch.Tensor, ...], name: str,
           leaves: tuple[type[nn.Module], ...], tracer: str) -> Graph:
    if tracer == "fx":
        return _fx(module, structure, inputs, name, leaves)
    try:
        return export_graph(module, *structure.call(inputs), name, fixed=structure.fixed)
    except FrontendError as export_error:
        if tracer == "export" or isinstance(export_error, StatefulModelError):  # torch.fx would not change that
            raise
        try:
            graph = _fx(module, structure, inputs, name, leaves)
        except FrontendError as fx_error:  # both reasons, as the type torch.fx's says
            raise type(fx_error)(f"{export_error}; and {fx_error}", fixable=export_error.fixable) from fx_error
        if any(n.op == "opaque" for n in graph.nodes):  # what torch.fx kept whole: why torch.export did not trace it
            log.warning("%s; torch.fx traced it instead, keeping whole what it cannot trace", export_error)
        return graph


def _fx(module: nn.Module, structure: InputStructure, inputs: tuple[torch.Tensor, ...], name: str,
        leaves: tuple[type[nn.Module], ...]) -> Graph:
    if structure.fixed:
        raise FrontendError(f"torch.fx cannot fix {name}'s tensor arguments {', '.join(structure.fixed_places)} "
                            f"(fixed_values=): torch.export does")
    if not structure.plain:
        raise FrontendError(f"torch.fx traces {name} called with positional tensors only, not as "
                            f"{structure.describe()}")
    return fx_graph(module, inputs, name, leaves)

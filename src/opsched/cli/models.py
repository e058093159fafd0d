"""What the CLI accepts as MODEL: a zoo name, an .onnx file, a torch.export program (a .pt2
file), a TorchScript module (a .pt file of torch.jit.save), or ``package.module:factory``."""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from opsched.errors import FrontendError, OpschedError
from opsched.ir import Graph
from opsched.structure import ExampleInputs, InputStructure, bind_example

__all__ = ["LoadedModel", "TorchImport", "load_model"]


@dataclass(frozen=True)
class TorchImport:
    """How a PyTorch module (a zoo model, a factory's) is imported: :func:`opsched.from_torch`'s
    ``tracer``, ``fixed_values`` and ``leaf_modules``, the last as ``package.module:Class``."""

    tracer: str = "auto"
    fixed_values: tuple[str, ...] = ()
    leaf_modules: tuple[str, ...] = ()

    @property
    def flags(self) -> list[str]:
        """The command-line flags that set what is not the default."""
        return [flag for flag, value in (("--tracer", self.tracer != "auto"), ("--fixed-value", self.fixed_values),
                                         ("--leaf-module", self.leaf_modules)) if value]

    def options(self) -> dict[str, Any]:
        """:func:`opsched.from_torch`'s keyword arguments, the leaf module classes imported."""
        leaves = []
        for spec in self.leaf_modules:
            found = _imported(spec, "the class")
            if not (isinstance(found, type) and issubclass(found, nn.Module)):
                raise OpschedError(f"--leaf-module {spec}: a torch.nn.Module subclass, got {type(found).__name__} "
                                   f"{found!r}")
            leaves.append(found)
        return {"tracer": self.tracer, "fixed_values": self.fixed_values, "leaf_modules": tuple(leaves)}


@dataclass
class LoadedModel:
    name: str
    graph: Graph
    inputs: tuple[torch.Tensor, ...]  # the graph's inputs
    module: nn.Module | None  # None for ONNX files
    call: InputStructure | None = None  # how ``module`` is called with ``inputs``
    onnx_path: str | None = None  # the file, for an ONNX file
    onnx_values: Mapping[str, float | list[float]] = field(default_factory=dict)  # its inputs fixed


def load_model(spec: str, batch: int = 1, input_shapes: Sequence[str] = (), input_values: Sequence[str] = (),
               how: TorchImport = TorchImport()) -> LoadedModel:
    """The model ``spec`` names, imported, with example inputs: for a zoo model at ``batch``; for
    a factory (see :func:`_from_factory`) at the example inputs it returns, else at its one
    ``input_shapes`` entry (``"1,3,224,224"``) or its ``example_input_shape``; for an ONNX file at
    its declared shapes, a dynamic first dimension set to ``batch`` and other dynamic ones from
    ``input_shapes`` (``"NAME=1,128"``, or unnamed for a file of one input). ONNX inputs are
    random: normal floats, integers and booleans of 0 and 1 (valid token ids, masks and segment
    ids alike). ``input_values`` (``"NAME=16000"``) fix an ONNX file's inputs at values
    (:func:`opsched.from_onnx`'s ``input_values``). ``how`` imports a zoo model or a factory's."""
    from opsched.frontends import from_onnx, from_torch
    from opsched.models import MODELS, example_inputs, get_model

    unnamed, named = _parse_shapes(input_shapes)
    values = _parse_values(input_values)
    if values and not spec.endswith(".onnx"):
        raise OpschedError(f"--input-value is for .onnx files; {spec} is called with tensors of its own")
    if how.flags and (spec.endswith((".onnx", ".pt2", *TORCHSCRIPT)) or (spec not in MODELS and ":" not in spec)):
        raise OpschedError(f"{', '.join(how.flags)}: for a PyTorch module to import (a zoo model or a "
                           f"package.module:factory); {spec} is not one")
    if spec in MODELS:
        if input_shapes:
            raise OpschedError(f"{spec} is a zoo model: its shape is fixed but for --batch; --input-shape is for "
                               f".onnx files and package.module:factory models")
        module, given = get_model(spec), example_inputs(spec, batch)
        call, inputs = bind_example(module.forward, given, how.fixed_values)
        return LoadedModel(spec, from_torch(module, given, name=spec, **how.options()), inputs, module, call)
    if spec.endswith(".onnx"):
        graph = from_onnx(spec, input_shapes=_onnx_shapes(spec, batch, unnamed, named, set(values)),
                          input_values=values)
        gen = torch.Generator().manual_seed(0)
        inputs = tuple(_random(i.type.shape, getattr(torch, i.type.dtype), gen) for i in graph.inputs)
        return LoadedModel(graph.name, graph, inputs, None, onnx_path=spec, onnx_values=values)
    if spec.endswith(".pt2"):
        return _from_program(spec, batch, input_shapes)
    if spec.endswith(TORCHSCRIPT):
        return _from_script_file(spec, batch, unnamed, named)
    if ":" in spec:
        name = spec.partition(":")[2]
        module, example, drawn = _from_factory(spec, batch, unnamed, named)
        call, inputs = bind_example(module.forward, example, how.fixed_values)
        try:
            graph = from_torch(module, example, name=name, **how.options())
        except FrontendError as e:
            if not drawn:
                if e.fixable and not how.fixed_values:
                    flags = " ".join(f"--fixed-value {n}" for n in e.fixable)
                    raise type(e)(f"{e} (on the command line: {flags})", fixable=e.fixable) from e
                raise
            shape = ",".join(map(str, inputs[0].shape))
            raise type(e)(f"{e}. (Its example input was a random float32 tensor of shape {shape}; a model whose "
                          f"input is an integer one, such as token ids, or several tensors, needs its factory to "
                          f"return (module, example inputs).)") from e
        return LoadedModel(name, graph, inputs, module, call)
    raise OpschedError(f"{spec!r} is not a zoo model ({', '.join(MODELS)}), an .onnx file, a .pt2 file, a TorchScript "
                       f"file ({', '.join(TORCHSCRIPT)}) or package.module:factory")


#: The endings of TorchScript files (``torch.jit.save``) the CLI reads.
TORCHSCRIPT = (".pt", ".pth", ".ts", ".torchscript")


def _from_script_file(path: str, batch: int, unnamed: tuple[int, ...] | None,
                      named: dict[str, tuple[int, ...]]) -> LoadedModel:
    """A TorchScript module saved by ``torch.jit.save``, on random float inputs of the
    ``--input-shape`` given: one unnamed shape for a module of one input, else one per argument
    name (``--input-shape x=1,3,224,224``)."""
    from opsched.frontends import from_torch
    from opsched.frontends.pytorch import as_module, script_arguments

    if batch != 1:
        raise OpschedError(f"{path}: a TorchScript module runs at the --input-shape given, which holds its batch")
    try:
        script = torch.jit.load(path, map_location="cpu")  # type: ignore[no-untyped-call]  # torch's, unannotated
    except Exception as e:  # torch.jit.load raises many types for a missing, foreign or damaged file
        raise OpschedError(f"cannot load {path} as a TorchScript module (torch.jit.save): {type(e).__name__}: "
                           f"{str(e).strip().splitlines()[0][:200]}; a module saved with torch.save loads through a "
                           f"package.module:factory") from None
    names = script_arguments(script)
    shapes = {names[0]: unnamed} if unnamed is not None and len(names) == 1 else dict(named)
    if unnamed is not None and len(names) != 1:
        raise OpschedError(f"{path}: its forward takes {', '.join(names)}: give each shape as --input-shape NAME=...")
    if missing := [n for n in names if n not in shapes]:
        raise OpschedError(f"{path}: give the shape of {', '.join(missing)} with --input-shape "
                           f"{'1,3,224,224' if len(names) == 1 else missing[0] + '=...'} (its forward takes "
                           f"{', '.join(names)})")
    if unknown := sorted(set(shapes) - set(names)):
        raise OpschedError(f"{path}: --input-shape names {', '.join(unknown)}, but its forward takes "
                           f"{', '.join(names)}")
    gen = torch.Generator().manual_seed(0)
    drawn = tuple(torch.randn(*shapes[n], generator=gen) for n in names)
    name = os.path.splitext(os.path.basename(path))[0]
    module, example, _ = as_module(script, drawn, "opsched optimize")  # a program, converted once
    call, inputs = bind_example(module.forward, example)
    return LoadedModel(name, from_torch(module, example, name=name), inputs, module, call)


def _from_program(path: str, batch: int, input_shapes: Sequence[str]) -> LoadedModel:
    """A torch.export program saved by ``torch.export.save``, at the example inputs saved with it,
    or at ``batch`` (each input's first dimension) for a program exported with a dynamic batch."""
    from opsched.frontends import from_torch
    from opsched.frontends._common import quieted
    from opsched.frontends.pytorch import ProgramModule

    if input_shapes:
        raise OpschedError(f"{path}: a torch.export program runs at the example inputs saved with it (--batch sets "
                           f"a dynamic batch); --input-shape is for .onnx files and factories")
    try:
        with quieted("torch.export"):  # it logs a traceback of its own before raising
            program = torch.export.load(path)
    except Exception as e:  # torch.export.load raises many types for a missing, foreign or damaged file
        raise OpschedError(f"cannot load the torch.export program {path}: {type(e).__name__}: {e}") from None
    module = ProgramModule(program)
    example = module.example_inputs(None if batch == 1 else batch)
    call, inputs = bind_example(module.forward, example)
    name = os.path.splitext(os.path.basename(path))[0]
    return LoadedModel(name, from_torch(module, example, name=name), inputs, module, call)


def _from_factory(spec: str, batch: int, unnamed: tuple[int, ...] | None,
                  named: dict[str, tuple[int, ...]]) -> tuple[nn.Module, ExampleInputs, bool]:
    """What ``package.module:factory()`` returns: a module, or ``(module, example inputs)`` with
    the inputs as :func:`opsched.optimize` takes them (a tensor, positional arguments, or keyword
    arguments such as a tokenizer's output); a module alone is called on one random float tensor
    of the ``--input-shape`` given, else of its ``example_input_shape``. The flag: whether the
    example was drawn so."""
    made = _imported(spec, "the factory")()
    module, example = made if isinstance(made, tuple) and len(made) == 2 else (made, None)
    if not isinstance(module, nn.Module):
        raise OpschedError(f"{spec}() returned {type(made).__name__}: a factory returns an nn.Module, or a pair "
                           f"(module, example inputs) whose inputs are a tensor, a tuple of positional arguments or a "
                           f"dict of keyword arguments (a tokenizer's output)")
    module.eval()
    if batch != 1:
        raise OpschedError(f"{spec}: --batch is for zoo models and .onnx files; a factory's model runs at the shapes "
                           f"of the example inputs it returns, or of --input-shape")
    if example is not None:
        if unnamed or named:
            raise OpschedError(f"{spec}() returns example inputs, which fix the shapes: --input-shape is for a "
                               f"factory that returns a module alone")
        return module, example, False
    if named:
        raise OpschedError(f"{spec}: a module alone takes one unnamed --input-shape (e.g. 1,3,224,224); for "
                           f"several inputs, or integer ones such as token ids, return (module, example inputs) "
                           f"from the factory")
    shape = unnamed or getattr(module, "example_input_shape", None)
    if shape is None:
        raise OpschedError(f"{spec}: give the input shape with --input-shape (e.g. 1,3,224,224), an "
                           f"example_input_shape attribute on the module, or return (module, example inputs) from "
                           f"the factory")
    return module, torch.randn(*shape), True


def _imported(spec: str, what: str) -> Any:
    """What ``package.module:name`` names, its module imported as ``python -m`` would import it
    (from the current directory or the installed packages); ``what`` it is, for the error."""
    mod_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:  # as `python -m` finds a module of this directory
        sys.path.insert(0, os.getcwd())
    try:
        return getattr(importlib.import_module(mod_name), attr)
    except (ImportError, AttributeError, ValueError) as e:
        raise OpschedError(f"cannot load {spec!r}: {type(e).__name__}: {e} ({what}'s module is imported from the "
                           f"current directory or the installed packages, as package.module:name)") from None


def _parse_shapes(values: Sequence[str]) -> tuple[tuple[int, ...] | None, dict[str, tuple[int, ...]]]:
    """``--input-shape`` values: the one unnamed shape, if any, and the named ones."""
    unnamed: tuple[int, ...] | None = None
    named: dict[str, tuple[int, ...]] = {}
    for value in values:
        name, _, dims = value.rpartition("=")
        try:
            shape = tuple(int(d) for d in dims.split(","))
        except ValueError:
            raise OpschedError(f"--input-shape {value!r}: expected sizes separated by commas, as 1,3,224,224 or "
                               f"NAME=1,128") from None
        if any(d < 1 for d in shape):
            raise OpschedError(f"--input-shape {value!r}: sizes must be positive")
        if name:
            named[name] = shape
        elif unnamed is not None:
            raise OpschedError("--input-shape: give several inputs' shapes as NAME=1,128, one per input")
        else:
            unnamed = shape
    return unnamed, named


def _parse_values(entries: Sequence[str]) -> dict[str, float | list[float]]:
    """``--input-value`` entries: per input named, its value (one number, or several separated by commas)."""
    values: dict[str, float | list[float]] = {}
    for entry in entries:
        name, _, text = entry.partition("=")
        try:
            numbers = [float(v) for v in text.split(",")]
        except ValueError:
            numbers = []
        if not name or not numbers:
            raise OpschedError(f"--input-value {entry!r}: expected NAME=VALUE, as sr=16000, or NAME=1,2,3")
        values[name] = numbers if len(numbers) > 1 else numbers[0]
    return values


def _onnx_shapes(path: str, batch: int, unnamed: tuple[int, ...] | None,
                 named: dict[str, tuple[int, ...]], valued: Collection[str] = ()) -> dict[str, tuple[int, ...]]:
    """The shapes to fix the file's inputs at (see :func:`load_model`), or an error naming every
    input whose dynamic dimensions are still open and how to give them (inputs ``valued``, fixed
    at a value, have its shape)."""
    from opsched.frontends.onnx_file import onnx_input_dims

    declared = {name: dims for name, dims in onnx_input_dims(path).items() if name not in valued}
    if unnamed is not None:
        if len(declared) != 1:
            raise OpschedError(f"{path} has {len(declared)} inputs ({', '.join(declared)}): give each shape as "
                               f"--input-shape NAME=...")
        named = {next(iter(declared)): unnamed, **named}
    if unknown := sorted(set(named) - set(declared)):
        raise OpschedError(f"{path}: --input-shape names {', '.join(map(repr, unknown))}, but its inputs are "
                           f"{', '.join(map(repr, declared))}")
    shapes, open_ = dict(named), []
    for name, dims in declared.items():
        if name in shapes or (dims is not None and all(isinstance(d, int) for d in dims)):
            continue
        if dims and isinstance(dims[0], str) and all(isinstance(d, int) for d in dims[1:]):
            shapes[name] = (batch, *(int(d) for d in dims[1:]))  # the batch dimension
        else:
            shown = "no declared shape" if dims is None else f"[{', '.join(map(str, dims))}]"
            open_.append(f"{name!r} ({shown})")
    if open_:
        example = " ".join(f"--input-shape {n}=..." for n in declared if n not in shapes)
        raise OpschedError(f"{path}: the sizes of {', '.join(open_)} are not fixed by the file: give them, e.g. "
                           f"{example}")
    return shapes


def _random(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(0, 2, shape, generator=gen).to(dtype)

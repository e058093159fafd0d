"""Tracing a PyTorch module with ``torch.export``, as the ATen-level import needs it.

:func:`export_graph` runs ``torch.export`` on the module at the example inputs' sizes (without
grad, as the graph will run), makes the program functional where it is not already
(:meth:`torch.export.ExportedProgram.run_decompositions` with an empty table), and hands it to
:class:`~opsched.frontends.torch_export.ExportConverter`. Around the trace it keeps what
torch.export says to the user worth reading: the partial graph it prints before failing is
dropped, warnings no user can act on are filtered, and a failure becomes one
:class:`~opsched.errors.FrontendError` line, with what to do where there is one thing to do.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import os
import re
import sys
import traceback
import warnings
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch import nn

from opsched.errors import FrontendError
from opsched.frontends._common import log, quieted, symbolic
from opsched.frontends.export_in_place import made_out_of_place
from opsched.frontends.fixed_values import WithFixedValues, scalar_buffers
from opsched.frontends.model_source import failure_place
from opsched.frontends.torch_export import ExportConverter
from opsched.ir import Graph

__all__ = ["export_graph", "program_outputs"]


#: torch.export's warning about tensor attributes assigned during export, where every one named
#: is an entry of a torch RNN module's ``_flat_weights``.
_RNN_FLAT_WEIGHTS = r"The tensor attributes ([\w.]+\._flat_weights\[\d+\], )*[\w.]+\._flat_weights\[\d+\] were assigned"


def export_graph(module: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], name: str,
                 fixed: Collection[int] = ()) -> Graph:
    """``module`` called with ``args`` and ``kwargs``, traced by torch.export and converted (module
    docstring): the graph's inputs are the tensors among them, in pytree order, but the leaves
    numbered in ``fixed``, whose values the graph is specialised to, and every other argument is
    fixed; raises :class:`FrontendError` with torch.export's reason where it cannot trace.

    Where the model reads numbers out of fixed inputs to size its tensors (a vision tower's
    ``grid_thw``), torch.export cannot trace it. What the model computes of the fixed values alone
    is then computed for real while it is traced (:mod:`opsched.frontends.fixed_values`), and where
    that fails, :func:`torch.export.draft_export` traces it, taking each branch on such a number as
    the example's values take it; the converter then folds what it computed of them, and refuses a
    number read out of any tensor but a fixed one (:class:`ExportConverter`). A model that branches
    on what it computes of constants alone (torch.nn's Transformer, given a causal mask that its
    forward makes, compares it with one of its own) or keeps numbers in buffers and sizes its
    tensors by them (Mimi's convolutions, their strides) is traced again with those computed for
    real (:func:`_constants_fixed`); one whose Hugging Face experts loop over experts in Python,
    with its experts routing as tensors (:func:`_experts_as_tensors`)."""
    leaves = pytree.tree_leaves((tuple(args), dict(kwargs)))
    held = {k: leaves[k] for k in fixed}
    if held:
        with_values = WithFixedValues(module, args, kwargs, held)
        try:
            program = _exported(with_values, *with_values.call, draft=False)
        except Exception as e:  # noqa: BLE001 (a call the fixed values cannot be computed through: draft_export's turn)
            log.info("%s: tracing with its fixed values computed failed (%s: %s); tracing with "
                     "torch.export.draft_export", name, type(e).__name__,
                     str(e).strip().splitlines()[0][:200] if str(e).strip() else "")
        else:
            return ExportConverter(program, name, root=WithFixedValues.ROOT).run()
    draft = False
    try:
        try:
            # with values fixed, a plain trace first: where the model reads their numbers without
            # branching on them (a repeat_interleave by the grid, a tensor of its .tolist()), it
            # succeeds with their sizes unbacked, bound by the converter; draft_export traces only
            # what it refuses (and may fail where it succeeds: an int64 division of such a tensor
            # met promote_types returning NotImplemented under draft_export in torch 2.13)
            program = _exported(module, args, kwargs, draft=False if held else None)
        except Exception as e:  # torch.export raises many types for the same root causes
            if not held or not _data_dependent(str(e)):
                raise
            program, draft = _exported(module, args, kwargs, draft=True), True
    except Exception as e:
        if not held and _data_dependent(str(e)) and (
                (graph := _constants_fixed(module, args, kwargs, name)) is not None
                or (graph := _experts_as_tensors(module, args, kwargs, name)) is not None):
            return graph
        sizing = () if held or not _data_dependent(str(e)) else tuple(_sizing(module, args, kwargs))
        hint = _torch_branch_hint(e) or _hint(str(e), sizing, bool(held)) or _unmade_hint(str(e), module, args, kwargs)
        raise FrontendError(f"torch.export cannot trace {name}: {type(e).__name__}: "
                            f"{str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"
                            f"{failure_place(e)}{hint}", fixable=sizing) from e
    return ExportConverter(program, name, held, draft=draft).run()


def _constants_fixed(module: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], name: str) -> Graph | None:
    """``module`` traced with what it computes of constants alone computed for real, as of fixed
    inputs (:mod:`opsched.frontends.fixed_values`): tensors made of Python's values (a causal mask,
    ``torch.full(...).triu(1)``) and the numbers it keeps in buffers (:func:`scalar_buffers`);
    converted, or None where it still cannot be traced (it branches on its inputs' values then)."""
    buffers = scalar_buffers(module)
    with_constants = WithFixedValues(module, args, kwargs, (), buffers)
    try:
        program = _exported(with_constants, *with_constants.call, draft=False)
    except Exception as e:  # noqa: BLE001 (not the constants' doing: the first failure is the one to report)
        log.info("%s: tracing with its constants computed failed too (%s)", name, type(e).__name__)
        return None
    log.info("%s: traced with its constants computed (%d scalar buffers%s)", name, len(buffers),
             f": {', '.join(buffers[:3])}" if buffers else "")
    return ExportConverter(program, name, root=WithFixedValues.ROOT).run()


#: transformers' implementation of a mixture of experts that routes tokens as tensors (one grouped
#: matrix product over the tokens sorted by expert), which torch.export traces; its "eager" one loops
#: in Python over the experts some token chose, a count that depends on the tokens' values
_TENSOR_EXPERTS = "grouped_mm"


def _experts_as_tensors(module: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], name: str) -> Graph | None:
    """``module`` traced with its Hugging Face experts routing as tensors (:data:`_TENSOR_EXPERTS`)
    where they loop over the experts in Python (``experts_implementation="eager"``, OpenAI's
    privacy filter's default), the model's own implementation restored after; the same experts'
    arithmetic in another order, which the check against the model holds within its tolerance.
    None where the model has no experts so implemented, transformers cannot switch them, or the
    trace fails so too (the first failure is the one to report)."""
    model: Any = next((m for m in module.modules() if callable(getattr(m, "set_experts_implementation", None))), None)
    if model is None:
        return None
    try:
        was = model.get_experts_implementation()
        if "eager" not in was.values() or not model._can_set_experts_implementation():
            return None
        model.set_experts_implementation(_TENSOR_EXPERTS)
    except Exception as e:  # noqa: BLE001 (transformers refuses the switch: no second trace)
        log.info("%s: its experts cannot route as tensors (%s: %s)", name, type(e).__name__, e)
        return None
    try:
        program = _exported(module, args, kwargs)
    except Exception as e:  # noqa: BLE001 (not the experts' doing: the first failure is the one to report)
        log.info("%s: tracing with its experts routing as tensors failed too (%s)", name, type(e).__name__)
        return None
    finally:
        model.set_experts_implementation(was)
    log.info("%s: its experts loop over experts in Python (experts_implementation=%r); traced with "
             "experts_implementation=%r, their arithmetic in another order", name, was, _TENSOR_EXPERTS)
    return ExportConverter(program, name).run()


def program_outputs(module: nn.Module, args: Sequence[Any], kwargs: dict[str, Any]) -> list[Any] | None:
    """What torch.export's own program of ``module`` (traced as :func:`export_graph` traces it)
    returns when called with ``args`` and ``kwargs``, as the leaves of its output; None where it
    cannot be traced or run. The arbiter of a failed check: where the program is as far from the
    model as the scheduled module, the difference was traced, not scheduled."""
    try:
        program = _exported(module, args, kwargs)
        with torch.no_grad():
            return list(pytree.tree_leaves(program.module()(*args, **kwargs)))
    except Exception:  # noqa: BLE001 (no program, or one that refuses these inputs: no arbiter)
        return None


def _exported(module: nn.Module, args: Sequence[Any], kwargs: dict[str, Any], draft: bool | None = None
              ) -> torch.export.ExportedProgram:
    """``module`` traced by torch.export, functional; raises what torch.export raises. ``draft``
    is None where no value is fixed, else whether to trace by :func:`torch.export.draft_export`."""
    said = io.StringIO()
    # traced without grad, as it will run: a no_grad region in the model (Llama's rotary
    # embedding) is then not wrapped in a higher-order set_grad_enabled call
    with _without_partial_graph(said), warnings.catch_warnings(), torch.no_grad(), _conversions_to_nothing_skipped():
        # torch's own: the deprecation of its pytree internals, and nn.LSTM/GRU/RNN refreshing
        # their _flat_weights list in forward (no user of the model can act on either)
        warnings.filterwarnings("ignore", message=".*LeafSpec.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message=_RNN_FLAT_WEIGHTS, category=UserWarning)
        seen, seen_kw = pytree.tree_map_only(torch.Tensor, _unmarked, (tuple(args), kwargs))
        if draft is None:
            program = torch.export.export(module, seen, seen_kw, strict=False)
            return _functionalised(program)
        # with values fixed, torch.export's notes on the numbers read out of them (which it cannot
        # place in the model's code), and draft_export's report of each branch it took as the
        # example's numbers did, are for the log: the converter says what it refuses
        with quieted("torch.export", "torch._export", "torch._functorch", "torch.fx.experimental.symbolic_shapes"):
            if not draft:
                program = torch.export.export(module, seen, seen_kw, strict=False)
            else:
                program = torch.export.draft_export(module, seen, seen_kw, strict=False)
                for n in program.graph.nodes:  # its detach_ calls (autograd's business alone) would make it retrace
                    if n.target is torch.ops.aten.detach_.default:
                        n.target = torch.ops.aten.detach.default
            return _functionalised(program)


@contextlib.contextmanager
def _conversions_to_nothing_skipped() -> Iterator[None]:
    """While traced, a module's ``.to(...)`` that would change none of its parameters and buffers
    returns the module, as eager's does in effect. SwitchTransformers' router converts itself in
    every forward (``self.classifier = self.classifier.to(self.dtype)``), and torch.export cannot
    apply even that to the weights it traces ("Couldn't swap Linear.weight"). A conversion that
    changes something goes to ``nn.Module.to`` as before."""
    to = nn.Module.to

    def to_or_unchanged(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        device, dtype, _, memory_format = torch._C._nn._parse_to(*args, **kwargs)
        if memory_format is None and (dtype is None or dtype.is_floating_point or dtype.is_complex) and all(
                (device is None or t.device == device)
                and (dtype is None or not (t.is_floating_point() or t.is_complex()) or t.dtype == dtype)
                for t in (*self.parameters(), *self.buffers())):
            return self
        return to(self, *args, **kwargs)

    nn.Module.to = to_or_unchanged  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        nn.Module.to = to  # type: ignore[method-assign]


def _unmarked(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as torch.export is to see it: without the sizes ``torch._dynamo.mark_dynamic``
    marked on it (an attribute of the tensor object, which torch.compile's callers leave on their
    inputs). opsched specialises a graph to the example's sizes; torch.export would make a marked
    size a dynamic dimension, and refuse a model that fixes it."""
    if any(k.startswith("_dynamo_") for k in getattr(tensor, "__dict__", ())):
        return tensor.detach()  # the same memory, a fresh object
    return tensor


@contextlib.contextmanager
def _without_partial_graph(said: io.StringIO) -> Iterator[None]:
    """What torch.export writes to ``sys.stderr`` (its warnings), passed on when it is done, less
    the graph it traced up to a failure: it prints that whole (hundreds of lines for a
    transformer) before raising, and opsched says why in one line, and may go on with torch.fx."""
    error: BaseException | None = None
    try:
        with contextlib.redirect_stderr(said):
            yield
    except BaseException as e:
        error = e
        raise
    finally:
        text = said.getvalue()
        graph = str(getattr(error, "partial_fx_graph", "") or "")
        sys.stderr.write(text.replace(f"{graph}\n", "") if graph else text)


def _hint(reason: str, sizing: Sequence[str] = (), fixing: bool = False) -> str:
    """What to do about a torch.export failure users meet often, where there is one thing to do."""
    if found := re.search(r"Found <class '([\w.]+)'> in output, which is not a known type", reason):
        kind = found.group(1).rpartition(".")[2]
        fix = ("model.config.use_cache = False (a Hugging Face model's key-value cache)" if "Cache" in kind else
               f"return its tensors instead, or register it (torch.export.register_dataclass({kind}) for a dataclass, "
               f"which opsched.optimize does itself)")
        return f" [the model returns a {kind}, whose tensors torch.export cannot see: {fix}]"
    if _data_dependent(reason) and not fixing:
        fix = (f"; where they are the numbers of {' or '.join(sizing)} (a vision tower's grid_thw sets its sizes so), "
               f"fixed_values=({', '.join(map(repr, sizing))},) specialises the graph to the example's"
               if sizing else "")
        return (" [the model's sizes or control flow depend on its tensors' values (a detector's non-maximum "
                "suppression, say), which one traced graph cannot hold: torch.compile(model, backend='opsched') "
                f"schedules the graphs Dynamo captures between those places{fix}]")
    return ""


#: What to do where torch.export stops on a branch in torch's own modules, by the function it stopped in.
_TORCH_BRANCHES = {
    "_detect_is_causal_mask": (
        "torch.nn's Transformer compares the mask it is given with a causal mask of its own, to choose "
        "its kernel: a branch on the mask's values. Say which it is where the model calls it, is_causal= "
        "(TransformerEncoder, its layers) or tgt_is_causal= (Transformer, TransformerDecoder): True for "
        "a causal mask, else False; or name the mask in fixed_values to specialise the graph to it"),
}


def _torch_branch_hint(error: BaseException) -> str:
    """The fix (:data:`_TORCH_BRANCHES`) for a trace that stopped in one of torch's own modules on a
    branch its caller can settle; nothing otherwise."""
    modules = os.path.join(os.path.dirname(torch.__file__), "nn", "modules") + os.sep
    for frame, _ in traceback.walk_tb(error.__traceback__):
        fix = _TORCH_BRANCHES.get(frame.f_code.co_name)
        if fix is not None and os.path.abspath(frame.f_code.co_filename).startswith(modules):
            return f" [{fix}]"
    return ""


def _data_dependent(reason: str) -> bool:
    """Whether torch.export failed on sizes or a branch that depend on a tensor's values."""
    return re.search(r"data.dependent", reason, re.IGNORECASE) is not None


def _sizing(module: nn.Module, args: Sequence[Any], kwargs: dict[str, Any]) -> list[str]:
    """The call's integer tensor arguments that may hold sizes (an image's grid of patches, a
    list of lengths), for a hint: not token ids or masks, whose values are the data."""
    try:
        given = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        given = dict(kwargs)
    return [name for name, v in given.items()
            if isinstance(v, torch.Tensor) and not (v.is_floating_point() or v.is_complex() or v.dtype == torch.bool)
            and not (name.endswith("ids") or "mask" in name)]


def _functionalised(program: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """``program`` as ``run_decompositions({})`` would make it: itself where it already is, or
    where :func:`made_out_of_place` can rewrite its writes in its own graph, which saves half to
    two thirds of the import time (nasnet_large: 3.5 s traced, 5.9 s more to functionalise).
    Every call must be an ATen operator, a higher-order one or a ``getitem`` for that; what else
    export leaves, the retrace lowers: the calls of a ``torch.vmap`` region (a graph Dynamo
    captured of a model that vmaps, Mamba's scan) to the ATen calls they batch."""
    from opsched.frontends.aten_ops import getitem

    if all(n.target is getitem or isinstance(n.target, (torch._ops.HigherOrderOperator, torch._ops.OpOverload))
           or symbolic(n.meta.get("val"))  # arithmetic on a number read out of a tensor (u0 <= 16)
           for n in program.graph.nodes if n.op == "call_function") and made_out_of_place(program):
        return program
    functional: torch.export.ExportedProgram = program.run_decompositions({})
    return functional


def _unmade_hint(reason: str, module: nn.Module, args: Sequence[Any], kwargs: dict[str, Any]) -> str:
    """Where tracing failed on a None and the call leaves masks at their default None: a Hugging
    Face model makes a default ``attention_mask`` only when not compiling (``if attention_mask is
    None and not is_torchdynamo_compiling()``), so while traced LongT5 reads the shape of None."""
    if "'NoneType' object" not in reason:
        return ""
    try:
        signature = inspect.signature(module.forward)
        given = signature.bind_partial(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return ""
    unmade = [n for n, p in signature.parameters.items()
              if n.endswith("attention_mask") and p.default is None and n not in given]
    if not unmade:
        return ""
    return (f" [the model met None where it makes a default outside tracing: a Hugging Face model makes its "
            f"attention_mask only when not compiling; pass {' and '.join(unmade)} as its tokenizer or processor "
            f"gives them]")

"""Checking a scheduled module against the model it was made from: both run on the example
inputs and on fresh ones, each output compared by :mod:`opsched.compare`'s rules, and where one
fails, a message that says whose the difference is."""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence

import torch
import torch.utils._pytree as pytree
from torch import nn

from opsched.compare import UNDECIDED, as_true, largest_difference, reordering, scale, tolerance
from opsched.errors import ExecutionError
from opsched.ir import Graph, Node
from opsched.progress import Progress
from opsched.structure import InputStructure

__all__ = ["placed_inputs", "placed_model", "fresh_inputs", "verify_against", "draws_random", "ordering"]

log = logging.getLogger("opsched")

def placed_inputs(graph: Graph, inputs: Sequence[torch.Tensor], device: torch.device) -> tuple[torch.Tensor, ...]:
    """``inputs`` moved to ``device`` and cast to ``graph``'s input dtypes (after placement)."""
    return tuple(t.to(device, getattr(torch, i.type.dtype)) for i, t in zip(graph.inputs, inputs))


def placed_model(model: nn.Module, device: torch.device, dtype: str | None, moved: bool) -> nn.Module:
    """``model`` placed as a scheduled module of it runs, on ``device`` in ``dtype``: a copy where
    that moves it (``moved``: its inputs had to move), else the model itself."""
    if dtype is None and not moved:
        return model
    return copy.deepcopy(model).to(device, None if dtype is None else getattr(torch, dtype))


def fresh_inputs(inputs: Sequence[torch.Tensor], seed: int = 1, integers: bool = True) -> tuple[torch.Tensor, ...]:
    """Random inputs like ``inputs`` (shapes, dtypes, devices) but not equal to them: floats drawn
    around the examples' mean and spread, integers and booleans within the examples' range (token
    ids stay valid ids), or, without ``integers``, the examples' own integers and booleans; floats
    that hold an infinity or a NaN, an additive mask's, as :func:`_fresh_mask` draws them."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for t in inputs:
        if not integers and not (t.is_complex() or t.is_floating_point()):
            fresh = t
        elif t.is_complex():
            fresh = torch.randn(t.shape, generator=gen, dtype=t.dtype)
        elif t.is_floating_point() and not bool(torch.isfinite(t).all()):
            fresh = _fresh_mask(t.detach().cpu().float(), gen)
        elif t.is_floating_point():
            ref = t.detach().float()
            scale = float(ref.std()) if ref.numel() > 1 else 1.0
            fresh = float(ref.mean()) + (scale or 1.0) * torch.randn(t.shape, generator=gen)
        elif t.dtype == torch.bool:
            fresh = torch.rand(t.shape, generator=gen) < 0.5
        else:
            lo, hi = int(t.min()), int(t.max())
            fresh = torch.randint(lo, hi + 1, t.shape, generator=gen)
        out.append(fresh.to(t.device, t.dtype))
    return tuple(out)


def _fresh_mask(mask: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """An additive mask like ``mask`` (-inf where it masks, as torch.nn's causal mask holds it):
    its infinities and NaNs where they are, the rest drawn within its finite values' range. Its
    mean and spread are NaN, and drawn by them every value was NaN, which the model returned."""
    finite = torch.isfinite(mask)
    lo, hi = (float(mask[finite].min()), float(mask[finite].max())) if bool(finite.any()) else (0.0, 0.0)
    return torch.where(finite, lo + (hi - lo) * torch.rand(mask.shape, generator=gen), mask)


def _why_apart(graph: Graph) -> str:
    """What may set a module's outputs apart from its model's: random numbers drawn in the model
    (no two calls of it agree), else a path its Python control flow took for the example only."""
    drawn = [f"{n.name!r} ({n.attrs['target']})" for n in graph.nodes if draws_random(n)]
    if drawn:
        return (f"the model draws random numbers ({', '.join(drawn[:3])}), so no two of its calls agree: give it "
                f"those numbers as an input where it takes them (ViTMAE's noise=), or pass verify=False")
    return ("the model may take another path on other inputs (its Python control flow was traced for the example "
            "inputs), or this is a bug: please report it with the model")


def _traced_apart(model: nn.Module, call: InputStructure, xs: Sequence[torch.Tensor], leaf: int,
                  expected: torch.Tensor, tol: float, examples: bool, orders: str = "") -> str | None:
    """Whose a difference is, asked of torch.export's own program of ``model`` on the same inputs
    (traced afresh: a failed check is rare, a wrong attribution costly): where the program is as
    far from the model as the module, the difference was traced, not scheduled, and is the
    model's (transformers' PaliGemma builds its attention mask otherwise while traced); where
    the program matches the model, it is opsched's (``orders``: what else it may be, from
    :func:`ordering`). None where there is no program to ask."""
    from opsched.frontends.export_trace import program_outputs

    args, kwargs = call.call([t.clone() for t in xs])
    got = program_outputs(model, args, kwargs)
    if got is None or leaf >= len(got) or not isinstance(got[leaf], torch.Tensor) or \
            got[leaf].shape != expected.shape:
        return None
    off = largest_difference(got[leaf].to(expected.device), expected)
    if off <= tol:
        return (f"torch.export's own program of the model matches it on these inputs ({off:.3g} apart), so the "
                f"difference is opsched's{orders}: please report it with the model")
    if examples:
        return (f"torch.export's own program of the model, run on the same inputs, is {off:.3g} from the model "
                f"too: the model computes otherwise while traced (a branch on torch.compiler.is_compiling() or "
                f"on tracing), so no graph traced of it matches it; report that to the model's authors")
    return (f"torch.export's own program of the model, traced on the example inputs, is {off:.3g} from the model "
            f"on these too: the model takes another path on other inputs (its Python control flow was traced for "
            f"the example inputs)")


#: ATen overloads whose results depend on which of two values comes first: of two that tie
#: within rounding, a plan may pick the other (RT-DETR's queries, by ``topk`` over their scores).
ORDERING = frozenset({"aten::topk.default", "aten::sort.default", "aten::sort.stable", "aten::argsort.default",
                      "aten::argsort.stable", "aten::argmax.default", "aten::argmin.default", "aten::max.dim",
                      "aten::min.dim", "aten::kthvalue.default", "aten::mode.default", "aten::median.dim"})


def _picking(graph: Graph) -> list[Node]:
    """The nodes of ``graph`` that pick values by their order (:data:`ORDERING`)."""
    return [n for n in graph.nodes if n.attrs.get("target") in ORDERING]


def ordering(graph: Graph) -> str:
    """Where ``graph`` picks values by their order (:data:`ORDERING`), what that may make of a
    difference between a plan and its model: values the plan computes within rounding of the
    model's, taken in another order where they tie. On fresh random inputs RT-DETR's plans were
    0.017 off because two pairs of its 300 queries swapped places, every score within 1.2e-6 of
    eager's. "" where it picks none."""
    picks = [f"{n.name!r} ({n.attrs['target']})" for n in _picking(graph)]
    if not picks:
        return ""
    return (f", or it picks values by their order ({', '.join(picks[:2])}{', ...' if len(picks) > 2 else ''}) "
            f"and its plan takes values that tie within rounding in another order (a reordering, not an error: "
            f"compare the outputs as sets, or check on your own inputs)")


def draws_random(node: Node) -> bool:
    """Whether a generic node draws random numbers: its overload may (``rand``, a dropout), and
    its arguments do not switch that off (an attention's ``dropout_p=0``, ``train=False``)."""
    from opsched.ir.ops.aten import arguments, overload

    target = node.attrs.get("target")
    if not (isinstance(target, str) and target.startswith("aten::")
            and torch.Tag.nondeterministic_seeded in (op := overload(target)).tags):
        return False
    given = {**{a.name: a.default_value for a in op._schema.arguments if a.has_default_value()}, **arguments(node)}
    return not (given.get("dropout_p", 1) == 0 or given.get("p", 1) == 0 or given.get("train", True) is False)


def _in_float64(model: nn.Module, call: InputStructure, xs: Sequence[torch.Tensor]) -> list[object] | None:
    """What ``model`` returns, run in float64 on ``xs`` (its floating-point tensors widened), as
    leaves: the truth float32 or float16 results are held against; None where the model cannot
    run so (an op without a float64 kernel, a dtype fixed inside the model, the memory of a
    float64 copy)."""
    try:
        wide = copy.deepcopy(model).double()
        args, kwargs = call.call([t.double() if t.is_floating_point() else t.clone() for t in xs])
        with torch.no_grad():
            return [t.detach() if isinstance(t, torch.Tensor) else t for t in pytree.tree_leaves(wide(*args, **kwargs))]
    except Exception as e:  # noqa: BLE001 (whatever the model raises in float64: then no arbiter)
        log.debug("the model does not run in float64 (%s: %s)", type(e).__name__, str(e).splitlines()[0][:200])
        return None


def _kind(value: object) -> str:
    """A value as a check's message names it: a tensor by its shape, anything else by its type."""
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    return "None" if value is None else f"a {type(value).__name__}"


def _tied(graph: Graph, compared: Sequence[tuple[str, torch.Tensor, torch.Tensor, int | None]],
          tolerances: Sequence[float], which: str) -> bool:
    """Whether the module's outputs ``compared`` (what each is, the module's, the model's), each
    within its ``tolerances``, are the model's with values that tie taken in another order
    (:func:`opsched.compare.reordering`), where ``graph`` picks values by their order; said in a
    warning where they are."""
    picking = _picking(graph)
    tied = reordering([(a, e, tol) for (_, a, e, _), tol in zip(compared, tolerances, strict=True)]) \
        if picking else None
    if tied is not None:
        log.warning("on %s, the scheduled module's %s are the model's with %s: the model picks values by their order "
                    "(%s), and its plan took values that tie within rounding in another order", which,
                    ", ".join(compared[k][0] for k in tied.outputs), tied.describe(),
                    ", ".join(f"{n.name!r}" for n in picking[:3]))
    return tied is not None


def _passed_against_float64(which: str, what: str, err: float, tol: float, expected: torch.Tensor,
                            truth: torch.Tensor, arbiter: str) -> None:
    """Say that an output beyond the tolerance passed as near the float64 ``truth`` as the
    model's own: a warning where the model's is :data:`UNDECIDED` of its scale from it or more,
    float32 keeping nothing of it to check by."""
    own, size = largest_difference(expected, truth), scale(expected)
    if own >= UNDECIDED * size:
        log.warning("on %s, the model's own %s is %.3g from its float64 output, of a scale of %.3g: it keeps nothing "
                    "in %s to check the module by (%.3g from the model's), which passes as near float64 as the model",
                    which, what, own, size, str(expected.dtype).removeprefix("torch."), err)
    else:
        log.info("on %s, the scheduled module's %s is %.3g from the model's, beyond the tolerance %.3g, and as near "
                 "the model's float64 output as the model%s", which, what, err, tol, arbiter)


def verify_against(module: nn.Module, graph: Graph, device: torch.device, model: nn.Module, call: InputStructure,
                   inputs: tuple[torch.Tensor, ...], progress: Progress | None = None,
                   dtype: str | None = None) -> None:
    """Raise :class:`ExecutionError` unless ``module`` (running ``graph``, placed on ``device`` in
    ``dtype``) returns what ``model`` returns, placed alike, leaf by leaf within :func:`tolerance`,
    both called as ``call`` on ``inputs`` and on fresh random inputs (a module that replayed a
    value recorded at import would pass the first), or, where the model refuses fresh integers
    (a text-and-image model's token ids place its image's features), on fresh floats beside the
    integers given. An output further apart than that is held
    against the model run in float64, and passes where it is as near that as the model's own
    (within twice the model's error): Inception-v4 with trained-looking batch norms is 4.7e-4
    from its float64 output in float32, and a plan with its batch norms folded 5.1e-4, while the
    two are 6.5e-4 apart, beyond float32's 1e-4 of the scale of 1.1."""
    placed = placed_inputs(graph, inputs, device)
    model = placed_model(model, device, dtype, any(p.device != t.device for p, t in zip(placed, inputs)))
    cases = [("the example inputs", placed), ("fresh random inputs", fresh_inputs(placed))]
    computed_in = {t.dtype for t in graph.types.values()}
    for k, (which, xs) in enumerate(cases):  # grows by one where the model refuses fresh integers
        # each side gets copies: a model may change its inputs, and the caller's must stay as they were
        theirs, mine = [t.clone() for t in xs], [t.clone() for t in xs]
        with torch.no_grad():
            args, kwargs = call.call(theirs)
            try:
                returned = model(*args, **kwargs)
            except Exception as refusal:  # noqa: BLE001 (whatever the model raises)
                if k == 0:
                    raise
                # random offsets or lengths (an EmbeddingBag's) need not be valid ones, nor token ids that
                # leave no place for an image's features: fresh floats beside the integers given, else nothing
                why = str(refusal).strip()
                floats = [t.is_floating_point() or t.is_complex() for t in placed]
                again = k == 1 and any(floats) and not all(floats)
                if again:
                    cases.append(("fresh random floats, its integers and booleans as given",
                                  fresh_inputs(placed, integers=False)))
                log.warning("the model refuses %s (%s: %s); the module is checked on the example inputs%s",
                            which, type(refusal).__name__, why.splitlines()[0][:200] if why else "",
                            ", and on fresh floats beside its integers as given" if again else " only")
                continue
            expected = [e.detach() if isinstance(e, torch.Tensor) else e  # a returned weight requires grad
                        for e in pytree.tree_leaves(returned)]
            args, kwargs = call.call(mine)
            actual = pytree.tree_leaves(module(*args, **kwargs))
        if progress is not None:
            progress(k + 1, len(cases), which)
        if len(actual) != len(expected):
            raise ExecutionError(f"the scheduled module returns {len(actual)} outputs on {which}, the model "
                                 f"{len(expected)}; please report this with the model")
        written = {i.name: k for k, i in enumerate(graph.inputs) if i.name in graph.writes or not
                   torch.equal(theirs[k], xs[k])}  # what the model wrote, and what the module should have
        for i, (a, e) in enumerate(zip(actual, expected)):
            if isinstance(e, torch.Tensor) != isinstance(a, torch.Tensor):
                raise ExecutionError(f"on {which}, the scheduled module's output {i} is {_kind(a)} where the "
                                     f"model's is {_kind(e)}: its outputs nest otherwise; please report this with "
                                     f"the model")
        compared: list[tuple[str, torch.Tensor, torch.Tensor, int | None]] = [
            (f"output {i}", a, e, i) for i, (a, e) in enumerate(zip(actual, expected)) if isinstance(e, torch.Tensor)]
        compared += [(f"input {name!r} after the call", mine[k], theirs[k], None) for name, k in written.items()]
        tolerances = [tolerance(e, computed_in) for _, _, e, _ in compared]
        if _tied(graph, compared, tolerances, which):
            continue
        truth: list[object] | None = None  # the model in float64, run at the first output that needs it
        for (what, a, e, leaf), tol in zip(compared, tolerances, strict=True):
            err = largest_difference(a, e) if a.shape == e.shape else 0.0
            if a.shape != e.shape or a.dtype != e.dtype or err > tol:
                arbiter = ""
                if a.shape == e.shape and a.dtype == e.dtype and leaf is not None and e.is_floating_point() \
                        and e.dtype != torch.float64 and not any(map(draws_random, graph.nodes)):  # a draw: no arbiter
                    truth = truth if truth is not None else _in_float64(model, call, xs) or []
                    fine, arbiter = as_true(a, e, truth[leaf] if leaf < len(truth) else None, tol)
                    if fine:
                        _passed_against_float64(which, what, err, tol, e, truth[leaf], arbiter)  # type: ignore[arg-type]
                        continue
                traced = None if leaf is None or any(map(draws_random, graph.nodes)) else \
                    _traced_apart(model, call, xs, leaf, e, tol, k == 0, ordering(graph))
                raise ExecutionError(f"on {which}, the scheduled module's {what} differs from the model's "
                                     f"(shape {tuple(a.shape)} against {tuple(e.shape)}, dtype "
                                     f"{str(a.dtype).removeprefix('torch.')} against "
                                     f"{str(e.dtype).removeprefix('torch.')}, largest difference {err:.3g}, "
                                     f"tolerance {tol:.3g}{arbiter}): {traced or _why_apart(graph)}")

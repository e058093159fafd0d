"""Helpers for tests of opsched and of code built on it: tolerances and small random graphs."""

from __future__ import annotations

import copy
import random
from collections.abc import Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from opsched.compare import TF32_TOLERANCE, TOLERANCES, as_true, largest_difference, tf32_in_use, tolerance
from opsched.ir import Graph, GraphBuilder
from opsched.runtime.stream_program import Launch, Op, Record, Release, StreamProgram, Wait

__all__ = ["TOLERANCES", "TF32_TOLERANCE", "tf32_in_use", "tolerance", "assert_close", "assert_as_true_as_eager",
           "mismatch",
           "check_stream_program", "fork_join", "random_dag", "tensors"]

def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors of an output, however nested (tuples, dicts, a Hugging Face ``ModelOutput``)."""
    return [t.detach() for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]


def mismatch(actual: Any, expected: Any, what: str = "output") -> str:
    """How ``actual`` differs from ``expected``, a tensor or tensors nested in any way, compared
    in order (count, a shape, or ``max|a - e| > tolerance(e)``, a NaN included), or ``""`` where
    it does not."""
    acts, exps = tensors(actual), tensors(expected)
    if len(acts) != len(exps):
        return f"{what}: {len(acts)} tensors, expected {len(exps)}"
    for i, (a, e) in enumerate(zip(acts, exps)):
        if a.shape != e.shape:
            return f"{what}[{i}]: shape {tuple(a.shape)}, expected {tuple(e.shape)}"
        tol = tolerance(e)
        err = largest_difference(a, e)
        if not err <= tol:
            return f"{what}[{i}]: max abs error {err:.3g} exceeds {tol:.3g}"
    return ""


def assert_close(actual: Any, expected: Any, what: str = "output", *, model: torch.nn.Module | None = None,
                 inputs: Sequence[Any] = ()) -> None:
    """Assert equal shapes and ``max|a - e| <= tolerance(e)`` for each pair (:func:`mismatch`);
    or, given the ``model`` and ``inputs`` that made ``expected``, where they differ by more,
    that ``actual`` is as near the model's float64 outputs as ``expected`` is
    (:func:`assert_as_true_as_eager`)."""
    why = mismatch(actual, expected, what)
    if why and model is not None:
        with torch.no_grad():
            truth = copy.deepcopy(model).double()(*(t.double() if _floating(t) else t for t in inputs))
        assert_as_true_as_eager(actual, expected, truth, what)
        return
    assert not why, why


def assert_as_true_as_eager(got: Any, expected: Any, truth: Any, what: str = "output") -> None:
    """Each output of ``got`` is as near the float64 ``truth`` as eager's own (``expected``, in
    ``got``'s precision) is: within twice eager's error, or the precision's tolerance of the
    output's scale. A model with trained-looking batch norms amplifies rounding (Inception-v4's
    eager float32 output is 4.7e-4 from float64's, of a scale of 1.1; the corpus's HGNetV2's
    3.9e-4, of 3.5), so differences from eager alone of that size would say nothing; an error
    of a plan shows as one far beyond eager's."""
    leaves = [[t.cpu() for t in tensors(v)] for v in (got, expected, truth)]
    assert len({len(v) for v in leaves}) == 1, f"{what}: {[len(v) for v in leaves]} outputs"
    for i, (g, e, t) in enumerate(zip(*leaves, strict=True)):
        assert g.shape == e.shape, f"{what}[{i}]: shape {tuple(g.shape)}, expected {tuple(e.shape)}"
        fine, found = as_true(g, e, t, tolerance(e))
        assert fine, f"{what}[{i}]: {largest_difference(g, e):.3g} from eager's output{found}"


def _floating(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_floating_point()


def random_dag(n: int, seed: int, *, edge_prob: float = 0.35, channels: int = 4, size: int = 8) -> Graph:
    """A random connected DAG of ``n`` small convolutions and sums over one input.

    Node i reads a random subset of earlier nodes (or the input); several readers are summed
    first. Every node has the same shape, so any wiring is valid and every node is a conv2d
    (possibly preceded by an add), which makes the graph executable as well as schedulable.
    """
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    b = GraphBuilder(f"dag{n}_{seed}")
    x = b.input("x", (1, channels, size, size))
    outs: list[str] = []
    for i in range(n):
        preds = [o for o in outs if rng.random() < edge_prob]
        preds = preds or [rng.choice(outs) if outs and rng.random() < 0.7 else x]
        src = preds[0] if len(preds) == 1 else b.add("add", preds, name=f"sum{i}")
        k = rng.choice((1, 3))
        w = b.param(f"w{i}", torch.randn(channels, channels, k, k, generator=gen) * (1.0 / (channels * k * k)) ** 0.5)
        outs.append(b.add("conv2d", [src], name=f"n{i}", params=[w], padding=k // 2, act="relu"))
    used = {v for node in b.nodes for v in node.inputs}
    sinks = [o for o in outs if o not in used]
    out = sinks[0] if len(sinks) == 1 else b.add("add", sinks, name="out")
    return b.build([out]).verify()


def fork_join(c_reads: str = "x") -> Graph:
    """1x1 convolutions on (1, 4, 8, 8): x -> a -> b; c reads ``c_reads`` ("x" or "a"); d = b + c."""
    b = GraphBuilder(f"fork_join_{c_reads}")
    x = b.input("x", (1, 4, 8, 8))
    w = b.param("w", torch.randn(4, 4, 1, 1))
    a = b.add("conv2d", [x], name="a", params=[w])
    bb = b.add("conv2d", [a], name="b", params=[w])
    c = b.add("conv2d", [{"x": x, "a": a}[c_reads]], name="c", params=[w])
    return b.build([b.add("add", [bb, c], name="d")])


def check_stream_program(program: StreamProgram) -> None:
    """Assert that ``program`` runs its plan correctly on any stream-ordered device.

    Happens-before is built only from what such a device guarantees: order on one stream, and a
    wait ordered after the latest record of its event *enqueued before it* (a wait on an event
    not yet recorded orders nothing). Then: every step is launched exactly once, after the steps
    that produce what it reads and the steps its plan says it waits for; a slot is released only
    after its readers were enqueued, and each of them happens before the next work on the stream
    that produced the slot (the only stream that can reuse its memory); and every stream's work
    happens before the end of stream 0 (the caller sees finished results).
    """
    hb = _HappensBefore(program.ops)
    launch_of = _check_launches(program, hb)
    _check_releases(program, hb, launch_of)
    end = hb.last_on.get(0)
    for i, k in enumerate(hb.stream_ops):
        assert end is not None and hb.before[end] >> i & 1, f"op {k} ({program.ops[k]}) is not joined into stream 0"


class _HappensBefore:
    """Happens-before among the stream operations of a program (Releases run on the host):
    ``before[i]`` has bit j set where stream op j happens before (or is) stream op i."""

    def __init__(self, ops: tuple[Op, ...]) -> None:
        self.stream_ops = [k for k, op in enumerate(ops) if not isinstance(op, Release)]
        self.pos = {k: i for i, k in enumerate(self.stream_ops)}
        self.before = [0] * len(self.stream_ops)
        self.last_on: dict[int, int] = {}
        last_record: dict[int, int] = {}
        for k in self.stream_ops:
            op, i = ops[k], self.pos[k]
            bits = 1 << i
            if _stream(op) in self.last_on:
                bits |= self.before[self.last_on[_stream(op)]]
            if isinstance(op, Wait):
                assert op.event in last_record, f"op {k}: wait on event {op.event} before any record of it"
                bits |= self.before[last_record[op.event]]
            if isinstance(op, Record):
                last_record[op.event] = i
            self.before[i] = bits
            self.last_on[_stream(op)] = i


def _check_launches(program: StreamProgram, hb: _HappensBefore) -> dict[int, int]:
    """Every step launched once, after what it reads and waits for; per step, its stream op."""
    plan = program.plan
    launch_of: dict[int, int] = {}
    for k, op in enumerate(program.ops):
        if isinstance(op, Launch):
            assert op.step not in launch_of, f"step {plan.steps[op.step].label} launched twice"
            launch_of[op.step] = hb.pos[k]
    assert set(launch_of) == set(range(len(plan.steps))), "some steps are never launched"
    producer = {o: s for s, step in enumerate(plan.steps) for o in step.outputs}
    for s, step in enumerate(plan.steps):
        here = hb.before[launch_of[s]]
        for p in {producer[i] for i in step.inputs if i in producer} | set(step.waits):
            assert here >> launch_of[p] & 1, (f"step {step.label} may run before {plan.steps[p].label}, "
                                               f"which it reads or waits for")
    return launch_of


def _check_releases(program: StreamProgram, hb: _HappensBefore, launch_of: dict[int, int]) -> None:
    """A slot released once, after its readers were enqueued, each of them ordered before the next
    work on the stream that made it (the only stream that can reuse its memory)."""
    plan, ops = program.plan, program.ops
    producer = {o: s for s, step in enumerate(plan.steps) for o in step.outputs}
    readers: dict[int, list[int]] = {}
    for s, step in enumerate(plan.steps):
        for i in step.inputs:
            readers.setdefault(i, []).append(s)
    released: set[int] = set()
    for k, op in enumerate(ops):
        if not isinstance(op, Release):
            continue
        for slot in op.slots:
            assert slot not in released, f"slot {plan.slot_names[slot]} released twice"
            released.add(slot)
            if slot not in producer:
                continue  # a graph input: the caller owns its memory
            home = _stream(ops[hb.stream_ops[launch_of[producer[slot]]]])
            nxt = next((hb.pos[j] for j in hb.stream_ops if j > k and _stream(ops[j]) == home), None)
            for r in readers.get(slot, ()):
                at = hb.stream_ops[launch_of[r]]
                assert at < k, f"slot {plan.slot_names[slot]} released before its reader {plan.steps[r].label}"
                if _stream(ops[at]) != home and nxt is not None:
                    assert hb.before[nxt] >> launch_of[r] & 1, (
                        f"slot {plan.slot_names[slot]} (made on stream {home}) is released while "
                        f"{plan.steps[r].label} on stream {_stream(ops[at])} may still read it")


def _stream(op: Op) -> int:
    assert not isinstance(op, Release), "a release runs on the host, on no stream"
    return op.stream

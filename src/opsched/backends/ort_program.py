"""How a plan becomes ONNX Runtime sessions: the :class:`~opsched.backends.lanes.Program` the ORT
backend's executor runs (:mod:`.ort`).

Each lane segment of exportable steps is exported (:mod:`.ort_export`) and loaded as one session
with its share of the cores as intra-op threads; steps that cannot be exported run with torch
between sessions. Values travel as NumPy arrays (zero-copy to and from torch). A join of batch
slices across lanes is made in place, and a plan that is one session is called directly.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from opsched._text import first_line
from opsched.backends.affinity import worker_affinities
from opsched.backends.lanes import Item, Program, step_category
from opsched.backends.ort_export import export_segment, exportable
from opsched.backends.segments import Segment, SegmentBuilder
from opsched.errors import ExecutionError
from opsched.ir import Graph
from opsched.ir.ops.fourier import as_pairs, from_pairs
from opsched.ir.ops.onnx_session import OnnxModel, inference_session
from opsched.ir.types import COMPLEX_PARTS
from opsched.runtime import Plan
from opsched.runtime.kernels import step_kernel
from opsched.runtime.plan import Step

__all__ = ["JOIN_IN_PLACE", "ort_program", "ort_session", "shared_arena"]

log = logging.getLogger(__name__)


def ort_session(model: OnnxModel, threads: int, profile_prefix: str | None = None, spin: bool = False) -> Any:
    """A session of ``model`` on ``threads`` intra-op threads, handed its weights from memory
    (:func:`~opsched.ir.ops.onnx_session.inference_session`)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    if profile_prefix is not None:
        so.enable_profiling = True
        so.profile_file_prefix = profile_prefix
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    # idle ORT threads spin only where told (see ort_program): other lanes and sessions need the cores;
    # and only within a run: what runs between calls (the caller's torch code) needs them too
    so.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin else "0")
    so.add_session_config_entry("session.force_spinning_stop", "1")
    # a plan's one session (the one that spins) runs alone: its workers woken at every call, each pinned to a
    # core of its own, so that none waits on the caller's (:mod:`opsched.backends.affinity`)
    if spin and (pinned := worker_affinities(threads)) is not None:
        so.add_session_config_entry("session.intra_op_thread_affinities", pinned)
    # one arena for every session (shared_arena), not one each: an arena keeps the most memory
    # it ever held, and a torch.compile'd model holds a plan per graph and shape, a session per
    # segment; none at all maps a call's large temporaries afresh each time (ort_arena.py)
    so.add_session_config_entry("session.use_env_allocators", "1" if shared_arena() else "0")
    so.log_severity_level = 3
    return inference_session(model, so)


@functools.cache
def shared_arena() -> bool:
    """Register, once a process, the CPU arena allocator that opsched's sessions share in ONNX
    Runtime's environment; False where it cannot be (another allocator for the CPU already
    registered there, by another library: each session keeps an arena of its own then).

    An arena keeps the most memory it ever held for as long as it lives. One per session added
    up: Mistral3 at 1120 x 1120 through ``torch.compile(backend="opsched")``, 16 graphs, peaked
    at 3.6 GB with an arena each, 2.9 GB with one shared, 2.3 GB with none (7.3, 4.9 and 3.0 GB
    before its attention's scores went unheld, :mod:`opsched.ir.ops.attention`); but without an
    arena a call whose temporaries are large maps fresh memory each time (an unfused attention of
    512 tokens: 1.5x the time), and the shared one ran as fast as an arena each
    (``benchmarks/ort_arena.py``)."""
    import onnxruntime as ort

    info = ort.OrtMemoryInfo("Cpu", ort.OrtAllocatorType.ORT_ARENA_ALLOCATOR, 0, ort.OrtMemType.DEFAULT)
    try:
        ort.create_and_register_allocator(info, ort.OrtArenaCfg(0, -1, -1, -1))  # ORT's default arena settings
    except Exception as e:  # noqa: BLE001 (ORT raises its own failure type for a second CPU allocator)
        log.info("ONNX Runtime's environment holds a CPU allocator already (%s): each session keeps its own arena",
                 first_line(e))
        return False
    return True


def _to_numpy(v: Any) -> np.ndarray:
    """``v`` as an array sharing its memory; a lazily conjugated or negated view (``z.conj()``)
    is made real first, as NumPy has no such views (and a tensor that requires grad detached: the
    three checks cost a call less than making them)."""
    if isinstance(v, torch.Tensor) and (v.requires_grad or v.is_conj() or v.is_neg()):
        v = v.detach().resolve_conj().resolve_neg()
    return v.numpy() if isinstance(v, torch.Tensor) else v


def _to_torch(v: Any) -> torch.Tensor:
    return torch.from_numpy(np.asarray(v))


#: The op of a join whose parts were written in place (an item with nothing left to compute).
JOIN_IN_PLACE = "join in place"


@dataclass(frozen=True)
class _Edges:
    """A segment's session and what crosses its edges: the slots it reads and makes (and their
    value names, its inputs' and outputs'), and those freed after it."""

    session: Any
    ins: tuple[int, ...]
    outs: tuple[int, ...]
    frees: tuple[int, ...]
    in_names: list[str]
    out_names: list[str]


def _runs(e: _Edges) -> Callable[[list[Any]], None]:
    """A session reading and making NumPy arrays in the slots."""
    def run(slots: list[Any]) -> None:
        feeds = {n: np.asarray(slots[i], order="C") for n, i in zip(e.in_names, e.ins)}
        for slot, value in zip(e.outs, e.session.run(e.out_names, feeds)):
            slots[slot] = value
        for f in e.frees:
            slots[f] = None
    return run


@dataclass(frozen=True)
class _Join:
    """A join of batch slices (a ``concat`` along axis 0): its slot, its whole value's shape and
    dtype, and per part, the slot and the samples it fills."""

    slot: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    parts: tuple[tuple[int, int, int], ...]


class _OrtSegments(SegmentBuilder):
    """Each segment of exportable steps one ORT session; the other steps torch items between them,
    values held as NumPy arrays.

    A join of batch slices across lanes (the instances of a split sub-graph joined again) costs no
    copy: the first session to make one of its parts allocates the whole value, and every session
    making a part writes it, through ONNX Runtime's I/O binding, straight into its samples of that
    value (a contiguous view); the join itself then only checks that each part is in place
    (copying a part that a torch step made)."""

    encode = staticmethod(_to_numpy)
    decode = staticmethod(_to_torch)

    def __init__(self, graph: Graph, plan: Plan, cores: int, profile_dir: str | None, spin: bool) -> None:
        super().__init__(graph, plan, cores)
        self.profile_dir = profile_dir
        self.exportable = [all(exportable(graph, graph.node(v)) for v in step.nodes) for step in plan.steps]
        lanes = [lane for phase in plan.phases for lane in phase.lanes]
        # a plan that is one session lets its threads spin, as ORT's own sessions do
        self.spin = spin and len(lanes) == 1 and all(self.exportable[s] for s in lanes[0])
        # (a join waits for another lane, so a plan of one lane has none: it stays one session)
        self.joins = {s: join for s, step in enumerate(plan.steps) if (join := self._join(step)) is not None}
        self.part_of: dict[int, tuple[_Join, int, int]] = {}  # a part's slot -> its join and samples
        for join in self.joins.values():
            for slot, a, b in join.parts:
                self.part_of.setdefault(slot, (join, a, b))
        self.lock = threading.Lock()
        self.io: list[tuple[Any, list[str], tuple[int, ...], list[str], tuple[int, ...]]] = []  # per segment

    def build(self) -> Program:
        program = super().build()
        return dataclasses.replace(program, direct=self._direct(program))

    def _direct(self, program: Program) -> Callable[[Sequence[torch.Tensor]], list[torch.Tensor]] | None:
        """A plan that is one session reading the graph's inputs and making its outputs, as one
        call: the feeds keyed by name, the outputs wrapped, none of the slots (through them, a
        call of a corpus model of 0.1 ms took 1.07x as long in geomean: ``benchmarks/call_overhead.py``)."""
        if program.n_items != 1 or len(self.io) != 1 or self.joins:
            return None
        session, in_names, ins, out_names, outs = self.io[0]
        if not set(ins) <= set(program.input_slots) or not set(program.output_slots) <= set(outs) \
                or self._paired([*in_names, *out_names]):
            return None
        feeds = [(name, program.input_slots.index(slot)) for name, slot in zip(in_names, ins)]
        picks = [outs.index(slot) for slot in program.output_slots]
        item = next(it for phase in program.phases for lane in phase for it in lane)

        def direct(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
            try:
                made = session.run(out_names, {name: np.asarray(_to_numpy(inputs[k]), order="C") for name, k in feeds})
            except Exception as e:
                raise ExecutionError(f"node {item.label!r} ({item.op}) failed: {type(e).__name__}: {e}") from e
            return [torch.from_numpy(made[j]) for j in picks]
        return direct

    def _paired(self, names: Sequence[str]) -> frozenset[str]:
        """Those of ``names`` that are complex: a session takes and makes them as pairs of parts."""
        return frozenset(n for n in names if self.graph.types[n].dtype in COMPLEX_PARTS)

    def _join(self, step: Step) -> _Join | None:
        """``step`` as a join made in place: a concat along the batch that waits for another lane
        (so its parts end segments anyway; a join whose parts all came before it on its own lane
        stays in its session, where ORT concatenates in its blocked layout without converting)."""
        node = self.graph.node(step.nodes[0])
        if step.merged or node.op != "concat" or node.attr("axis", 1) != 0 or not step.waits \
                or len(set(step.inputs)) < len(step.inputs) or node.out.dtype in COMPLEX_PARTS \
                or any(self.graph.types[v].dtype != node.out.dtype for v in node.inputs):  # promoted parts
            return None
        parts, at = [], 0
        for slot in step.inputs:
            n = self.graph.types[self.plan.slot_names[slot]].shape[0]
            parts.append((slot, at, at + n))
            at += n
        return _Join(step.outputs[0], node.out.shape, np.dtype(node.out.dtype), tuple(parts))

    def fits(self, s: int) -> bool:
        return self.exportable[s] and s not in self.joins

    def _target(self, slots: list[Any], slot: int) -> np.ndarray | None:
        """Where a session writes ``slot``: its samples of the join it is part of, or ``None``."""
        if slot not in self.part_of:
            return None
        join, a, b = self.part_of[slot]
        with self.lock:  # lanes may make parts of one join at once: one allocates
            whole: np.ndarray = slots[join.slot]
            if whole is None:
                whole = slots[join.slot] = np.empty(join.shape, join.dtype)
        return whole[a:b]

    def step_item(self, s: int) -> Item:
        if s in self.joins:
            return self._join_item(s)
        step = self.plan.steps[s]
        kernel, ins, outs, frees = step_kernel(self.graph, step), step.inputs, step.outputs, step.frees

        def run(slots: list[Any]) -> None:
            result = kernel(*[_to_torch(slots[i]) for i in ins])
            values = (result,) if len(outs) == 1 else result
            for slot, value in zip(outs, values):
                slots[slot] = _to_numpy(value)
            for f in frees:
                slots[f] = None
        return Item(len(self.items), step.label, step.op, run, (), step_category(step))

    def segment_item(self, segment: Segment, threads: int) -> tuple[Item, Any]:
        steps, names = self.plan.steps, self.plan.slot_names
        ins, outs = segment.inputs, segment.outputs
        model = export_segment(self.graph, [steps[s].nodes for s in segment.steps], [names[i] for i in ins],
                               [names[o] for o in outs])
        prefix = None if self.profile_dir is None else os.path.join(self.profile_dir, f"segment{len(self.items)}")
        session = ort_session(model, threads, prefix, self.spin)
        edges = _Edges(session, ins, outs, segment.frees, [names[i] for i in ins], [names[o] for o in outs])
        if any(o in self.part_of for o in outs):
            run = self._runs_into_joins(edges)
        elif self._paired([*edges.in_names, *edges.out_names]):
            run = self._runs_on_pairs(edges)
        else:
            run = _runs(edges)
        self.io.append((session, edges.in_names, ins, edges.out_names, outs))
        return (Item(len(self.items), segment.label, f"onnxruntime[{len(segment.steps)} steps]", run, (), "segment"),
                session)

    def _runs_on_pairs(self, e: _Edges) -> Callable[[list[Any]], None]:
        """A session some of whose inputs or outputs are complex: they cross its edge as pairs."""
        paired_in, paired_out = self._paired(e.in_names), self._paired(e.out_names)

        def run(slots: list[Any]) -> None:
            feeds = {n: as_pairs(slots[i]) if n in paired_in else np.asarray(slots[i], order="C")
                     for n, i in zip(e.in_names, e.ins)}
            for slot, name, value in zip(e.outs, e.out_names, e.session.run(e.out_names, feeds)):
                slots[slot] = from_pairs(value) if name in paired_out else value
            for f in e.frees:
                slots[f] = None
        return run

    def _runs_into_joins(self, e: _Edges) -> Callable[[list[Any]], None]:
        """A session making parts of joins: it writes them into their places (I/O binding)."""
        def run(slots: list[Any]) -> None:
            binding = e.session.io_binding()
            for n, i in zip(e.in_names, e.ins):
                binding.bind_cpu_input(n, np.asarray(slots[i], order="C"))
            targets = [self._target(slots, o) for o in e.outs]
            for n, target in zip(e.out_names, targets):
                if target is None:
                    binding.bind_output(n, "cpu")
                else:
                    binding.bind_output(n, "cpu", 0, target.dtype, target.shape, target.ctypes.data)
            e.session.run_with_iobinding(binding)
            made = binding.get_outputs()
            for slot, target, value in zip(e.outs, targets, made):
                slots[slot] = value.numpy() if target is None else target
            for f in e.frees:
                slots[f] = None
        return run

    def _join_item(self, s: int) -> Item:
        step, join = self.plan.steps[s], self.joins[s]
        frees = step.frees

        def run(slots: list[Any]) -> None:
            whole: np.ndarray = slots[join.slot]
            if whole is None:  # no session made a part of it
                whole = slots[join.slot] = np.empty(join.shape, join.dtype)
            for slot, a, b in join.parts:
                part, place = slots[slot], whole[a:b]
                if not (isinstance(part, np.ndarray) and part.base is whole and part.ctypes.data == place.ctypes.data):
                    place[...] = part  # made elsewhere (a torch step, another join's part, an input)
            for f in frees:
                slots[f] = None
        return Item(len(self.items), step.label, JOIN_IN_PLACE, run, (), "data")


def ort_program(graph: Graph, plan: Plan, cores: int, profile_dir: str | None = None, spin: bool = False) -> Program:
    """Segments of ``plan`` as ORT sessions; with ``profile_dir``, sessions that profile
    themselves there (read them from ``Program.sessions`` with
    :func:`~opsched.backends.ort_profile.kernel_times`).

    With ``spin``, a plan that is one ORT session (one lane, every step exportable) lets that
    session's idle intra-op threads spin between kernels, ONNX Runtime's default, instead of
    sleeping and being woken for every kernel: on two cores its sequential plans of the zoo ran
    1.05x (Inception V3) to 1.7x (RandWire-small) faster, timed in blocks. The threads stop
    spinning when a run returns (ORT's ``session.force_spinning_stop``): left spinning, they
    kept a core busy for tens of milliseconds after it, and a decoding loop whose torch code
    runs between the module's calls (Hugging Face ``generate()`` through the ``torch.compile``
    backend, a 2-layer GPT-2 on two cores) took 6-8x as long as with the stop, which costs
    calls made back to back 1.00-1.02x (``benchmarks/dynamic_shapes.py``). Plans of several
    sessions or lanes never spin (they would take the cores their other sessions need); nor do
    stages being measured."""
    return _OrtSegments(graph, plan, cores, profile_dir, spin).build()

"""The CPU executor: lanes on persistent worker threads, intra-op threads shared among them.

torch's intra-op thread count is process-wide (``torch.set_num_threads`` from any thread
changes it for all), so the coordinating thread sets it at each phase boundary: a phase of k
lanes runs each lane with ``cores // k`` threads, a phase of one lane gets every core. The
caller's thread runs the first lane itself; the others go to a pool of persistent workers. Each
call has its own slots and events, so several threads may call one executor at once (they then
share the cores, and the thread count follows whichever phase started last: still correct).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from opsched.errors import ExecutionError, OpschedError
from opsched.runtime.plan import Plan, Step

__all__ = ["CpuExecutor"]


class _Run:
    """Per-call state: value slots, and per-step events for plans whose lanes wait on each other."""

    def __init__(self, plan: Plan, evented: bool) -> None:
        self.slots: list[torch.Tensor | None] = [None] * len(plan.slot_names)
        self.done = [threading.Event() for _ in plan.steps] if evented else None
        self.failed = False


class CpuExecutor:
    def __init__(self, plan: Plan, cores: int | None = None) -> None:
        self.plan = plan
        self.cores = cores or torch.get_num_threads()
        self._evented = any(step.waits for step in plan.steps)
        workers = plan.max_lanes - 1
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="opsched-lane") if workers else None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False)

    def __call__(self, inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        plan = self.plan
        run = _Run(plan, self._evented)
        for slot, t in zip(plan.input_slots, inputs):
            run.slots[slot] = t
        for phase in plan.phases:
            lanes = phase.lanes
            if len(lanes) == 1:
                self._lane(lanes[0], run)
            else:
                assert self._pool is not None
                torch.set_num_threads(max(1, self.cores // len(lanes)))
                try:
                    futures = [self._pool.submit(self._lane, lane, run) for lane in lanes[1:]]
                    error: BaseException | None = None
                    try:
                        self._lane(lanes[0], run)
                    except BaseException as e:  # keep it until the other lanes have stopped
                        error = e
                    for f in futures:
                        try:
                            f.result()
                        except BaseException as e:
                            error = error or e
                    if error is not None:
                        raise error
                finally:
                    torch.set_num_threads(self.cores)
            for slot in phase.frees:
                run.slots[slot] = None
        return [run.slots[s] for s in plan.output_slots]  # type: ignore[misc]

    def _lane(self, lane: Sequence[int], run: _Run) -> None:
        steps, slots = self.plan.steps, run.slots
        with torch.no_grad():  # grad mode is per thread: every lane sets it
            for s in lane:
                step = steps[s]
                if step.waits:
                    assert run.done is not None
                    for w in step.waits:
                        run.done[w].wait()
                    if run.failed:
                        return
                try:
                    out = step.kernel(*(slots[i] for i in step.inputs))
                except BaseException as e:
                    self._fail(run)
                    raise _wrap(step, e) from e
                if len(step.outputs) == 1:
                    slots[step.outputs[0]] = out
                else:
                    for slot, value in zip(step.outputs, out):
                        slots[slot] = value
                if run.done is not None:
                    run.done[s].set()

    @staticmethod
    def _fail(run: _Run) -> None:
        run.failed = True
        if run.done is not None:  # wake every lane waiting on an event that will never come
            for event in run.done:
                event.set()


def _wrap(step: Step, e: BaseException) -> BaseException:
    if isinstance(e, (OpschedError, KeyboardInterrupt)):
        return e
    return ExecutionError(f"node {step.label!r} ({step.op}) failed: {type(e).__name__}: {e}")

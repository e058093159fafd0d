"""The Inductor backend: lane segments compiled by TorchInductor equal the reference, cut where
lanes meet, on plans of concurrent lanes with cross-lane waits and on a zoo model end to end."""

from __future__ import annotations

import pytest
import torch

import opsched
from opsched.backends import get_backend
from opsched.backends.inductor import InductorExecutor
from opsched.cost import AnalyticCostModel
from opsched.execution import RunOptions
from opsched.models import example_inputs, get_model
from opsched.runtime import lower
from opsched.schedulers import schedule
from opsched.testing import assert_close, random_dag

pytestmark = pytest.mark.skipif(get_backend("inductor").unavailable() is not None,
                                reason=str(get_backend("inductor").unavailable()))


def _segments_expected(plan: opsched.runtime.Plan) -> int:
    """Per lane of each phase: one segment, plus one more after each step another lane waits for
    (unless it ends the lane) and before each step that waits (unless it starts the lane)."""
    waited = {w for step in plan.steps for w in step.waits}
    total = 0
    for phase in plan.phases:
        for lane in phase.lanes:
            cuts = {k + 1 for k, s in enumerate(lane) if s in waited} | {k for k, s in enumerate(lane)
                                                                            if plan.steps[s].waits}
            total += 1 + len(cuts - {0, len(lane)})
    return total


@pytest.mark.parametrize("scheduler", ["greedy", "est"])
def test_segments_of_concurrent_lanes_equal_the_reference_and_are_cut_where_lanes_meet(scheduler: str) -> None:
    graph = random_dag(10, 3)
    # a wide device's model, so that both schedulers make concurrent lanes of these small operators
    plan = lower(graph, schedule(graph, scheduler, AnalyticCostModel("V100"), max_lanes=2))
    assert plan.max_lanes == 2
    executor = InductorExecutor(graph, plan, cores=2)
    try:
        x = [torch.randn(graph.inputs[0].type.shape)]
        assert_close(executor(x), opsched.run_graph(graph, x), scheduler)
        assert executor.program.n_items == _segments_expected(plan)
        if scheduler == "est":
            assert any(it.waits for phase in executor.program.phases for lane in phase for it in lane)
        assert all(it.op.startswith("inductor[") for phase in executor.program.phases for lane in phase
                   for it in lane)
        assert executor.describe().startswith(f"inductor: {executor.program.n_items} compiled segment")
        assert {e.label for e in executor.trace(x)} == {it.label for phase in executor.program.phases
                                                        for lane in phase for it in lane}
    finally:
        executor.close()


def test_a_zoo_model_optimized_on_inductor_equals_eager() -> None:
    model, inputs = get_model("squeezenet1_1"), example_inputs("squeezenet1_1")
    module = opsched.optimize(model, inputs, backend="inductor", cost="analytic", scheduler="greedy", max_lanes=2)
    assert module.backend.name == "inductor"
    with torch.no_grad():
        assert_close([module(*inputs)], [model(*inputs)], "squeezenet1_1 on inductor")
        fresh = torch.randn_like(inputs[0])
        assert_close([module(fresh)], [model(fresh)], "fresh inputs")


def test_segments_run_at_their_lanes_thread_count() -> None:
    graph = random_dag(6, 1)
    plan = lower(graph, schedule(graph, "greedy", AnalyticCostModel("V100"), max_lanes=2))
    executor = get_backend("inductor").prepare(graph, plan, RunOptions(cores=2))
    try:
        before = torch.get_num_threads()
        x = [torch.randn(graph.inputs[0].type.shape)]
        assert_close(executor(x), opsched.run_graph(graph, x))
        assert torch.get_num_threads() == before  # compiling and running leave the process's threads as found
    finally:
        executor.close()

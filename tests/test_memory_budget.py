"""A peak-memory budget: the IOS search admits only stages that keep within it, plans whose live
activations peak over it never win the race, the frugal sequential plan always runs in it, the
report gives every contender's peak, and a budget nothing fits is refused with every peak named."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import opsched
from opsched.cost import AnalyticCostModel
from opsched.errors import ScheduleError
from opsched.ir import Graph
from opsched.runtime import lower
from opsched.schedule import Schedule
from opsched.schedulers import schedule
from opsched.schedulers.sequential import sequential_stages
from opsched.testing import assert_close


class Wide(nn.Module):
    """Four branches, each a wide convolution narrowed again: run one after another, only one
    branch's wide value is alive at a time; run at once, all four are."""

    def __init__(self) -> None:
        super().__init__()
        self.wide = nn.ModuleList(nn.Conv2d(4, 64, 3, padding=1) for _ in range(4))
        self.narrow = nn.ModuleList(nn.Conv2d(64, 2, 1) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([n(w(x).relu()) for w, n in zip(self.wide, self.narrow)], 1)


X = torch.randn(1, 4, 32, 32)
INPUT, WIDE, NARROW = 4 * 32 * 32 * 4, 64 * 32 * 32 * 4, 2 * 32 * 32 * 4  # bytes of float32 values


def _peak(graph: Graph, sched: Schedule) -> int:
    plan = lower(graph, sched)
    return plan.peak_bytes([graph.types[name].nbytes for name in plan.slot_names])


def _sequential_peak(graph: Graph) -> int:
    return _peak(graph, Schedule.from_stages(graph.structural_hash(), sequential_stages(graph)))


def _optimize(scheduler: str = "greedy", **kwargs: object) -> opsched.ScheduledModule:
    return opsched.optimize(Wide().eval(), X, cost="analytic", scheduler=scheduler, **kwargs)  # type: ignore[arg-type]


def test_a_plan_over_the_budget_is_left_out_and_the_sequential_plan_runs_within_it() -> None:
    free = _optimize(memory_budget=2**30)
    seq_peak = _sequential_peak(free.graph)
    assert free.outcome.race is not None
    peaks = free.outcome.race.peak_bytes
    # one branch after another: the input, one wide value, three narrow ones already made
    assert peaks["sequential"] == seq_peak == INPUT + WIDE + 3 * NARROW
    assert peaks["greedy"] == INPUT + 4 * WIDE  # the four branches' wide values alive at once
    module = _optimize(memory_budget=seq_peak)
    assert module.schedule.scheduler == "sequential" and module.peak_bytes == seq_peak
    assert module.outcome.over_budget == {"greedy": peaks["greedy"]}
    text = str(module.report())
    assert "greedy's plan was left out" in text and "budget" in text
    model = Wide().eval()
    kept = opsched.optimize(model, X, cost="analytic", scheduler="greedy", memory_budget=seq_peak)
    with torch.no_grad():
        assert_close([kept(X)], [model(X)], "kept within budget")


def test_a_budget_no_plan_fits_names_every_peak() -> None:
    with pytest.raises(ScheduleError, match=r"no plan of 'Wide' fits memory_budget=1000 bytes.*greedy's at .* [KM]iB.*"
                                            r"sequential's at .* [KM]iB"):
        _optimize(memory_budget=1000)


@pytest.mark.parametrize("budget", [0, -5, 1.5, "1GB"])
def test_a_budget_must_be_a_positive_number_of_bytes(budget: object) -> None:
    with pytest.raises(ScheduleError, match="memory_budget: a positive number of bytes"):
        _optimize(memory_budget=budget)


def test_ios_within_a_budget_runs_as_many_wide_branches_at_once_as_fit() -> None:
    """On a GPU preset the unconstrained IOS runs the four wide convolutions at once; a budget
    with room for k wide values (and the narrow ones) gets the fastest schedule running k at a
    time, its plan within the budget, slower as k falls but never slower than one at a time."""
    graph = opsched.from_torch(Wide().eval(), X)
    v100 = AnalyticCostModel("V100")
    free = schedule(graph, "ios", v100)

    def widest(s: Schedule) -> int:
        assert s.stages is not None
        return max(sum(v.startswith("wide") for v in stage.nodes) for stage in s.stages)
    assert widest(free) == 4
    latencies = []
    for k in (3, 2, 1):
        budget = INPUT + k * WIDE + (4 + k) * NARROW
        within = schedule(graph, "ios", v100, memory_budget=budget)
        assert widest(within) == k and _peak(graph, within) <= budget < _peak(graph, free)
        assert within.stats["parts_over_memory"] == 0 and within.options["memory_budget"] == budget
        latencies.append(within.estimated_ms)
    assert free.estimated_ms < latencies[0] <= latencies[1] <= latencies[2]


def test_optimize_passes_its_budget_to_the_search() -> None:
    # unconstrained, IOS runs branches at once (peaking over this budget); told the budget, its
    # plan fits (here, the sequential plan itself) and is kept instead of being left out
    budget = INPUT + WIDE + 5 * NARROW
    module = _optimize(memory_budget=budget, scheduler="ios")
    assert module.outcome.over_budget == {} and module.outcome.same_plan == {"sequential": "ios"}
    assert module.schedule.scheduler == "ios" and module.peak_bytes <= budget
    assert _optimize(scheduler="ios").peak_bytes > budget


def test_a_search_out_of_time_falls_back_within_the_budget() -> None:
    """The wavefront a search out of time falls back to runs the four wide convolutions at once:
    admitted only by a budget with room for four; otherwise the part runs one unit at a time."""
    from opsched.schedulers.greedy import wavefront
    from opsched.schedulers.ios_memory import PartMemory
    from opsched.schedulers.units import UnitGraph

    graph = opsched.from_torch(Wide().eval(), X)
    ug = UnitGraph.build(graph)
    part = list(range(len(ug)))
    waves = wavefront(part, ug, 8)
    assert max(len(w) for w in waves) == 4
    one, four = INPUT + WIDE + 5 * NARROW, INPUT + 4 * WIDE + 8 * NARROW
    assert not PartMemory.build(ug, part, one).admits(waves)
    assert PartMemory.build(ug, part, four).admits(waves)
    assert PartMemory.build(ug, part, one).admits([[u] for u in part])
    rushed = schedule(graph, "ios", AnalyticCostModel("V100"), max_stage_costs=1, memory_budget=one)
    assert rushed.stats["budget_exhausted"] and _peak(graph, rushed) <= one

"""PartitionTuner (Yu et al., ETRI Journal 2023): profiled placement of branches on units.

1. Branches: the graph's maximal chains between forks and joins (:class:`UnitGraph` without
   keeping heavy operators apart), in topological order.
2. The backend finder: each branch placed by the chain dynamic program (:mod:`.chain_dp`) over
   one unit of each kind, from the units' profiles of single operators and fused chains, paying
   for each switch of unit the value's copy (the link's fixed switch cost and its bytes). A
   branch's inputs come from branches already placed, so their copies are priced exactly; a
   model output pays its way back to the default unit.
3. Parallel deployment: at each join, the predecessor branches that run wholly on one kind of
   unit are spread over that kind's identical units, longest first to the least loaded (the
   paper balances NPUs by memory; time is what a schedule spends). Branches on different units
   run at once wherever the data allows: each unit is a lane.
4. Each unit runs its nodes in topological order (the paper's level-by-level partitions).
5. opsched's addition, on by default (``refine``): branches, then single operators, moved between
   units where the unit simulator's makespan falls (:mod:`.refine_placement`), for the concurrency that the
   summed costs of step 2 cannot see. ``refine=0`` runs the paper's algorithm alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from opsched.cost import CostModel
from opsched.cost.unit_costs import UnitCosts
from opsched.cost.units import costs_nothing
from opsched.errors import ScheduleError
from opsched.ir import Graph
from opsched.schedule import Schedule
from opsched.schedulers.chain_dp import place_chain
from opsched.schedulers.placement import PlacementOptions, placed_schedule, unit_costs
from opsched.schedulers.refine_placement import refine_placement
from opsched.schedulers.registry import Progress, SchedulerSpec, option, register
from opsched.schedulers.units import UnitGraph

__all__ = ["PartitionTunerOptions", "partitiontuner_placement"]


@dataclass(frozen=True)
class PartitionTunerOptions(PlacementOptions):
    refine: int = option(4, "passes moving branches, then single operators, between units where the simulated "
                            "makespan falls, after the paper's algorithm (0: the paper's algorithm alone)")

    def __post_init__(self) -> None:
        if self.refine < 0:
            raise ScheduleError(f"option refine of scheduler 'partitiontuner' must be 0 or more, got {self.refine!r}")


def _branch_placement(graph: Graph, costs: UnitCosts, names: tuple[str, ...], unit_of: dict[str, str],
                      kinds: list[str]) -> None:
    """Place one branch (its producers outside it already placed) by the chain program."""
    default = costs.platform.default
    outputs = set(graph.outputs)
    inbound: list[list[str]] = []  # per node, the values it reads from outside the chain
    for k, v in enumerate(names):
        inside = {names[k - 1]} if k else set()
        inbound.append([u for u in dict.fromkeys(graph.node(v).inputs) if u not in inside])

    def copy_in(k: int, unit: str) -> float:
        return sum(costs.copy_ms(u, unit_of.get(u, default), unit) for u in inbound[k])

    def group(i: int, j: int, unit: str) -> float:
        chain = names[i:j]
        if len(chain) > 1 and not costs.fusable(chain, unit):
            return float("inf")
        return costs.chain_ms(chain, unit) + sum(copy_in(k, unit) for k in range(i, j))

    def switch(i: int, a: str, b: str) -> float:
        return costs.copy_ms(names[i - 1], a, b)

    def exit_cost(unit: str) -> float:
        return costs.copy_ms(names[-1], unit, default) if names[-1] in outputs else 0.0

    placed = place_chain(len(names), kinds, group, switch, exit_cost)
    unit_of.update(zip(names, placed.units))


def partitiontuner_placement(graph: Graph, costs: UnitCosts,
                             refine: int = 4) -> tuple[dict[str, str], dict[str, float]]:
    """Each node's unit, and what the search saw (branches, branches spread at joins, and with
    ``refine`` passes, the branches moved and the makespan before the moves)."""
    platform = costs.platform
    kinds = list(dict.fromkeys(u.kind for u in platform.units))
    first_of = {k: next(u.name for u in platform.units if u.kind == k) for k in kinds}
    branches = UnitGraph.build(graph, split_heavy=False)
    unit_of: dict[str, str] = {}
    for names in branches.units:
        _branch_placement(graph, costs, names, unit_of, [first_of[k] for k in kinds])
    spread = 0
    kind_of = {u.name: u.kind for u in platform.units}
    for b in range(len(branches)):
        preds = branches.preds[b]
        if len(preds) < 2:
            continue
        by_kind: dict[str, list[int]] = {}
        for p in preds:
            on = {unit_of[v] for v in branches.units[p]}
            if len(on) == 1:
                by_kind.setdefault(kind_of[on.pop()], []).append(p)
        for kind, group in by_kind.items():
            pool = [u.name for u in platform.units if u.kind == kind]
            if len(pool) < 2 or len(group) < 2:
                continue
            load = dict.fromkeys(pool, 0.0)
            work = {p: sum(costs.exec_ms(v, first_of[kind]) for v in branches.units[p]) for p in group}
            for p in sorted(group, key=lambda p: (-work[p], p)):
                target = min(pool, key=lambda u: (load[u], pool.index(u)))
                load[target] += work[p]
                unit_of.update(dict.fromkeys(branches.units[p], target))
            spread += len(group)
    stats: dict[str, float] = {"branches": len(branches), "spread": spread}
    if refine:
        # each branch whole, then each of its operators alone (a branch that begins with a join only
        # the CPU runs, say, keeps the join while its convolution moves)
        moves = [m for names in branches.units
                 for m in (names, *((v,) for v in names if len(names) > 1 and not costs_nothing(graph.node(v))))]
        refined = refine_placement(costs, unit_of, moves, [n.name for n in graph.nodes], refine)
        unit_of = refined.unit_of
        stats |= {"moved": refined.moves, "unrefined_ms": refined.start_ms}
    return unit_of, stats


def _partitiontuner(graph: Graph, cost: CostModel, options: PartitionTunerOptions,
                    progress: Progress | None) -> Schedule:
    _, costs = unit_costs(graph, cost, options)
    unit_of, stats = partitiontuner_placement(graph, costs, options.refine)
    return placed_schedule(graph, costs, unit_of, [n.name for n in graph.nodes], "partitiontuner", options, stats)


register(SchedulerSpec("partitiontuner", _partitiontuner, PartitionTunerOptions,
                       "PartitionTuner: branches placed on units by a DP with fusion and switch costs (placement)"))

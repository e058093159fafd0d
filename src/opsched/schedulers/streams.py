"""Stream-assignment baselines from the peers, as lane-based schedules (no stage barriers).

* ``nimble`` (Kwon et al., NeurIPS 2020): a minimum chain decomposition of the dependency order
  (Dilworth, by bipartite matching on the transitive closure), one lane per chain: the fewest
  lanes that still let every set of independent operators run at once. A node waits, by event,
  only for producers on other lanes.
* ``opara`` (Chen et al., IEEE TC 2025): in topological order, a node inherits the lane of its
  first producer that has not yet handed its lane to another consumer; otherwise it opens a
  new lane. Linear time; chains follow the data flow.

Neither uses a cost model (the ``cost`` argument only labels the schedule).
"""

from __future__ import annotations

from opsched.cost import CostModel
from opsched.ir import Graph
from opsched.ir.analysis import min_chain_cover
from opsched.schedule import Schedule
from opsched.schedulers.registry import NoOptions, Progress, SchedulerSpec, laned, register

__all__ = ["nimble_lanes", "opara_lanes"]


def nimble_lanes(graph: Graph) -> list[list[str]]:
    chains = min_chain_cover(graph)
    chains.sort(key=lambda c: c[0])
    return [[graph.nodes[i].name for i in chain] for chain in chains]


def opara_lanes(graph: Graph) -> list[list[str]]:
    lane_of: list[int] = [-1] * len(graph.nodes)
    handed = [False] * len(graph.nodes)  # has this node passed its lane on to a consumer yet?
    lanes: list[list[str]] = []
    for i, node in enumerate(graph.nodes):
        for p in graph.preds[i]:
            if not handed[p]:
                handed[p] = True
                lane_of[i] = lane_of[p]
                break
        else:
            lane_of[i] = len(lanes)
            lanes.append([])
        lanes[lane_of[i]].append(node.name)
    return lanes


def _nimble(graph: Graph, cost: CostModel, options: NoOptions, progress: Progress | None) -> Schedule:
    return laned(graph, cost, nimble_lanes(graph), "nimble", options)


def _opara(graph: Graph, cost: CostModel, options: NoOptions, progress: Progress | None) -> Schedule:
    return laned(graph, cost, opara_lanes(graph), "opara", options)


register(SchedulerSpec("nimble", _nimble, NoOptions, "Nimble's lanes: a minimum chain decomposition"))
register(SchedulerSpec("opara", _opara, NoOptions, "Opara's lanes: each node inherits a producer's lane once"))

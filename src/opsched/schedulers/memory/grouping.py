"""Algorithm 2 of GraphTurbo: grouping nodes into sub-graphs, to a fixpoint.

Every node starts as its own sub-graph, with its SplitInfo (:mod:`.splitinfo`). Each round looks,
in the graph's order, for three kinds of merge and applies each one that is valid and pays, a
sub-graph taking part in at most one merge per round; rounds repeat until one merges nothing:

* **straight**: a sub-graph and the one sub-graph that reads it (chains: conv, conv, pool);
* **diamond**: a fork, the branches that each read only the fork and are read only by the join,
  and the join (residual blocks: the fork also feeding the join directly);
* **branch**: siblings, sub-graphs that read exactly the same sub-graphs (inception branches).

Merging these never makes a cycle (nothing leaves the merged set and comes back). A merge is
*valid* when the merged sub-graph still has a split whose instances fit the level, and *pays*
when :func:`estimate_ms` says the merged sub-graph costs no more than its parts: the values
between the parts stay in the cache instead of going out and back, against more instances
(each reading the weights again, each a dispatch) where the merged one needs a larger factor.
Repetition builds layers into blocks and blocks into stages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

from opsched._toposort import topological_order
from opsched.cost.analytic import parallel_work
from opsched.cost.hierarchy import Hierarchy
from opsched.ir import Graph
from opsched.ir.schema import node_flops, op_schema
from opsched.schedulers.memory.instances import Group
from opsched.schedulers.memory.splitinfo import SplitInfo, instance_peak, read_outside, split_info

__all__ = ["group_nodes", "estimate_ms", "split_pays", "singletons"]


def singletons(graph: Graph) -> list[Group]:
    """Layer by layer: every node its own unsplit sub-graph."""
    return [Group((n.name,)) for n in graph.nodes]


def estimate_ms(graph: Graph, nodes: Sequence[str], info: SplitInfo, hierarchy: Hierarchy) -> float:
    """A sub-graph's time on one core under the hierarchy: per node, compute (recomputed halos
    included) plus bytes over the bandwidth of the level they live in, over the share of the
    core's slots one instance of the node keeps busy; plus the weights, read once per instance,
    and a dispatch per node and instance. Values made and read inside live in the fit level
    where the instances fit; values read from or read outside, and the weights, in the first
    level below that holds them whole."""
    inside = set(nodes)
    spec = hierarchy.device
    fit_at = hierarchy.levels.index(hierarchy.fit_level)

    def level_gbps(nbytes: int) -> float:
        for lv in hierarchy.levels[fit_at + 1:]:
            if lv.capacity is None or nbytes <= lv.capacity:
                return hierarchy.share_gbps(lv)
        return hierarchy.share_gbps(hierarchy.dram)

    fit_gbps = hierarchy.share_gbps(hierarchy.fit_level) if info.fits else 0.0
    exported = read_outside(graph, inside)
    seconds, weights = 0.0, 0
    for v in nodes:
        node = graph.node(v)
        ins = graph.input_types(node)
        params = graph.node_param_types(node)
        w = parallel_work(graph, node)
        alone = hierarchy.compute_s(node_flops(node, ins, params) * info.recompute, w.category)
        weights += sum(t.nbytes for t in params)
        for x, t in zip(node.inputs, ins):
            internal = x in inside and fit_gbps
            alone += t.nbytes / ((fit_gbps if internal else level_gbps(t.nbytes)) * 1e9)
        out = node.out.nbytes
        alone += out / ((level_gbps(out) if v in exported or not fit_gbps else fit_gbps) * 1e9)
        seconds += alone / spec.occupancy(max(w.elems // info.factor, 1), w.category, w.channels, hierarchy.slots())
    seconds += info.factor * weights / (level_gbps(weights) * 1e9)
    seconds += info.factor * len(nodes) * spec.launch_us * 1e-6
    return seconds * 1e3


def split_pays(graph: Graph, nodes: Sequence[str], info: SplitInfo, hierarchy: Hierarchy) -> bool:
    """Whether ``info``'s instances cost less under :func:`estimate_ms` than the sub-graph run
    whole, its values then in the levels below the fit level. On a GPU it may not: instances of
    a slice of the batch leave SMs idle that the whole batch keeps busy."""
    if info.factor == 1:
        return True
    whole = SplitInfo(1, instance_peak(graph, nodes), False)
    return estimate_ms(graph, nodes, info, hierarchy) < estimate_ms(graph, nodes, whole, hierarchy)


def group_nodes(graph: Graph, hierarchy: Hierarchy, *, max_factor: int | None = None,
                pays: Callable[[Sequence[Sequence[str]], Sequence[str]], bool] | None = None,
                max_rounds: int = 64) -> list[tuple[tuple[str, ...], SplitInfo]]:
    """Algorithm 2: the sub-graphs of ``graph`` (each with its SplitInfo), in the graph's order.
    ``pays(parts, merged)`` replaces the model's test (tests use it to force merges)."""
    capacity = hierarchy.fit_bytes
    order = graph.index
    info_cache: dict[frozenset[str], SplitInfo] = {}

    def info(nodes: Iterable[str]) -> SplitInfo:
        key = frozenset(nodes)
        if key not in info_cache:
            info_cache[key] = split_info(graph, sorted(key, key=order.__getitem__), capacity, max_factor)
        return info_cache[key]

    def model_pays(parts: Sequence[Sequence[str]], merged: Sequence[str]) -> bool:
        whole = estimate_ms(graph, merged, info(merged), hierarchy)
        return whole <= sum(estimate_ms(graph, p, info(p), hierarchy) for p in parts)

    test = pays or model_pays
    groups: list[list[str]] = [[n.name] for n in graph.nodes if op_schema(n.op).category != "const"]
    consts = [[n.name] for n in graph.nodes if op_schema(n.op).category == "const"]
    for _ in range(max_rounds):
        merged = _round(graph, groups, info, test)
        if merged is None:
            break
        groups = merged
    out = sorted(groups + consts, key=lambda g: order[g[0]])
    return [(tuple(g), info(g)) for g in out]


def _edges(graph: Graph, groups: list[list[str]]) -> tuple[list[set[int]], list[set[int]]]:
    """Per group, the groups it reads and the groups that read it."""
    group_of = {v: k for k, g in enumerate(groups) for v in g}
    preds: list[set[int]] = [set() for _ in groups]
    succs: list[set[int]] = [set() for _ in groups]
    for k, g in enumerate(groups):
        for v in g:
            for x in graph.node(v).inputs:
                p = group_of.get(x)
                if p is not None and p != k:
                    preds[k].add(p)
                    succs[p].add(k)
    return preds, succs


def _candidates(preds: list[set[int]], succs: list[set[int]]) -> list[set[int]]:
    """The round's straight, diamond and branch merges, in that order, each by the graph's order."""
    out = [{k, *succs[k]} for k in range(len(preds)) if len(succs[k]) == 1]  # k and the one group reading it
    for j in range(len(preds)):  # a fork, branches read only by j, and the join j
        for fork in sorted({next(iter(preds[b])) for b in preds[j] if len(preds[b]) == 1}):
            branches = preds[j] - {fork}
            if branches and all(preds[b] == {fork} and succs[b] == {j} for b in branches) \
                    and succs[fork] <= branches | {j}:
                out.append({fork, j, *branches})
    siblings: dict[frozenset[int], set[int]] = {}
    for k in range(len(preds)):  # groups that read exactly the same groups
        if preds[k]:
            siblings.setdefault(frozenset(preds[k]), set()).add(k)
    return out + [m for m in siblings.values() if len(m) > 1]


def _round(graph: Graph, groups: list[list[str]], info: Callable[[Iterable[str]], SplitInfo],
           pays: Callable[[Sequence[Sequence[str]], Sequence[str]], bool]) -> list[list[str]] | None:
    """One round of merges; ``None`` where nothing merged."""
    preds, succs = _edges(graph, groups)
    taken: set[int] = set()
    merges: list[set[int]] = []
    for members in _candidates(preds, succs):
        if members & taken:
            continue
        parts = [groups[k] for k in sorted(members)]
        union = [v for p in parts for v in p]
        if info(union).fits and pays(parts, union):
            merges.append(members)
            taken.update(members)
    if not merges:
        return None
    contracted = _contract(groups, merges, preds)
    if contracted is None:  # merges each safe alone, together a cycle: take the first only
        contracted = _contract(groups, merges[:1], preds)
        assert contracted is not None
    index = graph.index
    return [sorted(g, key=index.__getitem__) for g in contracted]


def _contract(groups: list[list[str]], merges: list[set[int]], preds: list[set[int]]) -> list[list[str]] | None:
    """``groups`` with each of ``merges`` made one; ``None`` where that makes a cycle."""
    into = {k: min(m) for m in merges for k in m}
    out: dict[int, list[str]] = {}
    for k, g in enumerate(groups):
        out.setdefault(into.get(k, k), []).extend(g)
    keys = list(out)
    position = {k: i for i, k in enumerate(keys)}
    contracted_preds: list[set[int]] = [set() for _ in keys]
    for k, ps in enumerate(preds):
        for p in ps:
            a, b = position[into.get(p, p)], position[into.get(k, k)]
            if a != b:
                contracted_preds[b].add(a)
    if topological_order(dict(enumerate(contracted_preds)))[1]:
        return None
    return list(out.values())

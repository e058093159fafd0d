"""Pure analyses over a graph's node DAG (graph inputs excluded): reachability, width,
topological generations, critical path. All walks are explicit worklists."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from opsched._toposort import bits
from opsched.ir.graph import Graph
from opsched.ir.schema import node_flops

__all__ = [
    "descendants", "ancestors", "width", "max_antichain", "min_chain_cover", "generations", "critical_path",
    "total_flops", "parameter_count", "live_values",
]


def descendants(graph: Graph) -> list[int]:
    """Per node index, a bitmask of the node indices reachable from it (itself excluded)."""
    masks = [0] * len(graph.nodes)
    for i in range(len(graph.nodes) - 1, -1, -1):  # nodes are topological: successors come later
        m = 0
        for s in graph.succs[i]:
            m |= masks[s] | (1 << s)
        masks[i] = m
    return masks


def ancestors(graph: Graph) -> list[int]:
    masks = [0] * len(graph.nodes)
    for i in range(len(graph.nodes)):
        m = 0
        for p in graph.preds[i]:
            m |= masks[p] | (1 << p)
        masks[i] = m
    return masks


def _closure_matching(graph: Graph) -> tuple[list[list[int]], list[int], list[int]]:
    """A maximum matching in the bipartite graph u -> v iff v is reachable from u (Hopcroft-Karp).

    Returns the adjacency and ``match_l`` / ``match_r`` (-1 where unmatched).
    """
    n = len(graph.nodes)
    adj = [bits(m) for m in descendants(graph)]
    match_l, match_r = [-1] * n, [-1] * n
    while True:  # Hopcroft-Karp phases: layer by BFS, then augment along the layers
        dist = _layers(adj, match_l, match_r)
        if dist is None:
            break
        for root in range(n):
            if match_l[root] == -1:
                _augment(root, adj, dist, match_l, match_r)
    return adj, match_l, match_r


def _layers(adj: list[list[int]], match_l: list[int], match_r: list[int]) -> list[int] | None:
    """BFS distances of left vertices from the free ones along alternating paths, or None when
    no augmenting path is left."""
    n = len(adj)
    inf = n + 1
    dist = [inf] * n
    q = deque(u for u in range(n) if match_l[u] == -1)
    for u in q:
        dist[u] = 0
    found = False
    while q:
        u = q.popleft()
        for v in adj[u]:
            w = match_r[v]
            if w == -1:
                found = True
            elif dist[w] == inf:
                dist[w] = dist[u] + 1
                q.append(w)
    return dist if found else None


def _augment(root: int, adj: list[list[int]], dist: list[int], match_l: list[int], match_r: list[int]) -> None:
    """One augmenting path from the free vertex ``root`` along the layers (iterative DFS), if any;
    vertices found to lead nowhere leave the layers."""
    dead = len(adj) + 1
    stack = [(root, iter(adj[root]))]
    path: list[tuple[int, int]] = []
    while stack:
        u, it = stack[-1]
        for v in it:
            w = match_r[v]
            if w == -1:
                path.append((u, v))
                for pu, pv in path:
                    match_l[pu], match_r[pv] = pv, pu
                return
            if dist[w] == dist[u] + 1:
                path.append((u, v))
                stack.append((w, iter(adj[w])))
                break
        else:
            dist[u] = dead
            stack.pop()
            if path:
                path.pop()


def min_chain_cover(graph: Graph) -> list[list[int]]:
    """Fewest chains (each ordered by dependency, consecutive nodes reachable one from the
    other) covering every node once: Dilworth via the closure matching; as many as the width."""
    _, match_l, match_r = _closure_matching(graph)
    chains = []
    for start in range(len(graph.nodes)):
        if match_r[start] == -1:
            chain, u = [start], start
            while match_l[u] != -1:
                u = match_l[u]
                chain.append(u)
            chains.append(chain)
    return chains


def max_antichain(graph: Graph) -> list[int]:
    """A largest set of mutually independent nodes (no path between any two).

    Dilworth: its size equals the minimum number of chains covering the transitive closure,
    ``n - M`` for a maximum matching M in the bipartite graph (u -> v iff v is reachable from
    u). Koenig's theorem turns the minimum vertex cover into the antichain (nodes with neither
    side in the cover).
    """
    n = len(graph.nodes)
    adj, match_l, match_r = _closure_matching(graph)
    # Koenig: alternating reachability from free left vertices.
    vis_l, vis_r = [False] * n, [False] * n
    q = deque(u for u in range(n) if match_l[u] == -1)
    for u in q:
        vis_l[u] = True
    while q:
        u = q.popleft()
        for v in adj[u]:
            if not vis_r[v]:
                vis_r[v] = True
                w = match_r[v]
                if w != -1 and not vis_l[w]:
                    vis_l[w] = True
                    q.append(w)
    # cover = (L not visited) + (R visited); antichain = nodes in neither side of the cover
    return [i for i in range(n) if vis_l[i] and not vis_r[i]]


def width(graph: Graph) -> int:
    """Size of the largest set of mutually independent nodes: the headroom for concurrency."""
    return len(max_antichain(graph)) if graph.nodes else 0


def generations(graph: Graph) -> list[list[int]]:
    """Kahn's wavefronts: generation k holds the nodes whose longest path from a source is k."""
    level = [0] * len(graph.nodes)
    for i, ps in enumerate(graph.preds):
        level[i] = max((level[p] + 1 for p in ps), default=0)
    out: list[list[int]] = [[] for _ in range(max(level, default=-1) + 1)]
    for i, lv in enumerate(level):
        out[lv].append(i)
    return out


def critical_path(graph: Graph, weight: Callable[[int], float] | Sequence[float]) -> tuple[float, list[int]]:
    """Longest weighted path through the node DAG: (its length, its node indices)."""
    w = weight if callable(weight) else weight.__getitem__
    best = [0.0] * len(graph.nodes)
    back = [-1] * len(graph.nodes)
    for i, ps in enumerate(graph.preds):
        p = max(ps, key=lambda j: best[j], default=-1)
        best[i] = w(i) + (best[p] if p >= 0 else 0.0)
        back[i] = p
    if not best:
        return 0.0, []
    end = max(range(len(best)), key=best.__getitem__)
    path = []
    while end >= 0:
        path.append(end)
        end = back[end]
    return max(best), path[::-1]


def total_flops(graph: Graph) -> int:
    return sum(node_flops(n, graph.input_types(n), graph.node_param_types(n)) for n in graph.nodes)


def parameter_count(graph: Graph) -> int:
    return sum(int(t.numel()) for t in graph.params.values())


def live_values(graph: Graph, done: set[str]) -> list[str]:
    """Values computed in ``done`` or given (graph inputs) that a node not in ``done`` reads, in
    the order they are defined: what is live at the point where exactly ``done`` has run."""
    wanted = {v for n in graph.nodes if n.name not in done for v in n.inputs}
    return [v for v in (*(i.name for i in graph.inputs), *(n.name for n in graph.nodes))
            if v in wanted and (v in done or v not in graph.index)]

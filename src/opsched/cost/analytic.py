"""The analytic cost model: deterministic stage latencies from FLOPs, bytes and occupancy.

Per operator *i* (views and constants cost nothing):

* ``area_i = max(flops_i / (peak * eff_i), bytes_i / bandwidth)``: its time with the whole
  device (a roofline; ``eff_i`` is the fraction of peak its kind reaches: dense conv,
  depthwise conv, GEMM, other);
* ``u_i``: the fraction of the device it can occupy alone; it then runs for ``exec_i =
  area_i / u_i``. Dense convolutions and GEMMs are tiled (``DeviceSpec.tile``): ``u_i =
  min(1, tiles_i / (slots * tiles_per_slot))``, so a 17x17x192 convolution at batch 1 (9 x 3
  tiles) occupies a sixth of a V100; other operators are thread-parallel: ``u_i = min(1,
  elems_i / (slots * saturation))`` over their output elements, or their input elements for a
  reduction (its threads share out the input);
* ``launch``: the per-kernel issue (GPU) or dispatch (CPU) overhead.

A stage whose groups run at once shares the device like a fluid: it lasts at least as long
as its longest group, at least as long as all its work at full occupancy (the areas add up),
and, on a GPU, at least as long as issuing all its kernels from one host thread:

* GPU: ``T = max(sum_i launch, chains, sum_i area_i) + sync``
* CPU: ``T = max(chains, sum_i area_i) + sync``

where ``chains = longest + (1 - overlap) * (sum_g chain_g - longest)`` over the groups' chain
times ``chain_g = sum_{i in g} exec_i`` (plus dispatch on a CPU): co-running operators hide
behind the longest group only partly (``DeviceSpec.overlap``). The V100 preset reproduces
IOS's measured sequential latencies within 10% on RandWire, NASNet and SqueezeNet (Inception
V3 comes out 1.7x slower: cuDNN's split-K kernels fill the GPU better on its 8x8 and 17x17
layers than tiles of 64x64 suggest). With ``overlap = 0.5`` its greedy-over-sequential
ratios match IOS's measured ones (RandWire 1.37 vs 1.35, NASNet 1.38 vs 1.37, Inception 1.25 vs
1.41; greedy slower than sequential on SqueezeNet, as measured).

``sync`` is paid by stages of more than one group (the barrier after them). A merge stage is
one convolution with the merged kernel (zero-padded kernels count as real FLOPs, as they are
computed). The schedule's latency is the sum of its stages (the IOS model). So concurrency pays
exactly when operators leave the device partly idle, and costs a barrier; on a CPU preset also
the cut of the backend's one-lane segments (``DeviceSpec.cut_us``, :meth:`segment_cut`), which
list schedulers see as the fork cost of their resource model.

:meth:`AnalyticCostModel.resources` gives the same model per operator, for the simulator and
the list scheduler (:mod:`opsched.cost.resources`): duration = ``exec_i`` (at least the launch on
a GPU, plus the dispatch on a CPU), demand = ``area_i / duration``, and the overlap and barrier
of the preset. A stage whose groups do not oversubscribe the device replays there in exactly
its ``chains`` term.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opsched.cost.base import SegmentCut
from opsched.cost.devices import DeviceSpec, device_spec
from opsched.cost.resources import OpDemand, ResourceModel
from opsched.ir import Graph, Node, node_bytes, node_flops, op_schema
from opsched.ir.ops.conv import merged_conv
from opsched.schedule import Stage

__all__ = ["AnalyticCostModel", "OpCost", "Work", "parallel_work"]


@dataclass(frozen=True, slots=True)
class OpCost:
    area_ms: float
    exec_ms: float
    launch_ms: float


class AnalyticCostModel:
    """Deterministic; the default in tests. ``AnalyticCostModel("V100")`` or a :class:`DeviceSpec`.

    Monotone by construction: every term of a stage's latency grows with its groups.
    """

    monotone = True

    def __init__(self, device: str | DeviceSpec = "V100") -> None:
        self.spec = device if isinstance(device, DeviceSpec) else device_spec(device)
        # per graph, per node: operator costs are asked for again in every stage that holds them
        self._op_costs: weakref.WeakKeyDictionary[Graph, dict[str, OpCost]] = weakref.WeakKeyDictionary()

    @property
    def device(self) -> str:
        return self.spec.name

    @property
    def key(self) -> str:
        s = self.spec
        return (f"analytic/v2/{s.name}/{s.peak_gflops}/{s.mem_gbps}/{s.slots}x{s.saturation}/"
                f"{s.tile}x{s.tiles_per_slot}/{s.overlap}/{s.launch_us}/{s.sync_us}/{s.cut_us}/"
                f"{sorted(s.efficiency.items())}")

    def _cost(self, flops: int, nbytes: int, elems: int, category: str, channels: int = 0) -> OpCost:
        s = self.spec
        area = max(flops / (s.peak_gflops * 1e6 * s.efficiency_of(category)), nbytes / (s.mem_gbps * 1e6))
        return OpCost(area, area / s.occupancy(elems, category, channels), s.launch_us / 1e3)

    def op_cost(self, graph: Graph, node: Node) -> OpCost:
        per_graph = self._op_costs.get(graph)
        if per_graph is None:
            per_graph = self._op_costs[graph] = {}
        cost = per_graph.get(node.name)
        if cost is None:
            cost = per_graph[node.name] = self._op_cost(graph, node)
        return cost

    def _op_cost(self, graph: Graph, node: Node) -> OpCost:
        schema = op_schema(node.op)
        if schema.is_view:
            return OpCost(0.0, 0.0, 0.0)
        ins, params = graph.input_types(node), graph.node_param_types(node)
        w = parallel_work(graph, node)
        return self._cost(node_flops(node, ins, params), node_bytes(node, ins, params), w.elems, w.category, w.channels)

    def _merged_cost(self, graph: Graph, stage: Stage) -> OpCost:
        spec = merged_conv(graph, stage.nodes)
        first = graph.node(spec.members[0])
        x = graph.types[first.inputs[0]]
        out_elems = first.out.numel // first.out.shape[1] * spec.out_channels
        macs = out_elems * spec.in_channels * spec.kernel[0] * spec.kernel[1]
        itemsize = x.nbytes // max(x.numel, 1)
        weights = spec.out_channels * spec.in_channels * spec.kernel[0] * spec.kernel[1] * itemsize
        nbytes = x.nbytes + weights + out_elems * itemsize
        return self._cost(2 * macs, nbytes, out_elems, "conv", spec.out_channels)

    def op_latency(self, graph: Graph, node: Node) -> float:
        """One operator alone on the device: its execution and its launch (or dispatch)."""
        c = self.op_cost(graph, node)
        if c.exec_ms == 0:
            return 0.0
        return max(c.launch_ms, c.exec_ms) if self.spec.async_launch else c.launch_ms + c.exec_ms

    def fused_latency(self, graph: Graph, names: Sequence[str]) -> float:
        """A chain of operators (each reading the one before) run as one fused kernel: each
        one's compute, their bytes less each intermediate's write and read-back, one launch,
        and the occupancy of the chain's head."""
        s = self.spec
        nodes = [graph.node(v) for v in names]
        compute = 0.0
        nbytes = -2 * sum(n.out.nbytes for n in nodes[:-1])
        for n in nodes:
            ins, params = graph.input_types(n), graph.node_param_types(n)
            compute += node_flops(n, ins, params) / (s.peak_gflops * 1e6 * s.efficiency_of(_category(n)))
            nbytes += node_bytes(n, ins, params)
        head = self.op_cost(graph, nodes[0])
        occupancy = head.area_ms / head.exec_ms if head.exec_ms else 1.0
        exec_ms = max(compute, max(nbytes, 0) / (s.mem_gbps * 1e6)) / occupancy
        return max(head.launch_ms, exec_ms) if s.async_launch else head.launch_ms + exec_ms

    def _demand(self, c: OpCost) -> OpDemand:
        duration = max(c.launch_ms, c.exec_ms) if self.spec.async_launch else c.launch_ms + c.exec_ms
        if c.exec_ms == 0:  # a view: no kernel at all
            return OpDemand(0.0, 0.0)
        return OpDemand(duration, min(1.0, c.area_ms / duration), self.spec.cut_us / 1e3)

    def resources(self, graph: Graph, merges: Iterable[Sequence[str]] = ()) -> ResourceModel:
        """Per-operator durations and demands, and per merged convolution (keyed by its members
        joined with ``+``; pass ``schedule.merged`` to replay a schedule with merges)."""
        ops = {n.name: self._demand(self.op_cost(graph, n)) for n in graph.nodes}
        for members in merges:
            stage = Stage(tuple((v,) for v in members), "merge")
            ops["+".join(members)] = self._demand(self._merged_cost(graph, stage))
        return ResourceModel(ops, self.spec.overlap, self.spec.sync_us / 1e3, self.device, self.spec.kind == "gpu")

    def segment_cut(self, graph: Graph) -> SegmentCut | None:
        """The preset's ``cut_us`` per stage of several groups, if it charges one (CPUs, whose
        plans run on ONNX Runtime); layout conversions are not modelled."""
        return SegmentCut(self.spec.cut_us / 1e3) if self.spec.cut_us else None

    def stage_latency(self, graph: Graph, stage: Stage) -> float:
        s = self.spec
        if stage.is_merge:
            c = self._merged_cost(graph, stage)
            return max(c.launch_ms, c.exec_ms) if s.async_launch else c.launch_ms + c.exec_ms
        costs = [[self.op_cost(graph, graph.node(v)) for v in g] for g in stage.groups]
        area = sum(c.area_ms for g in costs for c in g)
        sync = s.sync_us / 1e3 if len(stage.groups) > 1 else 0.0
        chain = [sum(c.exec_ms + (0.0 if s.async_launch else c.launch_ms) for c in g) for g in costs]
        longest = max(chain)
        chains = longest + (1.0 - s.overlap) * (sum(chain) - longest)
        if s.async_launch:
            issue = sum(c.launch_ms for g in costs for c in g)
            return max(issue, chains, area) + sync
        return max(chains, area) + sync


@dataclass(frozen=True, slots=True)
class Work:
    """How an operator's work spreads over a device (:meth:`DeviceSpec.occupancy`): its
    efficiency class, its output channels (the tiles' columns) and the elements its threads
    share out."""

    category: str
    channels: int
    elems: int


def parallel_work(graph: Graph, node: Node) -> Work:
    """``node``'s :class:`Work`."""
    category = _category(node)
    channels = node.out.shape[1] if node.op == "conv2d" else node.out.shape[-1] if node.out.shape else 1  # 0-d
    # a reduction's threads share out its input, not its (small) output: a global average pool
    # of 4 channels over 64x64 keeps 16,384 threads busy, not 4
    elems = sum(t.numel for t in graph.input_types(node)) if category == "reduce" else node.out.numel
    return Work(category, channels, elems)


def _category(node: Node) -> str:
    """The efficiency class of an operator: its category, grouped convolutions apart."""
    if node.op == "conv2d" and node.attr("groups", 1) > 1:
        return "depthwise"
    return op_schema(node.op).category

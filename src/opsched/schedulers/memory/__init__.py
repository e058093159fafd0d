"""Memory-hierarchy-aware scheduling (GraphTurbo, OSDI 2023), one algorithm per module:

* :mod:`.splitinfo`: Algorithm 1, the smallest batch split whose instances fit a level;
* :mod:`.grouping`: Algorithm 2, straight, diamond and branch merges to a fixpoint;
* :mod:`.instances`: the instance DAG of a grouping over the split graph;
* :mod:`.order`: Algorithm 3, the depth-first (LIFO) instance order, and breadth-first;
* :mod:`.binding`: Algorithm 4, instances bound to cores, output scopes;
* :mod:`.traffic`: the simulator of bytes per memory level and latency.

The ``graphturbo`` scheduler (:mod:`opsched.schedulers.graphturbo`) puts them together.
"""

from opsched.schedulers.memory.binding import ALL, Binding, bind
from opsched.schedulers.memory.grouping import estimate_ms, group_nodes, singletons, split_pays
from opsched.schedulers.memory.instances import PIECE, Group, InstanceDag, Unit, instance_dag
from opsched.schedulers.memory.order import breadth_first, depth_first
from opsched.schedulers.memory.splitinfo import SplitInfo, divisors, instance_peak, split_info
from opsched.schedulers.memory.traffic import Traffic, simulate

__all__ = [
    "ALL", "Binding", "Group", "InstanceDag", "PIECE", "SplitInfo", "Traffic", "Unit", "bind", "breadth_first",
    "depth_first", "divisors", "estimate_ms", "group_nodes", "instance_dag", "instance_peak", "simulate",
    "singletons", "split_info", "split_pays",
]

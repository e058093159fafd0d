"""Schedulers, each in its own module, registered with a spec (:mod:`.registry`):

* ``sequential``: one unit per stage (what frameworks do);
* ``greedy``: IOS's wavefront, every ready unit at once;
* ``ios``: the IOS dynamic program over stages, optimal under its cost model;
* ``est``: list scheduling on lanes without barriers, under a resource model (milliseconds);
* ``nimble``, ``opara``: the peers' stream assignments;
* ``graphturbo``: sub-graph instances split to fit the cache, depth-first, bound to cores
  (:mod:`.memory`, one module per algorithm);
* placement on the units of a platform (:mod:`.placement`): ``partitiontuner``, ``heft``,
  ``peft``, and the baselines ``type-based``, ``profiled`` and ``exhaustive``.

The simulator (:mod:`.simulate`) replays any schedule under a resource model; the unit
simulator (:mod:`.placed_sim`) replays placed schedules under the units' profiles.
"""

from opsched.schedulers import (
    est,
    exhaustive,
    graphturbo,
    greedy,
    heft,
    ios,
    partitiontuner,
    peft,
    profiled,
    sequential,
    streams,
    type_based,
)
from opsched.schedulers.ios import SearchStats
from opsched.schedulers.registry import (
    NoOptions,
    Progress,
    SchedulerSpec,
    make_options,
    register,
    schedule,
    scheduler_names,
    spec,
)
from opsched.schedulers.units import UnitGraph

__all__ = [
    "NoOptions", "Progress", "SchedulerSpec", "SearchStats", "UnitGraph", "est", "exhaustive", "graphturbo", "greedy",
    "heft", "ios",
    "make_options", "partitiontuner", "peft", "profiled", "register", "schedule", "scheduler_names", "sequential",
    "spec", "streams", "type_based",
]

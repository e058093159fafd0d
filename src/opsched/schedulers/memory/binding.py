"""Algorithm 4 of GraphTurbo, adapted to instances that each run on one core: binding instances
to cores, and the scope of each instance's output.

Visiting instances consumers first (the reverse of the run order), an unbound instance takes its
group's default tiling (instance ``i`` of ``f`` on core ``i * cores // f``: contiguous slices of
the batch per core); a group of one instance (unsplit) runs on every core (:data:`ALL`), binds
nobody and is bound by nobody. Each producer of a bound instance that is still unbound takes the same core, so
the slices it writes are read where they were made; a producer already bound elsewhere (or read
by an instance on every core) keeps its core, and its output's scope is demoted from the core's
own cache to the shared levels (``shared``): it crosses cores.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from opsched.schedulers.memory.instances import PIECE, InstanceDag

__all__ = ["Binding", "bind", "ALL"]

#: The core of a unit that runs on every core (an unsplit group, a piece read by one).
ALL = -1


@dataclass(frozen=True)
class Binding:
    """Per unit, its core (or :data:`ALL`); the units whose output is read on another core."""

    cores: tuple[int, ...]
    shared: frozenset[int]

    def lanes(self, dag: InstanceDag, order: Sequence[int], cores: int) -> list[list[str]]:
        """The nodes each core's lane runs, in ``order`` (units on every core go to lane 0)."""
        lanes: list[list[str]] = [[] for _ in range(cores)]
        for u in order:
            lanes[max(self.cores[u], 0)].extend(dag.units[u].nodes)
        return [lane for lane in lanes if lane]


def bind(dag: InstanceDag, order: Sequence[int], cores: int) -> Binding:
    """Algorithm 4 over the units of ``dag`` run in ``order`` on ``cores`` cores."""
    core: list[int | None] = [None] * len(dag.units)
    shared: set[int] = set()
    whole = [cores == 1 or (unit.group != PIECE and dag.factor(u) == 1) for u, unit in enumerate(dag.units)]
    for u in reversed(order):
        if whole[u]:
            core[u] = ALL
        elif core[u] is None:
            core[u] = ALL if dag.factor(u) == 1 else (dag.units[u].index * cores) // dag.factor(u)
        for p in dag.preds[u]:
            if core[p] is None and core[u] != ALL and not whole[p]:
                core[p] = core[u]
            elif core[p] != core[u] or core[u] == ALL:
                shared.add(p)
    return Binding(tuple(c if c is not None else ALL for c in core), frozenset(shared))

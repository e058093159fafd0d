"""The one exception hierarchy of opsched.

Every error a user can provoke is an :class:`OpschedError`; messages name the node, op, file
and what was expected, so that the fix is obvious from the message alone.
"""

from __future__ import annotations

__all__ = [
    "OpschedError",
    "GraphError",
    "CycleError",
    "DanglingInputError",
    "DuplicateNameError",
    "ShapeMismatchError",
    "UnknownOpError",
    "FrontendError",
    "UntraceableModuleError",
    "StatefulModelError",
    "UnsupportedOpError",
    "MalformedModelError",
    "ExecutionError",
    "InputMismatchError",
    "ModelNotFoundError",
    "ScheduleError",
    "InvalidScheduleError",
    "ScheduleMismatchError",
    "IllegalMergeError",
    "CostModelError",
    "ProfileStoreError",
]


class OpschedError(Exception):
    """Base class of every error raised by opsched."""


# --- graphs -------------------------------------------------------------------------------
class GraphError(OpschedError):
    """A graph breaks an invariant of the IR (see :meth:`opsched.ir.Graph.verify`)."""


class CycleError(GraphError):
    """The graph has a cycle; the message lists the nodes on it."""


class DanglingInputError(GraphError):
    """A node (or a graph output) reads a value that no node or graph input defines."""


class DuplicateNameError(GraphError):
    """Two values (nodes, graph inputs) share one name."""


class ShapeMismatchError(GraphError):
    """A node's recorded output type differs from what its op's shape rule infers."""


class UnknownOpError(GraphError):
    """A node names an op kind that the op registry does not know."""


# --- frontends ----------------------------------------------------------------------------
class FrontendError(OpschedError):
    """A model could not be imported. ``fixable`` names the tensor arguments whose values, fixed
    (``fixed_values=``), would let it be traced, where the message says so: for a caller that
    says it its own way (the command line's ``--fixed-value``)."""

    def __init__(self, message: str, *, fixable: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fixable = fixable


class UntraceableModuleError(FrontendError):
    """torch.fx could not trace the module (data-dependent control flow and the like)."""


class StatefulModelError(FrontendError):
    """The model's outputs read weights or buffers that its forward changes in place: each call
    depends on the calls before, which a graph of constant weights cannot compute."""


class UnsupportedOpError(FrontendError):
    """The model uses ops that have no converter; ``ops`` lists every one of them."""

    def __init__(self, message: str, ops: list[str]) -> None:
        super().__init__(message)
        self.ops = ops


class MalformedModelError(FrontendError):
    """A model file is truncated, corrupt, or not a model of the expected format."""


class ModelNotFoundError(OpschedError, KeyError):
    """No zoo model of that name."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the sentence
        return str(self.args[0]) if self.args else ""


# --- execution ----------------------------------------------------------------------------
class ExecutionError(OpschedError):
    """A kernel failed while executing a node; the message names the node and op."""


class InputMismatchError(ExecutionError):
    """The inputs given at call time differ in number, shape or dtype from the graph's."""


# --- schedules ----------------------------------------------------------------------------
class ScheduleError(OpschedError):
    """Scheduling failed."""


class InvalidScheduleError(ScheduleError):
    """A schedule breaks an invariant (a node twice or never, a dependency violated, ...)."""


class ScheduleMismatchError(ScheduleError):
    """A schedule was made for a different graph (its structural hash differs)."""


class IllegalMergeError(InvalidScheduleError):
    """A merge stage groups operators that cannot run as one wider convolution."""


# --- cost models --------------------------------------------------------------------------
class CostModelError(OpschedError):
    """A cost model cannot price a stage."""


class ProfileStoreError(CostModelError):
    """The profile store is unusable (not a corrupt file: those are moved aside and rebuilt)."""

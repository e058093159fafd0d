"""Execution: kernels, the reference interpreter (and, later, plans and executors)."""

from opsched.runtime.reference import Interpreter, check_inputs, run_graph

__all__ = ["Interpreter", "check_inputs", "run_graph"]

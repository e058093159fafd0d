"""Execution data and the reference: plans lowered from schedules, stream programs lowered from
plans, kernel binding, and the reference interpreter. Executors are the backends'
(:mod:`opsched.backends`)."""

from opsched.runtime.plan import Phase, Plan, Step, lower, lower_instances, lower_stage
from opsched.runtime.reference import Interpreter, check_inputs, run_graph, stage_inputs

__all__ = ["Interpreter", "Phase", "Plan", "Step", "check_inputs", "lower", "lower_instances", "lower_stage",
           "run_graph", "stage_inputs"]

"""The schedule form: lanes (each with an optional device and backend), waits, merges and
barriers; its checker and its JSON. Schedulers, which make schedules, are in
:mod:`opsched.schedulers`."""

from opsched.schedule.types import FORMAT_VERSION, Lane, Schedule, Stage, Strategy, graph_batch, read_json, write_json
from opsched.schedule.validate import input_types

__all__ = ["FORMAT_VERSION", "Lane", "Schedule", "Stage", "Strategy", "graph_batch", "input_types", "read_json",
           "write_json"]

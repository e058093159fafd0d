"""``opsched optimize MODEL``: search, race the plan against the baselines, write the results.

The table is the race that chose the plan: every schedule in it was a candidate (the searched
ones, sequential and greedy), and the fastest is the one kept, compared round by round ("vs kept":
each schedule's time over the kept one's in the same round, the median over rounds; "= ios": a
plan that runs as ios's does, left out of the race; "cut off": on a CPU, a schedule another beat
by more than 10% in each of its first 3 rounds is timed no more, its figures those of the rounds
it ran); eager PyTorch (for an ONNX file, ONNX Runtime's own session of it) is timed against the
kept plan afterwards. Writes
``schedule.json``, ``timeline.png`` (a Gantt chart of one profiled run: lanes by time, operators
coloured by kind), ``trace.json`` (Chrome/Perfetto) and, where plans raced, ``race.png`` (each
contender's per-round times over the kept plan's, and their medians) under ``--out``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from opsched._text import size
from opsched.cli.main import Handler, add_input_arguments, positive_int, subcommand, torch_import
from opsched.cli.options import add_scheduler_flags, scheduler_values
from opsched.cli.table import format_table

if TYPE_CHECKING:
    import torch

    from opsched.cli.models import LoadedModel
    from opsched.module import ScheduledModule

#: Schedules every comparison races beside the searched ones.
BASELINES = ("sequential", "greedy")


@subcommand("optimize", "search a schedule for MODEL on this machine, race it, write schedule/timeline/trace")
def _setup(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("model", help="zoo name, .onnx file, .pt2 file (torch.export.save), or package.module:factory")
    p.add_argument("--batch", type=positive_int, default=1)
    add_input_arguments(p)
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (lanes on CUDA streams, one CUDA graph)")
    p.add_argument("--dtype", help="float32 (default), float16 or bfloat16: the precision the model runs in")
    p.add_argument("--channels-last", action="store_true", help="4-D weights and inputs in channels-last layout")
    p.add_argument("--no-graphs", action="store_true", help="on CUDA, run eagerly on streams (no CUDA graph)")
    p.add_argument("--scheduler", default="ios", help="ios (the DP), est (list scheduling, milliseconds), greedy, "
                                                       "sequential, nimble or opara; several, comma-separated "
                                                       "(ios,est): their plans race, the fastest is kept")
    p.add_argument("--cost", default="measured", choices=["measured", "analytic"])
    p.add_argument("--backend", default="auto", help="auto, ort, torch or inductor on a CPU; cuda or cuda-inductor "
                                                     "on a GPU; several, comma-separated (cuda,cuda-inductor): the "
                                                     "plans are made on the first and race on each")
    p.add_argument("--rounds", type=positive_int, default=15,
                   help="timed rounds of the race, at most (on a CPU it ends once all plans but one are cut off)")
    p.add_argument("--no-compare", action="store_true",
                   help="race only the searched plans (and sequential); no greedy, no eager PyTorch or "
                        "ONNX Runtime session to compare with")
    p.add_argument("--cache-dir", help="profile store directory")
    p.add_argument("--memory-budget", type=float, metavar="MIB",
                   help="search within, and keep only plans whose live activations peak within, this many MiB")
    p.add_argument("--out", default="opsched-out",
                   help="directory for schedule.json, timeline.png, trace.json, race.png")
    add_scheduler_flags(p)

    def run(args: argparse.Namespace) -> int:
        from opsched.api import optimize_graph
        from opsched.check import placed_inputs
        from opsched.cli.models import load_model
        from opsched.progress import phases
        from opsched.race import race
        from opsched.request import check_request

        names = [name.strip() for name in args.scheduler.split(",")]
        backends = tuple(name.strip() for name in args.backend.split(","))
        options = scheduler_values(args)
        request = check_request(device=args.device, scheduler=names, backend=backends, dtype=args.dtype,
                                **options)
        progress = phases(True)
        loaded = load_model(args.model, args.batch, args.input_shape, args.input_value, torch_import(args))
        module = optimize_graph(loaded.graph, device=args.device, dtype=args.dtype, graphs=not args.no_graphs,
                                channels_last=args.channels_last, scheduler=names, cost=args.cost,
                                backend=backends, cache_dir=args.cache_dir, rounds=args.rounds,
                                race_with=() if args.no_compare else BASELINES, progress=progress,
                                memory_budget=None if args.memory_budget is None else int(args.memory_budget * 2**20),
                                **options)
        print(module.report())
        inputs = placed_inputs(module.graph, loaded.inputs, module.device)
        race_ = module.outcome.race
        if race_ is not None:
            relative = race_.relative  # paired ratios, computed once for the table
            rows = [[name, f"{ms:.2f}", f"{relative[name]:.2f}x",
                     size(race_.peak_bytes[name]) if name in race_.peak_bytes else "",
                     "kept" if name == race_.kept else race_.cut_off(name)] for name, ms in race_.times_ms.items()]
            rows += [[name, "", f"= {other}", "", ""] for name, other in module.outcome.same_plan.items()]
            print(format_table(["schedule", "median ms", "vs kept", "peak activations", ""], rows))
        baseline = None if args.no_compare else _baseline(loaded, module, inputs, request.dtype)
        if baseline is not None:
            name, call = baseline
            calls: dict[str, Callable[[], object]] = {name: call, "kept plan": lambda: module(*inputs)}
            standings = race(calls, clock=module.backend.clock(module.run), rounds=args.rounds,
                             progress=progress(f"timing {name}"))
            ms = standings.medians
            print(f"the kept plan runs {standings.ratio(name, 'kept plan'):.2f}x as fast as {name} "
                  f"({ms['kept plan']:.2f} against {ms[name]:.2f} ms median)")
        _write(args, loaded.name, module, inputs)
        return 0
    return run


def _baseline(loaded: LoadedModel, module: ScheduledModule, inputs: tuple[torch.Tensor, ...],
              dtype: str | None) -> tuple[str, Callable[[], object]] | None:
    """What the kept plan is timed against: the model in eager PyTorch, placed as the plan runs;
    for an ONNX file on a CPU, ONNX Runtime's own session of it (default options: what running
    the file without opsched means), unless the plan runs it in another precision."""
    from opsched.check import placed_model

    if loaded.module is not None and loaded.call is not None:
        moved = any(p.device != t.device for p, t in zip(inputs, loaded.inputs))
        eager = placed_model(loaded.module, module.device, dtype, moved)
        args, kwargs = loaded.call.call(inputs)
        return "eager PyTorch", lambda: eager(*args, **kwargs)
    if loaded.onnx_path is not None and module.device.type == "cpu" and dtype is None:
        import onnxruntime as ort

        try:
            session = ort.InferenceSession(loaded.onnx_path, providers=["CPUExecutionProvider"])
        except Exception as e:  # noqa: BLE001 (ORT's errors share no base class; opsched runs what it lacks)
            print(f"not timed against ONNX Runtime's own session: it cannot run this file "
                  f"({type(e).__name__}: {str(e).strip()})")
            return None
        given = iter(loaded.inputs)  # the graph's inputs, in the file's order, but for those fixed at a value
        feeds = {i.name: np.asarray(loaded.onnx_values[i.name], _NUMPY.get(i.type, i.type[7:-1]))
                 if i.name in loaded.onnx_values else next(given).numpy() for i in session.get_inputs()}
        return "ONNX Runtime's own session", lambda: session.run(None, feeds)
    return None


#: ONNX Runtime's names of element types (``tensor(float)``) that NumPy names otherwise.
_NUMPY = {"tensor(float)": "float32", "tensor(double)": "float64"}


def _write(args: argparse.Namespace, name: str, module: ScheduledModule, inputs: tuple[torch.Tensor, ...]) -> None:
    from opsched.viz import draw_race, draw_timeline, write_chrome_trace

    os.makedirs(args.out, exist_ok=True)
    module.save(os.path.join(args.out, "schedule.json"))
    events = module.profile(*inputs)
    batch = module.schedule.batch  # an .onnx file's may come from --input-shape, not --batch
    title = f"{name}, batch {batch}: {module.schedule.scheduler} schedule on the {module.backend.name} backend"
    race_ = module.outcome.race
    median = race_.times_ms[race_.kept] if race_ is not None else None
    draw_timeline(events, os.path.join(args.out, "timeline.png"), title, median_ms=median)
    write_chrome_trace(events, os.path.join(args.out, "trace.json"), name)
    written = ["schedule.json", "timeline.png", "trace.json"]
    if race_ is not None:
        draw_race(race_, os.path.join(args.out, "race.png"), f"{name}, batch {batch}")
        written.append("race.png")
    print(f"wrote {args.out}/{', '.join(written)}")

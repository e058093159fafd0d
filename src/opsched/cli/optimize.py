"""``opsched optimize MODEL``: search, measure against sequential and greedy, write the results.

Writes ``schedule.json``, ``timeline.png`` (a Gantt chart of one measured run: lanes by time,
operators coloured by kind) and ``trace.json`` (Chrome/Perfetto trace) under ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import os
from collections.abc import Callable

from opsched.cli.main import Handler, positive_int, subcommand
from opsched.cli.options import add_scheduler_flags, scheduler_values
from opsched.cli.table import format_table


@subcommand("optimize", "search a schedule for MODEL on this machine, measure it, write schedule/timeline/trace")
def _setup(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("model", help="zoo name, .onnx file, or package.module:factory")
    p.add_argument("--batch", type=positive_int, default=1)
    p.add_argument("--input-shape", help="for package.module:factory models, e.g. 1,3,224,224")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (lanes on CUDA streams, one CUDA graph)")
    p.add_argument("--dtype", help="float32 (default), float16 or bfloat16: the precision the model runs in")
    p.add_argument("--channels-last", action="store_true", help="4-D weights and inputs in channels-last layout")
    p.add_argument("--no-graphs", action="store_true", help="on CUDA, run eagerly on streams (no CUDA graph)")
    p.add_argument("--scheduler", default="ios", help="ios (the DP), est (list scheduling, milliseconds), greedy, "
                                                       "sequential, nimble or opara; several, comma-separated "
                                                       "(ios,est): their plans race, the fastest is kept")
    p.add_argument("--cost", default="measured", choices=["measured", "analytic"])
    p.add_argument("--backend", default="auto", help="auto, ort or torch on a CPU; cuda on a GPU")
    p.add_argument("--rounds", type=positive_int, default=15, help="timed rounds for the comparison")
    p.add_argument("--cache-dir", help="profile store directory")
    p.add_argument("--out", default="opsched-out", help="directory for schedule.json, timeline.png, trace.json")
    add_scheduler_flags(p)

    def run(args: argparse.Namespace) -> int:
        from opsched.api import optimize_graph, scheduler_options
        from opsched.check import placed_inputs
        from opsched.cli.models import load_model
        from opsched.cost import AnalyticCostModel
        from opsched.module import ScheduledModule
        from opsched.progress import ProgressBar
        from opsched.race import race
        from opsched.schedulers import schedule
        from opsched.viz import draw_timeline, write_chrome_trace

        shape = tuple(int(d) for d in args.input_shape.split(",")) if args.input_shape else None
        loaded = load_model(args.model, args.batch, shape)
        names = [name.strip() for name in args.scheduler.split(",")]
        placement = dict(device=args.device, graphs=not args.no_graphs, channels_last=args.channels_last)
        module = optimize_graph(loaded.graph, dtype=args.dtype, scheduler=names, cost=args.cost,
                                backend=args.backend, cache_dir=args.cache_dir,
                                progress=ProgressBar("searching").update, **placement, **scheduler_values(args))
        graph = module.graph  # placed: on the device, in the precision
        inputs = placed_inputs(graph, loaded.inputs, module.device)
        quick = AnalyticCostModel(module.backend.analytic_spec(module.run))  # baselines need no search
        run_as = dict(backend=module.backend, **placement)
        sequential = schedule(graph, "sequential", quick)
        greedy = schedule(graph, "greedy", quick,
                          scheduler_options(["greedy"], module.device.type, {})["greedy"])
        contenders: dict[str, Callable[[], object]] = {}
        if loaded.module is not None:
            moved = inputs[0] is not loaded.inputs[0]
            eager = copy.deepcopy(loaded.module).to(module.device, inputs[0].dtype) if moved else loaded.module
            contenders["eager PyTorch"] = lambda: eager(*inputs)
        kept = module.schedule
        is_sequential = (kept.lanes, kept.waits, kept.merges, kept.barriers) == (
            sequential.lanes, sequential.waits, sequential.merges, sequential.barriers)
        if not is_sequential:
            seq_module = ScheduledModule(graph, sequential, **run_as)
            contenders["sequential"] = lambda: seq_module(*inputs)
        greedy_module = ScheduledModule(graph, greedy, **run_as)
        contenders["greedy"] = lambda: greedy_module(*inputs)
        contenders["sequential" if is_sequential else f"optimized ({kept.scheduler})"] = lambda: module(*inputs)
        ms = race(contenders, clock=module.backend.clock(module.run), rounds=args.rounds)
        seq = ms["sequential"]
        rows = [[name, f"{t:.2f}", f"{seq / t:.2f}x"] for name, t in ms.items()]
        print(module.report())
        print(format_table(["schedule", "median ms", "vs sequential"], rows))
        os.makedirs(args.out, exist_ok=True)
        module.save(os.path.join(args.out, "schedule.json"))
        events = module.profile(*inputs)
        title = (f"{loaded.name}, batch {args.batch}: {kept.scheduler} schedule "
                 f"on the {module.backend.name} backend")
        draw_timeline(events, os.path.join(args.out, "timeline.png"), title)
        write_chrome_trace(events, os.path.join(args.out, "trace.json"), loaded.name)
        print(f"wrote {args.out}/schedule.json, timeline.png, trace.json")
        return 0
    return run

"""``opsched optimize MODEL``: search, measure against sequential and greedy, write the results.

Writes ``schedule.json``, ``timeline.png`` (a Gantt chart of one measured run: lanes by time,
operators coloured by kind) and ``trace.json`` (Chrome/Perfetto trace) under ``--out``.
"""

from __future__ import annotations

import argparse
import copy
import os

from opsched.cli.main import Handler, subcommand
from opsched.cli.table import format_table


@subcommand("optimize", "search a schedule for MODEL on this machine, measure it, write schedule/timeline/trace")
def _setup(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("model", help="zoo name, .onnx file, or package.module:factory")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--input-shape", help="for package.module:factory models, e.g. 1,3,224,224")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (lanes on CUDA streams, one CUDA graph)")
    p.add_argument("--dtype", help="float32 (default), float16 or bfloat16: the precision the model runs in")
    p.add_argument("--channels-last", action="store_true", help="4-D weights and inputs in channels-last layout")
    p.add_argument("--no-graphs", action="store_true", help="on CUDA, run eagerly on streams (no CUDA graph)")
    p.add_argument("--scheduler", default="ios", help="ios (the DP), est (list scheduling, milliseconds), greedy, "
                                                       "sequential, nimble or opara; several, comma-separated "
                                                       "(ios,est): their plans race, the fastest is kept")
    p.add_argument("--cost", default="measured", choices=["measured", "analytic"])
    p.add_argument("--backend", default="auto", choices=["auto", "ort", "torch"])
    p.add_argument("--max-group-size", type=int, default=3, help="r: units per group")
    p.add_argument("--max-groups", type=int, help="s: groups per stage, or est's lanes (default: the number of cores)")
    p.add_argument("--budget", type=float, help="search seconds; then unsolved parts use greedy or sequential")
    p.add_argument("--rounds", type=int, default=15, help="timed rounds for the comparison")
    p.add_argument("--cache-dir", help="profile store directory")
    p.add_argument("--out", default="opsched-out", help="directory for schedule.json, timeline.png, trace.json")

    def run(args: argparse.Namespace) -> int:
        from opsched.api import optimize_graph, race
        from opsched.cli.models import load_model
        from opsched.progress import ProgressBar
        from opsched.runtime.module import ScheduledModule
        from opsched.schedule import schedule
        from opsched.viz import draw_timeline, write_chrome_trace

        shape = tuple(int(d) for d in args.input_shape.split(",")) if args.input_shape else None
        loaded = load_model(args.model, args.batch, shape)
        graph = loaded.graph
        names = [name.strip() for name in args.scheduler.split(",")]
        options: dict[str, object] = {}
        if "ios" in names:
            options.update(max_group_size=args.max_group_size, budget_s=args.budget,
                           progress=ProgressBar("searching").update)
            if args.max_groups is not None:
                options["max_groups"] = args.max_groups
        if "est" in names and args.max_groups is not None:
            options["max_lanes"] = args.max_groups
        placement = dict(device=args.device, graphs=not args.no_graphs, channels_last=args.channels_last)
        module = optimize_graph(graph, dtype=args.dtype, scheduler=names, cost=args.cost,
                                backend=args.backend, cache_dir=args.cache_dir, **placement, **options)
        from opsched.api import host_cpu_model, placed_inputs

        graph = module.graph  # placed: on the device, in the precision
        inputs = placed_inputs(graph, loaded.inputs, module.device)
        quick = host_cpu_model()  # baselines need no search: any cost model gives the same stages
        contenders: dict[str, object] = {}
        sequential = schedule(graph, "sequential", quick)
        run_as = dict(backend=args.backend, **placement)
        if module.schedule.stages != sequential.stages:  # else the optimized row is the sequential plan
            contenders["sequential"] = ScheduledModule(graph, sequential, **run_as)
        contenders["greedy"] = ScheduledModule(graph, schedule(graph, "greedy", quick, max_streams=os.cpu_count() or 1),
                                               **run_as)
        contenders["sequential" if "sequential" not in contenders and module.schedule.scheduler == "sequential"
                   else f"optimized ({module.schedule.scheduler})"] = module
        if loaded.module is not None:
            moved = inputs[0] is not loaded.inputs[0]
            eager = copy.deepcopy(loaded.module).to(module.device, inputs[0].dtype) if moved else loaded.module
            contenders = {"eager PyTorch": eager, **contenders}
        times = race(*contenders.values(), inputs=inputs, rounds=args.rounds)  # type: ignore[arg-type]
        ms = dict(zip(contenders, times))
        seq = ms["sequential"]
        rows = [[name, f"{t:.2f}", f"{seq / t:.2f}x"] for name, t in ms.items()]
        print(module.report())
        print(format_table(["schedule", "median ms", "vs sequential"], rows))
        os.makedirs(args.out, exist_ok=True)
        module.save(os.path.join(args.out, "schedule.json"))
        events = module.profile(*inputs)
        title = (f"{loaded.name}, batch {args.batch}: {module.schedule.scheduler} schedule "
                 f"on the {module.backend} backend")
        draw_timeline(events, os.path.join(args.out, "timeline.png"), title)
        write_chrome_trace(events, os.path.join(args.out, "trace.json"), loaded.name)
        print(f"wrote {args.out}/schedule.json, timeline.png, trace.json")
        return 0
    return run

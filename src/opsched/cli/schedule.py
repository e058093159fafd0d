"""``opsched schedule MODEL``: search a schedule with an analytic cost model and print it."""

from __future__ import annotations

import argparse

from opsched.cli.main import Handler, add_input_arguments, positive_int, subcommand, torch_import
from opsched.cli.options import add_scheduler_flags, scheduler_values
from opsched.cli.table import format_table


@subcommand("schedule", "search a schedule under an analytic cost model and print it with search statistics")
def _setup(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("model", help="zoo name, .onnx file, .pt2 file (torch.export.save), or package.module:factory")
    p.add_argument("--batch", type=positive_int, default=1)
    add_input_arguments(p)
    p.add_argument("--device", default="V100",
                   help="analytic device preset (V100, A100, H100, H200, RTX3090, K80, CPU2, CPU16)")
    p.add_argument("--scheduler", default="ios", help="ios, est, greedy, sequential, nimble or opara")
    p.add_argument("--out", help="write the schedule as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no schedule listing")
    p.add_argument("--memory-budget", type=float, metavar="MIB",
                   help="IOS: admit only stages whose live activations stay within this many MiB")
    add_scheduler_flags(p)

    def run(args: argparse.Namespace) -> int:
        from opsched.cli.models import load_model
        from opsched.cost import AnalyticCostModel
        from opsched.progress import ProgressBar
        from opsched.request import scheduler_options
        from opsched.schedulers import schedule
        from opsched.schedulers.simulate import simulate

        cost = AnalyticCostModel(args.device)
        kind = cost.spec.kind
        values = scheduler_values(args)
        if args.memory_budget is not None:
            values["memory_budget"] = int(args.memory_budget * 2**20)
        options = scheduler_options([args.scheduler], kind, values, cores=cost.spec.slots)
        graph = load_model(args.model, args.batch, args.input_shape, args.input_value, torch_import(args)).graph
        results = {name: schedule(graph, name, cost) for name in ("sequential", "greedy") if name != args.scheduler}
        chosen = results[args.scheduler] = schedule(graph, args.scheduler, cost, options[args.scheduler],
                                                    progress=ProgressBar("searching", enabled=not args.quiet).update)
        if not args.quiet:
            print(chosen)
        # estimates come from each scheduler's own model (stage sums, or est's plan); the
        # simulation replays every schedule under one resource model, so it compares them all
        sim = {name: simulate(graph, s, cost.resources(graph, s.merges)).makespan_ms for name, s in results.items()}
        rows = [[name, "-" if s.estimated_ms is None else f"{s.estimated_ms:.3f}", f"{sim[name]:.3f}",
                 f"{sim['sequential'] / sim[name]:.2f}x",
                 f"{len(s.stages)} stages" if s.stages is not None else f"{len(s.lanes)} lanes"]
                for name, s in results.items()]
        print(format_table(["schedule", f"estimated ms ({cost.device})", "simulated ms", "vs sequential", "shape"],
                           rows))
        if chosen.stats:
            print(f"{args.scheduler}: " + ", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                                                  for k, v in chosen.stats.items()))
        if args.out:
            chosen.save(args.out)
            print(f"wrote {args.out}")
        return 0
    return run

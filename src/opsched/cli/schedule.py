"""``opsched schedule MODEL``: search a schedule with a cost model and print it."""

from __future__ import annotations

import argparse

from opsched.cli.main import Handler, subcommand
from opsched.cli.table import format_table


@subcommand("schedule", "search a schedule under a cost model and print it with search statistics")
def _setup(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("model", help="zoo name, .onnx file, or package.module:factory")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--device", default="V100",
                   help="analytic device preset (V100, A100, H100, H200, RTX3090, K80, CPU2, CPU16)")
    p.add_argument("--scheduler", default="ios", help="ios, est, greedy, sequential, nimble or opara")
    p.add_argument("--max-group-size", type=int, default=3, help="r: units per group")
    p.add_argument("--max-groups", type=int, default=8, help="s: groups per stage, or est's lanes")
    p.add_argument("--max-part-size", type=int, default=50)
    p.add_argument("--budget", type=float, help="seconds; past it, unsolved parts use the greedy schedule")
    p.add_argument("--out", help="write the schedule as JSON here")
    p.add_argument("--quiet", action="store_true", help="no progress bar, no schedule listing")

    def run(args: argparse.Namespace) -> int:
        from opsched.cost import AnalyticCostModel
        from opsched.progress import ProgressBar
        from opsched.schedule import schedule
        from opsched.schedule.simulate import simulate

        from opsched.cli.models import load_model

        graph = load_model(args.model, args.batch).graph
        cost = AnalyticCostModel(args.device)
        options: dict[str, object] = {}
        if args.scheduler == "ios":
            options = dict(max_group_size=args.max_group_size, max_groups=args.max_groups,
                           max_part_size=args.max_part_size, budget_s=args.budget)
            options["progress"] = ProgressBar("searching", enabled=not args.quiet).update
        elif args.scheduler == "est":
            options = dict(max_lanes=args.max_groups)
        results = {name: schedule(graph, name, cost) for name in ("sequential", "greedy") if name != args.scheduler}
        chosen = results[args.scheduler] = schedule(graph, args.scheduler, cost, **options)
        if not args.quiet:
            print(chosen)
        # estimates come from each scheduler's own model (stage sums, or est's plan); the
        # simulation replays every schedule under one resource model, so it compares them all
        sim = {name: simulate(graph, s, cost.resources(graph, s.merged)).makespan_ms for name, s in results.items()}
        rows = [[name, "-" if s.estimated_ms is None else f"{s.estimated_ms:.3f}", f"{sim[name]:.3f}",
                 f"{sim['sequential'] / sim[name]:.2f}x",
                 f"{len(s.lanes)} lanes" if s.lanes is not None else f"{len(s.stages)} stages"]
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

"""``opsched show schedule.json``: print a saved schedule and draw its simulated timeline."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from opsched.cli.main import Handler, subcommand

if TYPE_CHECKING:
    from opsched.schedule import Schedule


@subcommand("show", "print a saved schedule; with --png, draw its timeline simulated on an analytic device")
def _setup(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("schedule", help="a schedule.json written by opsched")
    p.add_argument("--model", help="the model it was made for (default: the zoo model named in the file)")
    p.add_argument("--device", help="analytic device preset for the picture (default: the schedule's, or V100)")
    p.add_argument("--png", help="write the simulated timeline here")

    def run(args: argparse.Namespace) -> int:
        from opsched.schedule import Schedule

        sched = Schedule.load(args.schedule)
        print(sched)
        if args.png:
            _draw(sched, args)
        return 0
    return run


def _draw(sched: Schedule, args: argparse.Namespace) -> None:
    from opsched.cli.models import load_model
    from opsched.cost import DEVICES, AnalyticCostModel
    from opsched.schedulers.simulate import simulate
    from opsched.viz import draw_timeline

    loaded = load_model(args.model or sched.graph_name, sched.batch)
    sched.validate(loaded.graph)
    device = args.device or (sched.device if sched.device in DEVICES else "V100")
    cost = AnalyticCostModel(device)
    sim = simulate(loaded.graph, sched, cost.resources(loaded.graph, sched.merges))
    draw_timeline(sim.events, args.png, f"{sched.graph_name}: {sched.scheduler} schedule, simulated on {device} "
                                        f"({sim.makespan_ms:.2f} ms)")
    print(f"simulated makespan on {device}: {sim.makespan_ms:.3f} ms; wrote {args.png}")

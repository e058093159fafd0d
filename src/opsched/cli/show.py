"""``opsched show schedule.json``: print a saved schedule and draw its simulated timeline."""

from __future__ import annotations

import argparse

from opsched.cli.main import Handler, subcommand


@subcommand("show", "print a saved schedule; with --png, draw its timeline as the analytic model sees it")
def _setup(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("schedule", help="a schedule.json written by opsched")
    p.add_argument("--model", help="the model it was made for (default: the zoo model named in the file)")
    p.add_argument("--device", help="analytic device preset for the picture (default: the schedule's, or V100)")
    p.add_argument("--png", help="write the simulated timeline here")

    def run(args: argparse.Namespace) -> int:
        from opsched.schedule.types import Schedule

        sched = Schedule.load(args.schedule)
        print(sched)
        if args.png:
            _draw(sched, args)
        return 0
    return run


def _draw(sched, args: argparse.Namespace) -> None:  # type: ignore[no-untyped-def]
    from opsched.cli.models import load_model
    from opsched.cost import DEVICES, AnalyticCostModel
    from opsched.runtime.cpu import TraceEvent
    from opsched.schedule.coster import StageCoster
    from opsched.viz import draw_timeline

    loaded = load_model(args.model or sched.graph_name, sched.batch)
    sched.validate(loaded.graph)
    device = args.device or (sched.device if sched.device in DEVICES else "V100")
    cost = AnalyticCostModel(device)
    coster = StageCoster(loaded.graph, cost)
    events, now = [], 0.0
    for k, stage in enumerate(sched.stages):
        length = coster.latency(stage)
        for lane, group in enumerate(stage.groups):
            execs = [cost.op_cost(loaded.graph, loaded.graph.node(v)).exec_ms for v in group]
            scale = length / max(sum(execs), 1e-12) if stage.strategy == "parallel" else 0.0
            t = now
            for v, e in zip(group, execs):
                d = e * min(scale, 1.0) if stage.strategy == "parallel" else length
                op = "conv2d(merged)" if stage.strategy == "merge" else loaded.graph.node(v).op
                events.append(TraceEvent(k, lane, v, op, t, t + d))
                t += d
        now += length
    draw_timeline(events, args.png, f"{sched.graph_name}: {sched.scheduler} schedule, simulated on {device}")
    print(f"wrote {args.png}")

"""Specialization: is a schedule made for one batch size (or device) worse at another?

Reproduces the two specialization tables of IOS (Inception V3; a schedule optimised for batch
1/32/128 run at each batch size; one optimised for one device run on another). Every schedule
is the IOS dynamic program's; a schedule made for batch ``b`` runs at batch ``b'`` through
``Schedule.retarget`` (same nodes, other shapes).

*Simulated* (always): schedules made with a device preset's analytic model, replayed by the
simulator under each preset's resource model. *Measured* (``--measure``, needs a GPU): the
same schedules, plus schedules made by measuring stages on this GPU, run by the CUDA executor
(whole plan captured into one CUDA graph), timed with CUDA events, interleaved. ``--save DIR``
keeps the measured schedules as JSON; ``--schedules DIR`` runs schedules saved on another GPU
here too, which is how the H100-vs-H200 cross table is taken (two machines, two runs).

    python benchmarks/specialization.py                                   # simulated
    python benchmarks/specialization.py --measure --save runs/h100        # on a GPU
    python benchmarks/specialization.py --measure --schedules runs/h100   # on another GPU
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import RESULTS, write  # noqa: E402

import opsched  # noqa: E402
from opsched.cli.table import format_table  # noqa: E402
from opsched.cost import AnalyticCostModel  # noqa: E402
from opsched.ir import Graph  # noqa: E402
from opsched.models import example_inputs, get_model  # noqa: E402
from opsched.schedule import Schedule  # noqa: E402
from opsched.schedulers import schedule  # noqa: E402
from opsched.schedulers.simulate import simulate  # noqa: E402


def simulated_ms(graph: Graph, sched: Schedule, device: str) -> float:
    cost = AnalyticCostModel(device)
    sched = sched.retarget(graph)
    return simulate(graph, sched, cost.resources(graph, sched.merges)).makespan_ms


def matrix(title: str, row_label: str, labels: list[str], cols: list[str], cell: dict[tuple[str, str], float],
           stages: dict[str, int]) -> str:
    """Rows: made for; columns: run at. Each cell with its ratio to the column's own schedule."""
    rows = []
    for r in labels:
        row: list[object] = [r, stages.get(r, "")]
        for c in cols:
            own = cell.get((c, c))
            v = cell[(r, c)]
            mark = "**" if r == c else ""
            row.append(f"{mark}{v:.3f}{mark}" + (f" ({v / own:.3f}x)" if own and r != c else ""))
        rows.append(row)
    return f"### {title}\n\n" + format_table([row_label, "stages", *cols], rows) + "\n"


def batch_table(name: str, batches: list[int], device: str, budget: float) -> tuple[str, dict[str, Any]]:
    model = get_model(name)
    graphs = {b: opsched.from_torch(model, example_inputs(name, batch=b)) for b in batches}
    made = {b: schedule(graphs[b], "ios", AnalyticCostModel(device), budget_s=budget) for b in batches}
    cell = {(str(b), str(c)): simulated_ms(graphs[c], made[b], device) for b in batches for c in batches}
    labels = [str(b) for b in batches]
    md = matrix(f"{name}, {device} preset, simulated: made for batch (rows), run at batch (columns), ms",
                "made for", labels, labels, cell, {str(b): len(made[b].stages or ()) for b in batches})
    return md, {"model": name, "device": device, "ms": {f"{r}->{c}": v for (r, c), v in cell.items()},
                "stages": {str(b): len(made[b].stages or ()) for b in batches}}


def device_table(name: str, devices: list[str], budget: float) -> tuple[str, dict[str, Any]]:
    graph = opsched.from_torch(get_model(name), example_inputs(name))
    made = {d: schedule(graph, "ios", AnalyticCostModel(d), budget_s=budget) for d in devices}
    cell = {(r, c): simulated_ms(graph, made[r], c) for r in devices for c in devices}
    md = matrix(f"{name}, batch 1, simulated: made for device (rows), run on device (columns), ms",
                "made for", devices, devices, cell, {d: len(made[d].stages or ()) for d in devices})
    return md, {"model": name, "ms": {f"{r}->{c}": v for (r, c), v in cell.items()},
                "stages": {d: len(made[d].stages or ()) for d in devices}}


def cuda_ms(module: Any, x: tuple[torch.Tensor, ...], rounds: int) -> float:
    """Median of ``rounds`` calls, each timed with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(rounds):
        start.record()
        module(*x)
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end))
    return statistics.median(samples)


def measured_table(name: str, batches: list[int], budget: float, rounds: int, save: Path | None,
                   foreign: Path | None) -> tuple[str, dict[str, Any]]:
    from opsched.backends.cuda import gpu_preset
    from opsched.module import ScheduledModule

    gpu = torch.cuda.get_device_name()
    preset = gpu_preset(gpu).name
    model = get_model(name)
    graphs = {b: opsched.from_torch(model, example_inputs(name, batch=b)) for b in batches}
    placed = {b: opsched.place(g, "cuda") for b, g in graphs.items()}
    made: dict[str, Schedule] = {}
    for b in batches:
        t = time.perf_counter()
        made[f"measured b{b}"] = opsched.optimize_graph(placed[b], device="cuda", scheduler="ios", budget_s=budget,
                                                        check=False).schedule
        print(f"  {name} batch {b}: measured DP in {time.perf_counter() - t:.1f} s", flush=True)
        made[f"{preset} preset b{b}"] = schedule(placed[b], "ios", AnalyticCostModel(preset), budget_s=budget)
        if save is not None:
            save.mkdir(parents=True, exist_ok=True)
            made[f"measured b{b}"].save(save / f"{name}-b{b}.json")
        if foreign is not None and (foreign / f"{name}-b{b}.json").exists():
            other = Schedule.load(foreign / f"{name}-b{b}.json")
            made[f"{other.device.split(' sm_')[0]} b{b}"] = other
    cell: dict[tuple[str, str], float] = {}
    for b in batches:
        x = tuple(t.cuda() for t in example_inputs(name, batch=b))
        modules = {k: ScheduledModule(placed[b], s.retarget(placed[b]), device="cuda") for k, s in made.items()}
        for module in modules.values():  # capture, warm up
            module(*x)
        samples: dict[str, list[float]] = {k: [] for k in modules}
        for _ in range(5):  # interleaved
            for k, module in modules.items():
                samples[k].append(cuda_ms(module, x, rounds))
        for k in modules:
            cell[(k, str(b))] = statistics.median(samples[k])
        print(f"  {name} batch {b}: " + ", ".join(f"{k} {cell[(k, str(b))]:.3f}" for k in modules), flush=True)
    labels = list(made)
    cols = [str(b) for b in batches]
    rows = [[k, len(made[k].stages or ()), *(f"{cell[(k, c)]:.3f}" for c in cols)] for k in labels]
    md = (f"### {name} on {gpu}, measured (CUDA-graph replays, CUDA events, median), ms\n\n"
          + format_table(["schedule", "stages", *(f"batch {c}" for c in cols)], rows) + "\n")
    return md, {"model": name, "gpu": gpu, "ms": {f"{k}@{c}": v for (k, c), v in cell.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["inception_v3"])
    p.add_argument("--batches", nargs="*", type=int, default=[1, 32, 128])
    p.add_argument("--device", default="H100", help="preset of the simulated batch table")
    p.add_argument("--devices", nargs="*", default=["V100", "K80", "H100", "H200"])
    p.add_argument("--budget", type=float, default=60.0, help="seconds of DP search per schedule")
    p.add_argument("--measure", action="store_true", help="also measure on this machine's GPU")
    p.add_argument("--rounds", type=int, default=20)
    p.add_argument("--save", type=Path, help="write the measured schedules here")
    p.add_argument("--schedules", type=Path, help="also run the schedules another GPU saved here")
    p.add_argument("--name", default="specialization")
    p.add_argument("--out", type=Path, default=RESULTS, help="results folder (default docs/results)")
    args = p.parse_args()
    sections, data = ["# Specialization", "", __doc__.split("\n\n")[1], ""], {"batch": [], "device": [],
                                                                              "measured": []}
    for name in args.models:
        md, rec = batch_table(name, args.batches, args.device, args.budget)
        sections.append(md)
        data["batch"].append(rec)
        md, rec = device_table(name, args.devices, args.budget)
        sections.append(md)
        data["device"].append(rec)
        print(md, flush=True)
    name = args.name
    if args.measure:
        if not torch.cuda.is_available():
            raise SystemExit("--measure needs a GPU (torch.cuda.is_available() is False)")
        for model in args.models:
            md, rec = measured_table(model, args.batches, args.budget, args.rounds, args.save, args.schedules)
            sections.append(md)
            data["measured"].append(rec)
        name = f"{args.name}-{torch.cuda.get_device_name().replace(' ', '_')}"
    md_path, _ = write(name, "\n".join(sections), data, args.out)
    print(f"wrote {md_path}")


if __name__ == "__main__":
    main()

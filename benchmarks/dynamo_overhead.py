"""What a call through ``torch.compile(model, backend="opsched")`` costs beyond the plan it runs,
at batch 1 on this CPU (or a GPU: ``--device cuda``).

The backend runs the plan ``optimize()`` would make, but each call first passes through Dynamo:
its compiled frame evaluates its guards, gathers the weights it lifted out of the model (every
parameter and buffer, passed to the graph as arguments), then calls the backend, which checks
that those weights are the ones its schedule was made with. Per model, interleaved in one
process in a fresh order each round (:func:`opsched.timing.interleave`: 50 ms of sleep, then one
untimed call and ``--block`` timed ones, their median the round's sample):

- *optimize()*: what ``opsched.optimize`` returns;
- *backend*: the model through ``torch.compile(backend="opsched")``, and *backend, guards
  skipped*: called under ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``, which runs
  only the guards that tell a function's compiled graphs apart (the backend's own checks of the
  weights and shapes stay; ``guard_filter_fn=torch.compiler.skip_all_guards_unsafe`` would drop
  every guard, so that graphs compiled from the same code for two models, or by two backends,
  answer each other's calls);
- *optimize() + Dynamo*: what ``optimize()`` returns, then the model through ``torch.compile``
  with a backend whose graph returns outputs computed once: Dynamo's work alone, done, as the
  backend's is, right after a run has filled the caches with the model's weights and
  activations (*Dynamo, warm*: the same call alone, back to back; *guards skipped*: under the
  stance above).

Ratios are medians of per-round ratios to *optimize()* (> 1: slower than it); *Dynamo after a
run* is the median per-round difference of *optimize() + Dynamo* and *optimize()*.

    python benchmarks/dynamo_overhead.py
    python benchmarks/dynamo_overhead.py --models nasnet_mobile bert --rounds 21
    python benchmarks/dynamo_overhead.py --device cuda --dtype float16 --name dynamo-overhead-gpu

On a GPU each call is timed to the end of its work (synchronized before and after); there the
plan is a CUDA graph, launched in microseconds, so Dynamo's work before the launch adds to a
call in full, while in *optimize() + Dynamo* it overlaps the graph running.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import RESULTS, each_model, geomean, placed_model, write_table  # noqa: E402
from torch import fx  # noqa: E402

import opsched  # noqa: E402
import opsched.dynamo as od  # noqa: E402
from opsched.timing import interleave, paired_ratio, synchronized, wall_ms  # noqa: E402


def _outputs_once(gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    """A ``torch.compile`` backend whose graph returns the outputs of its first call: around it,
    a call costs what Dynamo does alone."""
    outputs = gm(*example_inputs)
    return lambda *args: outputs


def _guards_skipped(call: Callable[[], object]) -> Callable[[], object]:
    """``call`` under ``set_stance(skip_guard_eval_unsafe=True)``."""
    def skipped() -> object:
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            return call()
    return skipped


def _plan(summary: object, backend: str | None) -> str:
    return f"{summary} on {backend}"


def run(name: str, rounds: int, block: int, budget: float, cost: str | None, device: torch.device,
        dtype: str) -> tuple[list[object], dict[str, object]]:
    model, inputs = placed_model(name, str(device), dtype)
    weights = sum(1 for _ in model.parameters()) + sum(1 for _ in model.buffers())
    torch._dynamo.reset()
    od.reset()
    with tempfile.TemporaryDirectory() as store, torch.no_grad():
        settings = {"budget_s": budget, "progress": False, "cache_dir": store, **({"cost": cost} if cost else {})}
        opt = opsched.optimize(model, inputs, device=device, **settings)  # type: ignore[arg-type]
        compiled = torch.compile(copy.deepcopy(model), backend="opsched", options=settings)
        stub = torch.compile(copy.deepcopy(model), backend=_outputs_once)
        compiled(*inputs), stub(*inputs)  # compiled (and scheduled) here: skipping guards, Dynamo may not compile
        calls: dict[str, Callable[[], object]] = {
            "optimize()": lambda: opt(*inputs),
            "backend": lambda: compiled(*inputs),
            "backend, guards skipped": _guards_skipped(lambda: compiled(*inputs)),
            "optimize() + Dynamo": lambda: (opt(*inputs), stub(*inputs)),
            "optimize() + Dynamo, guards skipped": lambda: (opt(*inputs), _guards_skipped(lambda: stub(*inputs))()),
            "Dynamo, warm": lambda: stub(*inputs),
        }
        clock = synchronized(torch.cuda.synchronize) if device.type == "cuda" else wall_ms
        times = interleave(calls, rounds, warmup=1, settle_s=0.05, block=block, clock=clock)
    graphs = od.compiled_graphs()
    if any(g.recompiles or g.buckets[0].schedule is None for g in graphs):
        raise SystemExit(f"{name}: the backend recompiled, or ran a graph eagerly, while it was timed:\n"
                         f"{od.report()}")
    # Two searches can settle on two plans (a race of measured candidates decides by noise where they
    # are close), and then the ratio is the plans' and not the call's: said in its own column
    plans = [_plan(b.schedule, b.backend) for g in graphs for b in g.buckets]
    plan = _plan(opt.report().schedule, opt.report().backend)
    same = plans == [plan]
    if not same:
        print(f"{name}: the backend's plan differs from optimize()'s {plan}: {plans}", file=sys.stderr)
    ms = {k: statistics.median(v) for k, v in times.items()}
    vs = {k: paired_ratio(times[k], times["optimize()"]) for k in times if k not in ("optimize()", "Dynamo, warm")}
    after = {k: statistics.median(a - b for a, b in zip(times[f"optimize() + Dynamo{k}"], times["optimize()"]))
             for k in ("", ", guards skipped")}
    row: list[object] = [name, weights, len(graphs), "same" if same else "differs", f"{ms['optimize()']:.2f}",
                         f"{ms['backend']:.2f}",
                         *(f"{vs[k]:.3f}" for k in vs), f"{after['']:.2f}", f"{after[', guards skipped']:.2f}",
                         f"{ms['Dynamo, warm']:.2f}"]
    return row, {"model": name, "weights": weights, "graphs": len(graphs), "plan": plan, "backend_plans": plans,
                 "same_plan": same, "median_ms": ms, "vs_optimize": vs,
                 "dynamo_after_a_run_ms": after[""], "dynamo_after_a_run_guards_skipped_ms": after[", guards skipped"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["squeezenet1_1", "randwire_small", "googlenet", "inception_v3",
                                                   "nasnet_mobile", "bert", "gpt2"])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--block", type=int, default=11, help="timed calls per contender's turn (their median)")
    p.add_argument("--budget", type=float, default=10.0, help="seconds of IOS search per schedule")
    p.add_argument("--cost", choices=["analytic", "measured"], help="both builds' cost model (default: optimize()'s); "
                   "analytic costs make the same plan twice, where measured ones race plans and can keep two")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the model and its inputs placed there")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--name", default="dynamo-overhead")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the .md and .json go")
    args = p.parse_args()
    device = torch.device(args.device)
    rows, records = each_model(args.models, lambda name: run(name, args.rounds, args.block, args.budget, args.cost,
                                                             device, args.dtype))
    headers = ["model", "weights", "graphs", "plan", "optimize() ms", "backend ms", "backend",
               "backend, guards skipped", "optimize() + Dynamo", "optimize() + Dynamo, guards skipped",
               "Dynamo after a run ms", "guards skipped ms", "Dynamo, warm ms"]
    geo = {k: geomean(float(r["vs_optimize"][k]) for r in records)  # type: ignore[index]
           for k in ("backend", "backend, guards skipped", "optimize() + Dynamo")}
    write_table(args.name, [
        "# What a call through torch.compile(backend=\"opsched\") costs", "",
        f"Batch 1 on {args.device} in {args.dtype}, {args.cost or 'measured'} costs; medians over interleaved "
        "rounds in one process (see "
        "`benchmarks/dynamo_overhead.py`). *weights*: the parameters and buffers Dynamo lifts and passes to the "
        "graph each call; *graphs*: the graphs it captures; *plan*: whether the backend runs the plan "
        "`optimize()` made (its schedule and backend) or another its own search settled on. *backend*, "
        "*backend, guards skipped* (called under "
        "`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`) and *optimize() + Dynamo* (what `optimize()` "
        "returns, then Dynamo's work alone: the model compiled with a backend that returns outputs computed "
        "once): median per-round ratios to `optimize()`'s time, > 1 slower. *Dynamo after a run*: the median "
        "per-round difference of *optimize() + Dynamo* and *optimize()*, so Dynamo's call with the caches "
        "full of the run's weights and activations, as a compiled model meets it; *Dynamo, warm*: that call "
        "back to back.",
    ], headers, rows, {f"{k} vs optimize()": v for k, v in geo.items()},
        {"rows": records, "rounds": args.rounds, "block": args.block, "budget_s": args.budget,
         "cost": args.cost}, args.out)

if __name__ == "__main__":
    main()

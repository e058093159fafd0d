"""Serving from several threads: one module called at once by T threads, as a server's request
threads call one model, against the eager model called the same way.

Per model and thread count, each contender in turn, in a fresh order each round: T threads,
started together, each make ``--calls`` calls on inputs of their own (the example's, its floats
drawn anew and its integers shuffled, per thread), and the wall time of all of them gives calls
per second (the median over ``--rounds`` rounds). Every output of every call is held against
eager's output for the same input (``opsched.testing.mismatch``'s tolerances): *wrong* counts
the calls that differ, over every round and thread count. Contenders:

- *eager*: the model itself, under ``torch.no_grad()``;
- *optimize()*: what ``opsched.optimize`` returns, with its defaults (a measured search and race);
- *lanes*: the plan of the EST list scheduler under the analytic cost model of a V100, whose lanes
  wait on each other's steps, run on ONNX Runtime on this CPU: not a fast plan here, but the one
  that exercises the lane workers each concurrent call takes (calls sharing one set of them had
  hung: ``src/opsched/backends/lanes.py``).

    python benchmarks/threads.py
    python benchmarks/threads.py --models bert googlenet --threads 1 4 --rounds 5
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import RESULTS, each_model, geomean, write_table  # noqa: E402

import opsched  # noqa: E402
from opsched.cost import AnalyticCostModel  # noqa: E402
from opsched.models import example_inputs, get_model, list_models  # noqa: E402
from opsched.testing import mismatch  # noqa: E402
from opsched.testing.corpus import corpus  # noqa: E402

CONTENDERS = ("eager", "optimize()", "lanes")


def model_and_inputs(name: str) -> tuple[torch.nn.Module, tuple[torch.Tensor, ...]]:
    if name in list_models():
        return get_model(name).eval(), tuple(example_inputs(name))
    model, inputs = corpus()[name].build()
    return model.eval(), tuple(inputs)


def varied(inputs: Sequence[torch.Tensor], seed: int) -> tuple[torch.Tensor, ...]:
    """The example inputs, their floating-point tensors drawn anew and their integer ones (token
    ids, masks) shuffled along the last dimension: valid values, another input per seed."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in inputs:
        if t.is_floating_point():
            out.append(torch.randn(t.shape, generator=g, dtype=t.dtype))
        elif t.dim() and t.shape[-1] > 1:
            out.append(t[..., torch.randperm(t.shape[-1], generator=g)].contiguous())
        else:
            out.append(t.clone())
    return tuple(out)


def served(call: Callable[..., Any], inputs: list[tuple[torch.Tensor, ...]], expected: list[Any],
           calls: int) -> tuple[float, int]:
    """``len(inputs)`` threads at once, each calling ``call`` ``calls`` times on its own inputs:
    the calls per second of all of them, and how many calls differed from eager's outputs (each
    call's outputs kept, and checked after the timed calls: checked as they came, the checks
    took longer than the calls of a small model and made their rate)."""
    start = threading.Barrier(len(inputs) + 1)
    made: list[list[Any]] = [[] for _ in inputs]
    errors: list[BaseException] = []

    def serve(k: int) -> None:
        start.wait()
        try:
            with torch.no_grad():
                for _ in range(calls):
                    made[k].append(call(*inputs[k]))
        except BaseException as e:  # reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=serve, args=(k,), daemon=True) for k in range(len(inputs))]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    deadline = began + 600
    for t in threads:
        t.join(timeout=max(0.0, deadline - time.perf_counter()))
    if any(t.is_alive() for t in threads):
        raise SystemExit(f"{len(inputs)} threads' calls did not end in 600 s: hung")
    rate = len(inputs) * calls / (time.perf_counter() - began)
    if errors:
        raise errors[0]
    return rate, sum(1 for outs, want in zip(made, expected) for out in outs if mismatch(out, want))


def run(name: str, threads: Sequence[int], calls: int, rounds: int, budget: float
        ) -> tuple[list[object], dict[str, Any]]:
    model, inputs = model_and_inputs(name)
    module = opsched.optimize(model, inputs, budget_s=budget, progress=False)
    lanes = opsched.optimize(model, inputs, scheduler="est", cost=AnalyticCostModel("V100"), backend="ort",
                             verify=False, progress=False, max_lanes=4)
    contenders: dict[str, Callable[..., Any]] = {"eager": model, "optimize()": module, "lanes": lanes}
    per_thread = [varied(inputs, seed) for seed in range(max(threads))]
    with torch.no_grad():
        expected = [model(*x) for x in per_thread]
    rates: dict[tuple[str, int], list[float]] = {}
    wrong = dict.fromkeys(CONTENDERS, 0)
    order = random.Random(0)
    for _ in range(rounds):
        for n in threads:
            names = list(CONTENDERS)
            order.shuffle(names)
            for c in names:
                time.sleep(0.05)
                rate, bad = served(contenders[c], per_thread[:n], expected[:n], calls)
                rates.setdefault((c, n), []).append(rate)
                wrong[c] += bad
    median = {f"{c} x{n}": statistics.median(v) for (c, n), v in rates.items()}
    lanes_plan = max(len(p.lanes) for p in lanes.plan.phases)
    row: list[object] = [name, module.outcome.race.kept if module.outcome.race else module.schedule.scheduler,
                         lanes_plan]
    for n in threads:
        row += [f"{median[f'{c} x{n}']:.0f}" for c in CONTENDERS]
        row.append(f"{median[f'optimize() x{n}'] / median[f'eager x{n}']:.2f}")
    row.append(" / ".join(str(wrong[c]) for c in CONTENDERS))
    return row, {"model": name, "calls_per_s": median, "wrong": wrong, "lanes": lanes_plan,
                 "kept": row[1], "lanes_executor": lanes.executor.describe()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["bert", "vit", "resnet", "googlenet"])
    p.add_argument("--threads", nargs="*", type=int, default=[1, 4])
    p.add_argument("--calls", type=int, default=20, help="calls per thread in a turn")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--budget", type=float, default=5.0, help="seconds of IOS search per model in optimize()")
    p.add_argument("--name", default="threads")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    rows, records = each_model(args.models, lambda name: run(name, args.threads, args.calls, args.rounds,
                                                             args.budget))
    headers = ["model", "optimize() kept", "lanes' plan: lanes"]
    for n in args.threads:
        headers += [f"{c} x{n} calls/s" for c in CONTENDERS] + [f"optimize() / eager x{n}"]
    headers.append("wrong calls: " + " / ".join(CONTENDERS))
    summary = {f"optimize() / eager x{n}": geomean(r["calls_per_s"][f"optimize() x{n}"]
                                                    / r["calls_per_s"][f"eager x{n}"] for r in records)
               for n in args.threads}
    write_table(args.name, [
        "# Serving from several threads", "",
        "One module called at once by several threads, as a server's request threads call one model, against "
        "the eager model called the same way: calls per second over all threads (the median of "
        f"{args.rounds} rounds, contenders in a fresh order each round, {args.calls} calls per thread in a turn, "
        "each thread on inputs of its own), and the calls whose outputs differed from eager's on the same "
        "input, over every round and thread count (see `benchmarks/threads.py`). *lanes*: a plan whose lanes "
        "wait on each other's steps, on ONNX Runtime (EST under a GPU's analytic costs: not fast here, but the "
        "plan whose concurrent calls each take lane workers of their own).",
    ], headers, rows, summary, {"rows": records, "threads": args.threads, "calls": args.calls,
                                "rounds": args.rounds, "wrong calls": sum(sum(r["wrong"].values()) for r in records)},
        args.out)


if __name__ == "__main__":
    main()

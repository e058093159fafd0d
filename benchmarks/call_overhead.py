"""What a call costs around the kernels: corpus models whose plan is one ONNX Runtime session, at
batch 1 on this CPU, where a call's fixed costs are a large share of 0.1 ms.

Per model, interleaved in one process in a fresh order each round
(:func:`opsched.timing.interleave`: 50 ms of sleep, then one untimed call and ``--block`` timed
ones, their median the round's sample), in microseconds:

- *session*: the sequential plan's one session, called as ORT's own is (NumPy in and out);
- *executor, slots*: the plan's executor through the general path (value slots, events, grad
  mode, the per-item loop), which plans of several sessions or lanes take;
- *executor, direct*: the same executor as it runs a one-session plan (``Program.direct``);
- *module*: the sequential plan as a drop-in module (input checks; the graph's outputs as they are);
- *optimize()*: what ``opsched.optimize`` returns, which also builds the model's own output object
  (on two cores its race keeps these models' plan on one core, whose session wakes no thread for a
  kernel: it runs faster than the two-thread session the other columns call);
- *output object*: building that object alone (Hugging Face's ``ModelOutput``), on the same
  tensors each time, and *executor + output object*: built right after a run.

    python benchmarks/call_overhead.py
    python benchmarks/call_overhead.py --models bert vit --rounds 21
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from _report import each_model, geomean, write_table  # noqa: E402

import opsched  # noqa: E402
from opsched.backends.lanes import LaneExecutor  # noqa: E402
from opsched.costing import host_cpu_model  # noqa: E402
from opsched.testing.corpus import corpus  # noqa: E402
from opsched.timing import interleave, paired_ratio  # noqa: E402

COLUMNS = ("session", "executor, slots", "executor, direct", "module", "optimize()", "output object",
           "executor + output object")


def run(name: str, rounds: int, block: int, budget: float) -> tuple[list[object], dict[str, object]]:
    model, inputs = corpus()[name].build()
    sequential = opsched.optimize_graph(opsched.from_torch(model, inputs), cost=host_cpu_model(),
                                        scheduler="sequential", backend="ort", check=False)
    direct = sequential.executor
    assert isinstance(direct, LaneExecutor) and direct.program.direct is not None, f"{name}: not one session"
    slots = LaneExecutor(dataclasses.replace(direct.program, direct=None), direct.cores, "onnxruntime")
    (session,) = [s for s in direct.program.sessions if s is not None]
    feeds = {i.name: t.numpy() for i, t in zip(sequential.graph.inputs, inputs)}
    feeds = {i.name: feeds[i.name] for i in session.get_inputs()}
    opt = opsched.optimize(model, inputs, budget_s=budget, progress=False)
    tensors = list(opt.inputs.tensors(inputs, {}))
    made = opt.executor(tensors)
    calls = {
        "session": lambda: session.run(None, feeds),
        "executor, slots": lambda: slots(list(inputs)),
        "executor, direct": lambda: direct(list(inputs)),
        "module": lambda: sequential(*inputs),
        "optimize()": lambda: opt(*inputs),
        "output object": lambda: opt.outputs.build(made),
        "executor + output object": lambda: opt.outputs.build(opt.executor(tensors)),
    }
    with torch.no_grad():
        times = interleave(calls, rounds, warmup=1, settle_s=0.05, block=block)
    us = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ratio = paired_ratio(times["executor, slots"], times["executor, direct"])
    row: list[object] = [name, type(opt.outputs.build(made)).__name__, *(f"{us[k]:.1f}" for k in COLUMNS),
                         f"{ratio:.2f}"]
    return row, {"model": name, "median_us": us, "slots_vs_direct": ratio}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["bert", "gpt2", "vit", "resnet"])
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--block", type=int, default=51, help="timed calls per contender's turn (their median)")
    p.add_argument("--budget", type=float, default=5.0, help="seconds of IOS search per model in optimize()")
    p.add_argument("--name", default="call-overhead")
    args = p.parse_args()
    rows, records = each_model(args.models, lambda name: run(name, args.rounds, args.block, args.budget))
    headers = ["model", "output object", *(f"{k} us" for k in COLUMNS), "direct's speed-up"]
    write_table(args.name, [
        "# What a call costs around the kernels", "",
        "Corpus models whose plan is one ONNX Runtime session, batch 1; medians over interleaved rounds in one "
        "process, in microseconds (see `benchmarks/call_overhead.py` for what each column calls). *direct's "
        "speed-up*: the median per-round ratio of the executor through its slots to the executor's direct call. "
        "On a 2-core machine the medians of contenders swing between rounds by more than these differences; "
        "the per-round ratio, of calls made moments apart, is the figure to read. *optimize()* runs the plan "
        "its race kept, which may be on fewer cores than the others' (`Schedule.cores`): on two, these "
        "models' one session on one thread, faster than the others' on two.",
    ], headers, rows, {"direct's speed-up": geomean(float(r["slots_vs_direct"]) for r in records)},  # type: ignore[arg-type]
        {"rows": records, "rounds": args.rounds, "block": args.block})


if __name__ == "__main__":
    main()

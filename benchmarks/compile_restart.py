"""The first call of ``torch.compile(model, backend="opsched")`` in a new process: what the
profile store and the schedule cache save a server that restarts.

Per model, three processes one after another, sharing one fresh cache directory (opsched's and
Inductor's, where ``--backend`` compiles segments with it), each timing
its first call (Dynamo's capture, the backend's import, schedule and check, and the run):

- *cold*: nothing stored: stages are measured, the plans searched and raced;
- *measured*: the profile store holds the cold process's measurements, the schedule cache is
  off (``options={"schedule_cache": False}``): the plans are searched and raced again, with no
  stage timed;
- *cached*: both: the schedule the cold process kept is loaded, with no search and no race.

*backend s* is what the backend spent on the graphs (:attr:`opsched.dynamo.Bucket.seconds`),
the rest of the first call being Dynamo's and the run's. *same plan*: whether the cached
process runs the cold process's plan (it must: it loaded it). Each process also checks its
outputs against eager.

    python benchmarks/compile_restart.py
    python benchmarks/compile_restart.py --models googlenet bert --cost analytic
    python benchmarks/compile_restart.py --device cuda --dtype float16 --backend cuda cuda-inductor \
        --models googlenet --name compile-restart-gpu
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import RESULTS, each_model, geomean, placed_model, write_table  # noqa: E402

#: The three processes, and the backend options each adds.
PROCESSES = {"cold": {}, "measured": {"schedule_cache": False}, "cached": {}}


def child(name: str, device: str, dtype: str, options: dict[str, Any]) -> dict[str, Any]:
    """One process's first call of ``name`` through the backend (run in a subprocess)."""
    import torch

    import opsched.dynamo as od
    from opsched.testing import assert_close

    model, inputs = placed_model(name, device, dtype)
    with torch.no_grad():
        expected = model(*inputs)
        compiled = torch.compile(model, backend="opsched", options=options)
        start = time.perf_counter()
        got = compiled(*inputs)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    assert_close(got, expected, f"{name} through the backend")
    buckets = [b for g in od.compiled_graphs() for b in g.buckets]
    return {"first_call_s": seconds, "backend_s": sum(b.seconds for b in buckets),
            "searched": sum(b.searched for b in buckets), "cached": sum(b.cached is not None for b in buckets),
            "eager": sum(b.schedule is None for b in buckets),
            "plans": [f"{b.schedule} on {b.backend}" for b in buckets]}


def run(name: str, device: str, dtype: str, options: dict[str, Any]) -> tuple[list[object], dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="opsched-restart-") as cache:
        # Inductor's own cache too (segments compiled by the cuda-inductor and inductor backends):
        # cold in the first process, kept for the next two, as a restart meets it
        env = {**os.environ, "OPSCHED_CACHE_DIR": cache, "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor")}
        got = {}
        for process, extra in PROCESSES.items():
            command = [sys.executable, __file__, "--child", name, device, dtype, json.dumps({**options, **extra})]
            done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)
            if done.returncode != 0:
                raise SystemExit(f"{name}, {process} process failed:\n{done.stderr[-3000:]}")
            got[process] = json.loads(done.stdout.strip().splitlines()[-1])
    cold, measured, cached = got["cold"], got["measured"], got["cached"]
    if cached["searched"] or cached["cached"] != cold["searched"]:
        raise SystemExit(f"{name}: the cached process searched {cached['searched']} graphs and loaded "
                         f"{cached['cached']}, where the cold one searched {cold['searched']}")
    same = cached["plans"] == cold["plans"]
    row: list[object] = [name, cold["searched"], *(f"{got[p]['first_call_s']:.1f}" for p in PROCESSES),
                         *(f"{got[p]['backend_s']:.1f}" for p in PROCESSES),
                         f"{cold['first_call_s'] / cached['first_call_s']:.2f}",
                         f"{measured['first_call_s'] / cached['first_call_s']:.2f}", "yes" if same else "no"]
    return row, {"model": name, **{p: got[p] for p in PROCESSES}, "same_plan": same,
                 "cold_vs_cached": cold["first_call_s"] / cached["first_call_s"],
                 "measured_vs_cached": measured["first_call_s"] / cached["first_call_s"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["squeezenet1_1", "randwire_small", "googlenet", "inception_v3",
                                                   "nasnet_mobile", "bert", "gpt2"])
    p.add_argument("--budget", type=float, default=10.0, help="seconds of IOS search per schedule")
    p.add_argument("--cost", choices=["analytic", "measured"], default="measured")
    p.add_argument("--backend", nargs="*", help="the backend option (default: optimize()'s, by the device)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: the model and its inputs placed there")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"])
    p.add_argument("--name", default="compile-restart")
    p.add_argument("--out", type=Path, default=RESULTS, help="where the .md and .json go")
    p.add_argument("--child", nargs=4, metavar=("MODEL", "DEVICE", "DTYPE", "OPTIONS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(*args.child[:3], json.loads(args.child[3]))))
        return
    options = {"budget_s": args.budget, "cost": args.cost, "progress": False,
               **({"backend": args.backend} if args.backend else {})}
    rows, records = each_model(args.models, lambda name: run(name, args.device, args.dtype, options))
    headers = ["model", "graphs", *(f"{p} first call s" for p in PROCESSES), *(f"{p} backend s" for p in PROCESSES),
               "cold / cached", "measured / cached", "same plan"]
    geo = {k: geomean(float(r[k]) for r in records) for k in ("cold_vs_cached", "measured_vs_cached")}
    write_table(args.name, [
        "# The first call of torch.compile(backend=\"opsched\") in a new process", "",
        f"Batch 1 on {args.device} in {args.dtype}, {args.cost} costs, {args.budget:g} s of search a schedule"
        f"{', backend ' + ' and '.join(args.backend) if args.backend else ''}; three processes "
        "a model, one after another, sharing one fresh cache directory (see `benchmarks/compile_restart.py`). "
        "*cold*: nothing stored; *measured*: the profile store filled by the cold process, the schedule cache off "
        "(searched and raced again, no stage timed); *cached*: the schedule the cold process kept, loaded. "
        "*first call*: Dynamo's capture, the backend's work and the run; *backend*: the backend's work alone. "
        "*same plan*: the cached process ran the cold one's plan.",
    ], headers, rows, {"cold / cached": geo["cold_vs_cached"], "measured / cached": geo["measured_vs_cached"]},
        {"rows": records, "budget_s": args.budget, "cost": args.cost, "backend": args.backend, "device": args.device,
         "dtype": args.dtype}, args.out)


if __name__ == "__main__":
    main()

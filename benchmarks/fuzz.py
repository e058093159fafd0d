"""The fuzzer at length: N random DAG modules (opsched.testing.fuzz) through every scheduler x CPU
backend x frontend, tallied by outcome and by cause.

    python benchmarks/fuzz.py                      # 300 models, seeds 1000-1299
    python benchmarks/fuzz.py --models 50 --first 0
    python benchmarks/fuzz.py --models 40 --frontends torch dynamo --backends ort inductor --name fuzz-compile

torch.onnx's TorchScript exporter runs in a worker process of its own, its time and memory
capped (:func:`opsched.testing.fuzz_check.in_worker`): on a random graph it can exhaust memory
(seed 73069 took 24 GiB of this 24 GiB machine) or kill its process (seed 10267: SIGFPE in its
shape inference, which ended a 1000-model run at model 268), and such a failure is tallied as
``unexportable`` like its other refusals, the run going on.
"""

from __future__ import annotations

import argparse
import collections
import logging
import re
import sys
import time
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _report import write  # noqa: E402

from opsched.cli.table import format_table  # noqa: E402
from opsched.testing.fuzz import FuzzNet  # noqa: E402
from opsched.testing.fuzz_check import BACKENDS, FRONTENDS, SCHEDULERS, check_model  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--models", type=int, default=300)
    p.add_argument("--first", type=int, default=1000, help="first seed")
    p.add_argument("--name", default="fuzz")
    p.add_argument("--frontends", nargs="+", choices=FRONTENDS, default=["torch", "onnx"],
                   help="dynamo: torch.compile(backend='opsched')")
    p.add_argument("--schedulers", nargs="+", choices=SCHEDULERS, default=list(SCHEDULERS))
    p.add_argument("--backends", nargs="+", default=list(BACKENDS), help="CPU backends: torch, ort, inductor")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    start = time.perf_counter()
    tally: collections.Counter[tuple[str, str]] = collections.Counter()
    causes: collections.Counter[tuple[str, str, str]] = collections.Counter()
    models: collections.Counter[tuple[str, str]] = collections.Counter()  # (frontend, worst status) per model
    sizes = []
    examples: dict[tuple[str, str, str], int] = {}
    for seed in range(args.first, args.first + args.models):
        sizes.append(len(FuzzNet(seed).steps))
        outcomes = check_model(seed, args.schedulers, args.backends, args.frontends)
        for frontend in args.frontends:
            statuses = {o.status for o in outcomes if o.frontend == frontend}
            worst = next(s for s in ("wrong", "error", "unexportable", "refused", "equal") if s in statuses)
            models[frontend, worst] += 1
        for o in outcomes:
            tally[o.frontend, o.status] += 1
            if o.status != "equal":
                key = (o.frontend, o.status, o.cause)
                causes[key] += 1
                examples.setdefault(key, seed)
        done = seed - args.first + 1
        print(f"{done}/{args.models} models, {time.perf_counter() - start:.0f} s: "
              f"{dict(models)}", flush=True)
    statuses = ["equal", "wrong", "error", "refused", "unexportable"]
    runs = [[f, *(tally[f, s] for s in statuses)] for f in args.frontends]
    per_model = [[f, *(models[f, s] for s in statuses)] for f in args.frontends]
    lacking: collections.Counter[str] = collections.Counter()  # ONNX op type -> models refused for it
    for (_, s, c), n in causes.items():
        if s == "refused" and "have no opsched converter" in c:
            for op in re.findall(r"([A-Za-z]+) xN", c):
                lacking[op] += n // len(args.schedulers) // len(args.backends)
    other = [(key, n) for key, n in causes.most_common() if "have no opsched converter" not in key[2]]
    cause_rows = [[f, s, n, examples[(f, s, c)], c.replace("|", "/")] for (f, s, c), n in other]
    md = "\n".join([
        f"# Fuzzer: {args.models} random models (seeds {args.first}-{args.first + args.models - 1})", "",
        f"Each model ({min(sizes)}-{max(sizes)} operators, median {sorted(sizes)[len(sizes) // 2]}) through every "
        f"scheduler ({', '.join(args.schedulers)}) on every CPU backend ({', '.join(args.backends)}), through "
        f"the frontends {', '.join(args.frontends)} (torch: `opsched.from_torch`, torch.export, torch.fx where it "
        "refuses; onnx: torch.onnx export + opsched.from_onnx; dynamo: `torch.compile(backend=\"opsched\")` "
        "with the scheduler and backend as its options), each compared with eager PyTorch on the example input "
        "and on a fresh one. `refused`: "
        "the ONNX importer named the ops it lacks; `unexportable`: torch.onnx could not export the model, or "
        "wrote a file ONNX Runtime's own session refuses or runs otherwise than eager (the exporter's gaps).", "",
        "## Runs (model x scheduler x backend)", "",
        format_table(["frontend", *statuses], runs, markdown=True), "",
        f"## Models (the worst outcome of its {len(args.schedulers) * len(args.backends)} runs per frontend)", "",
        format_table(["frontend", *statuses], per_model, markdown=True), "",
        "## ONNX op types the importer has no converter for (models refused for each)", "",
        format_table(["op type", "models"], [[op, n] for op, n in lacking.most_common()], markdown=True)
        if lacking else "None.", "",
        "## Other causes (first seed showing each)", "",
        format_table(["frontend", "status", "runs", "seed", "cause"], cause_rows, markdown=True) if cause_rows
        else "None.", "",
        f"Total time {time.perf_counter() - start:.0f} s.",
    ])
    data = {"runs": {f"{f}/{s}": n for (f, s), n in tally.items()},
            "models": {f"{f}/{s}": n for (f, s), n in models.items()},
            "lacking_onnx_converters": dict(lacking.most_common()),
            "causes": [{"frontend": f, "status": s, "cause": c, "runs": n, "seed": examples[(f, s, c)]}
                       for (f, s, c), n in causes.most_common()]}
    md_path, _ = write(args.name, md, data)
    print(md)
    print(f"wrote {md_path}")


if __name__ == "__main__":
    main()

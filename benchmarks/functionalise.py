"""What the import saves by rewriting in-place calls out of place (-> docs/results/functionalise.md).

``torch.export`` records a model's writes in place (``x += residual``, ``nn.ReLU(inplace=True)``),
and the ATen-level import takes functional programs only. Per model of the corpora whose program
writes in place: the seconds of ``torch.export.export``, then of making the program functional
each way, on a program of its own: ``run_decompositions({})`` (a second trace, which any program
takes) and :func:`opsched.frontends.export_in_place.made_out_of_place` (a rewrite of the graph,
which applies where every write is to a tensor that shares memory with none, and is refused
otherwise, the retrace then doing the work); and the largest difference of the rewritten
program's outputs from eager PyTorch's. Models whose program writes nothing are counted, not
listed (neither step runs for them).

    python benchmarks/functionalise.py
    python benchmarks/functionalise.py --models resnet maskformer --repeats 5
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
from _report import RESULTS, corpus_models, geomean, write_table  # noqa: E402

from opsched._text import first_line  # noqa: E402
from opsched.compare import largest_difference  # noqa: E402
from opsched.frontends.export_in_place import made_out_of_place  # noqa: E402
from opsched.testing import tensors  # noqa: E402


def exported(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> tuple[torch.export.ExportedProgram, float]:
    start = time.perf_counter()
    with torch.no_grad():
        program = torch.export.export(model, inputs, strict=False)
    return program, time.perf_counter() - start


def writes(program: torch.export.ExportedProgram) -> int:
    return sum(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
               for n in program.graph.nodes if n.op == "call_function")


def measure(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...], repeats: int) -> dict[str, Any] | None:
    """The model's export, retrace and rewrite seconds (medians over ``repeats``, each on a fresh
    export); None where its program writes nothing."""
    traced, retraced, rewritten, applied, program, count = [], [], [], False, None, 0
    for _ in range(repeats):
        first, seconds = exported(model, inputs)
        if not (count := writes(first)):
            return None
        traced.append(seconds)
        start = time.perf_counter()
        with torch.no_grad():
            first.run_decompositions({})
        retraced.append(time.perf_counter() - start)
        program, _ = exported(model, inputs)
        start = time.perf_counter()
        applied = made_out_of_place(program)
        rewritten.append(time.perf_counter() - start)
    assert program is not None
    with torch.no_grad():
        got, want = tensors(program.module()(*inputs)), tensors(model(*inputs))
    return {"writes": count, "export_s": statistics.median(traced),
            "retrace_s": statistics.median(retraced), "rewrite_s": statistics.median(rewritten),
            "rewritten": applied,
            "max_diff": max((largest_difference(a, b) for a, b in zip(got, want, strict=True)), default=0.0)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", help="corpus models (default: the corpus's and the wide corpus's)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--name", default="functionalise")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args()
    models = {**corpus_models("corpus"), **corpus_models("wide")}
    names = args.models or list(models)
    results, functional, untraced = {}, [], {}
    for name in names:
        model, inputs = models[name].build()
        try:
            row = measure(model, inputs, args.repeats)
        except Exception as e:  # noqa: BLE001 (torch.export's many failure types: the import traces these otherwise)
            untraced[name] = first_line(e)
            continue
        if row is None:
            functional.append(name)
            continue
        results[name] = row
        print(f"{name}: export {row['export_s']:.2f} s, retrace {row['retrace_s']:.2f} s, rewrite "
              f"{row['rewrite_s'] * 1e3:.1f} ms ({'applied' if row['rewritten'] else 'refused'})", flush=True)
    kept = {k: r for k, r in results.items() if r["rewritten"]}
    rows = [[name, r["writes"], f"{r['export_s']:.2f}", f"{r['retrace_s']:.2f}", f"{r['rewrite_s'] * 1e3:.1f}",
             "yes" if r["rewritten"] else "no (retraced)",
             f"{(r['export_s'] + r['retrace_s']) / (r['export_s'] + r['rewrite_s']):.2f}x" if r["rewritten"] else "",
             f"{r['max_diff']:.1e}"] for name, r in results.items()]
    write_table(args.name, [
        "# Functional programs without a second trace",
        "",
        "Per corpus model whose `torch.export` program writes in place (`opsched.testing.corpus`, random weights, "
        "batch 1): the writes, the seconds of `torch.export.export`, of `run_decompositions({})` (a second trace) "
        "and of `opsched.frontends.export_in_place.made_out_of_place` (a rewrite of the graph), each on a fresh "
        "export, medians over the repeats; whether the rewrite applied (every write to a tensor that shares "
        "memory with none; else the import retraces); *export + functional*: the seconds of the export and the "
        "retrace over those of the export and the rewrite, what the import saves; the largest difference of the "
        "rewritten program's outputs from eager PyTorch's. "
        f"{len(functional)} of the {len(names)} models write nothing in place: neither step runs for them"
        + (f"; {len(untraced)} torch.export cannot trace as it is called here, with nothing fixed "
           f"({', '.join(untraced)}: the import traces them with their numbers fixed)." if untraced else "."),
    ], ["model", "writes", "export s", "retrace s", "rewrite ms", "rewritten", "export + functional", "max diff"],
        rows, {"export + functional": geomean((r["export_s"] + r["retrace_s"]) / (r["export_s"] + r["rewrite_s"])
                                              for r in kept.values())} if kept else {},
        {"rows": results, "functional": functional, "untraced": untraced, "repeats": args.repeats}, out=args.out)


if __name__ == "__main__":
    main()

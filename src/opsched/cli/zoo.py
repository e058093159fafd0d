"""``opsched zoo``: the benchmark models with operators, FLOPs, parameters and width."""

from __future__ import annotations

import argparse
import time

from opsched.cli.main import Handler, subcommand
from opsched.cli.table import format_table

__all__ = ["zoo_rows"]


def zoo_rows(names: list[str], batch: int = 1) -> list[list[object]]:
    from opsched.frontends import from_torch
    from opsched.ir.analysis import parameter_count, total_flops, width
    from opsched.models import example_inputs, get_model, model_spec

    rows: list[list[object]] = []
    for name in names:
        model, inputs = get_model(name), example_inputs(name, batch)
        start = time.perf_counter()
        graph = from_torch(model, inputs, name=name)
        seconds = time.perf_counter() - start
        rows.append([name, "x".join(map(str, model_spec(name).input_shape(batch)[1:])), len(graph.nodes),
                     f"{total_flops(graph) / 1e9:.2f}", f"{parameter_count(graph) / 1e6:.2f}", width(graph),
                     f"{seconds:.2f}"])
    return rows


@subcommand("zoo", "list the benchmark models: operators, GFLOPs, parameters, width, import time")
def _setup(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("models", nargs="*", help="zoo names (default: all)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--markdown", action="store_true", help="print a Markdown table")

    def run(args: argparse.Namespace) -> int:
        from opsched.models import list_models, model_spec

        names = args.models or list_models()
        for n in names:
            model_spec(n)  # unknown names fail before any work
        headers = ["model", "input", "operators", "GFLOPs", "params (M)", "width", "import (s)"]
        print(format_table(headers, zoo_rows(names, args.batch), markdown=args.markdown))
        return 0
    return run

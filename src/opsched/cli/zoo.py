"""``opsched zoo``: the benchmark models with operators, FLOPs, parameters and width, a row as
each model is imported."""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator

from opsched.cli.main import Handler, subcommand
from opsched.cli.table import format_table

__all__ = ["zoo_rows", "HEADERS"]

HEADERS = ["model", "input", "operators", "GFLOPs", "params (M)", "width", "import (s)"]


def zoo_rows(names: list[str], batch: int = 1) -> Iterator[list[object]]:
    """One row per zoo model, as it is imported."""
    from opsched.frontends import from_torch
    from opsched.ir.analysis import parameter_count, total_flops, width
    from opsched.models import example_inputs, get_model, model_spec

    for name in names:
        model, inputs = get_model(name), example_inputs(name, batch)
        start = time.perf_counter()
        graph = from_torch(model, inputs, name=name)
        seconds = time.perf_counter() - start
        yield [name, "x".join(map(str, model_spec(name).input_shape(batch)[1:])), len(graph.nodes),
               f"{total_flops(graph) / 1e9:.2f}", f"{parameter_count(graph) / 1e6:.2f}", width(graph), f"{seconds:.2f}"]


@subcommand("zoo", "list the benchmark models: operators, GFLOPs, parameters, width, import time")
def _setup(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("models", nargs="*", help="zoo names (default: all)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--markdown", action="store_true", help="print a Markdown table (once every row is in)")

    def run(args: argparse.Namespace) -> int:
        from opsched.models import list_models, model_spec

        names = args.models or list_models()
        for n in names:
            model_spec(n)  # unknown names fail before any work
        if args.markdown:
            print(format_table(HEADERS, list(zoo_rows(names, args.batch)), markdown=True))
            return 0
        widths = [max(len(HEADERS[0]), *(len(n) for n in names)), 9, 9, 6, 10, 5, 10]
        numeric = [False, False, True, True, True, True, True]

        def line(cells: list[object]) -> str:
            return "  ".join(str(c).rjust(w) if num else str(c).ljust(w)
                             for c, w, num in zip(cells, widths, numeric)).rstrip()
        print(line(list(HEADERS)))
        print("  ".join("-" * w for w in widths))
        for row in zoo_rows(names, args.batch):
            print(line(row), flush=True)
        return 0
    return run

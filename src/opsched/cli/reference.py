"""``opsched options``: every scheduler's options, the backends and the device presets."""

from __future__ import annotations

import argparse

from opsched.cli.main import Handler, subcommand


@subcommand("options", "list every scheduler with its options, the backends and the analytic device presets")
def _setup(p: argparse.ArgumentParser) -> Handler:
    p.add_argument("--markdown", action="store_true", help="as Markdown (docs/options.md is this output)")

    def run(args: argparse.Namespace) -> int:
        from opsched.cli.options import reference

        print(reference(markdown=args.markdown), end="")
        return 0
    return run

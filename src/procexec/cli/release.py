"""Release subcommands: export the suite and the study as datasets, the harness tasks, harness logs read back."""

from __future__ import annotations

import argparse
import sys

from procexec.cli.options import add_config_option, load_config
from procexec.errors import ProcexecError


def repo_id(text: str) -> str:
    """argparse type of ``--push``: a hub repo id as ``huggingface_hub`` validates it, refused before any work."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError as exc:
        raise argparse.ArgumentTypeError(str(exc).strip().splitlines()[0]) from None
    return text


def _push_token(args: argparse.Namespace) -> str | None:
    """The upload token, checked before any export work (from the environment only)."""
    if not args.push:
        return None
    from procexec.release.folder import hub_token

    return hub_token()


def _config_inputs(args: argparse.Namespace) -> list[tuple[str, str]]:
    """The config files an export read: ``--out`` may neither be, hold nor lie in one."""
    return [("a --config file", path) for path in args.config]


def _push(args: argparse.Namespace, token: str | None, what: str) -> None:
    if token is None:
        return
    from pathlib import Path

    from procexec.release.folder import push

    print(
        f"pushed {what} to {args.push}: {push(Path(args.out), args.push, token, f'procexec export {what}')}",
        file=sys.stderr,
    )


def cmd_export_suite(args: argparse.Namespace) -> None:
    from procexec.release.suite import export_suite

    token = _push_token(args)
    counts = export_suite(load_config(args.config).suite, args.out, _config_inputs(args))
    print(f"{args.out}: {len(counts)} configs, {sum(counts.values())} examples", file=sys.stderr)
    _push(args, token, "suite")


def cmd_export_generations(args: argparse.Namespace) -> None:
    from procexec.release.generations import export_generations

    token = _push_token(args)
    counts = export_generations(load_config(args.config), args.results, args.out, _config_inputs(args))
    print(f"{args.out}: {len(counts)} models, {sum(counts.values())} generations", file=sys.stderr)
    _push(args, token, "generations")


def cmd_lm_eval_path(_args: argparse.Namespace) -> None:
    from procexec.harness.lm_eval_files import TASK_DIR

    print(TASK_DIR)


def cmd_import_harness(args: argparse.Namespace) -> None:
    """A harness's log as the model's generation records (what ``collect`` writes for the study's models)."""
    from pathlib import Path

    from procexec.harness import importer

    config = load_config(args.config)
    if args.model not in config.models:
        raise ProcexecError(
            f"--model {args.model}: not a model of the config (known: {', '.join(sorted(config.models))})"
        )
    model = config.models[args.model]
    for path in args.lm_eval or args.inspect:
        if not Path(path).is_file():
            raise ProcexecError(f"{path}: file not found")
    if (args.datasets_dir is None) != (args.datasets is None):
        raise ProcexecError("--datasets-dir and --datasets: give both (the study's dataset files) or neither")
    study = None if args.datasets is None else importer.study_examples(Path(args.datasets_dir), args.datasets)
    if args.lm_eval:
        records = importer.lm_eval_records(
            [Path(p) for p in args.lm_eval],
            args.model,
            args.model_dir,
            model,
            config.inference.template_date,
        )
    else:
        records = importer.inspect_records([Path(p) for p in args.inspect], args.model)
    counts = importer.write_records(records, Path(args.out), study)
    print(
        f"{args.out}: {sum(counts.values())} generations of {args.model} imported in {len(counts)} datasets",
        file=sys.stderr,
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    export = subparsers.add_parser("export", help="the suite or the study's generations as a Hugging Face dataset")
    kinds = export.add_subparsers(dest="what", required=True, metavar="WHAT")

    p = kinds.add_parser("suite", help="every dataset of the config's suite: one config per dataset, a card")
    add_config_option(p)
    p.add_argument("--out", required=True, help="the dataset folder to write (replaced whole)")
    p.add_argument(
        "--push", metavar="REPO", type=repo_id, help="also upload the folder to this hub dataset repo (HF_TOKEN)"
    )
    p.set_defaults(func=cmd_export_suite)

    p = kinds.add_parser("generations", help="the run models' generations and scores: one config per model, a card")
    add_config_option(p)
    p.add_argument("--results", required=True, help="the study stage's results folder (results, results/pilot, ...)")
    p.add_argument("--out", required=True, help="the dataset folder to write (replaced whole)")
    p.add_argument(
        "--push", metavar="REPO", type=repo_id, help="also upload the folder to this hub dataset repo (HF_TOKEN)"
    )
    p.set_defaults(func=cmd_export_generations)

    harness = subparsers.add_parser("harness", help="where the evaluation harnesses find procexec's tasks")
    tools = harness.add_subparsers(dest="tool", required=True, metavar="TOOL")
    p = tools.add_parser("lm-eval-path", help="print the folder to pass to lm-eval as --include_path")
    p.set_defaults(func=cmd_lm_eval_path)

    p = subparsers.add_parser(
        "import-harness",
        help="an lm-eval or inspect log of procexec's tasks as generation records (then score, aggregate, report)",
    )
    logs = p.add_mutually_exclusive_group(required=True)
    logs.add_argument("--lm-eval", nargs="+", metavar="SAMPLES", help="lm-eval --log_samples files (samples_*.jsonl)")
    logs.add_argument("--inspect", nargs="+", metavar="LOG", help="inspect logs of procexec/procedural (.eval, .json)")
    add_config_option(p)
    p.add_argument("--model", required=True, help="the model's key in the config (the records' model)")
    p.add_argument(
        "--model-dir",
        help="lm-eval: the served model's folder; each logged prompt must re-encode to "
        "procexec's rendering with its tokenizer",
    )
    p.add_argument("--datasets-dir", help="the study's dataset files (with --datasets): write exactly their examples")
    p.add_argument(
        "--datasets", nargs="+", metavar="ID", help="the datasets to write (each one's file must be covered)"
    )
    p.add_argument("--out", required=True, help="folder for <dataset>.jsonl.gz (e.g. results/generations/KEY)")
    p.set_defaults(func=cmd_import_harness)

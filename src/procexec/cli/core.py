"""Benchmark-core subcommands: check-config, generate, execute, card, table4."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from procexec.benchmark.card import render_card
from procexec.benchmark.executor import SEMANTICS, execute
from procexec.benchmark.suite import DatasetSpec, default_suite, expand_suite, generate_dataset
from procexec.cli.options import add_config_option, load_config, positive_int, seed_int
from procexec.config.model import Suite
from procexec.errors import ProcexecError
from procexec.io.files import atomic_write
from procexec.io.jsonl import read_jsonl, write_jsonl
from procexec.records import Example

MAX_LENGTH = 10_000  # as the config schema's suite.lengths


def positive_int_list(text: str) -> list[int]:
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not parts or not all(part.isascii() and part.isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"bad length list {text!r}: lengths must be positive integers like 5,15,25")
    values = [int(part) for part in parts]
    if any(v < 1 or v > MAX_LENGTH for v in values):
        raise argparse.ArgumentTypeError(
            f"bad length list {text!r}: lengths must be positive integers up to {MAX_LENGTH}"
        )
    if len(set(values)) != len(values):
        raise argparse.ArgumentTypeError(f"bad length list {text!r}: a length is repeated")
    return values


def _add_suite_options(parser: argparse.ArgumentParser) -> None:
    add_config_option(
        parser,
        required=False,
        what="workflow config (suite parameters), read only for what the flags below leave open; "
        "default: config.yaml if the working directory has one, else the paper's suite "
        "(packaged with procexec)",
    )
    parser.add_argument("--seed", type=seed_int, help="override suite.seed (>= 0)")
    parser.add_argument("--lengths", type=positive_int_list, help="override suite.lengths, e.g. 5,15,25")
    parser.add_argument("--examples-per-length", type=positive_int, help="override suite.examples_per_length")


def _suite_source(args: argparse.Namespace) -> tuple[Suite, str]:
    """The suite and where it came from: ``--config``, else ./config.yaml, else the packaged paper's suite
    (so ``procexec generate`` works outside a checkout, e.g. after ``pip install``)."""
    if args.config:
        return load_config(args.config).suite, " + ".join(args.config)
    if Path("config.yaml").exists():
        return load_config(["config.yaml"]).suite, "config.yaml"
    return Suite.model_validate(default_suite()), "procexec/data/suite.yaml, the paper's suite packaged with procexec"


def _suite_settings(args: argparse.Namespace) -> tuple[Suite | None, str, int, list[int], int]:
    """Explicit flags win; the config file is read for what they leave open, and always when named."""
    if args.config is None and args.seed is not None and args.lengths and args.examples_per_length:
        return None, "the flags", args.seed, args.lengths, args.examples_per_length
    suite, source = _suite_source(args)
    return (
        suite,
        source,
        suite.seed if args.seed is None else args.seed,
        args.lengths or suite.lengths,
        args.examples_per_length or suite.examples_per_length,
    )


def cmd_generate(args: argparse.Namespace) -> None:
    spec = DatasetSpec.from_id(args.dataset)
    suite, source, seed, lengths, per_length = _suite_settings(args)
    if suite is not None:
        known = [s.id for s in expand_suite(suite, subset=False)]
        if spec.id not in known:
            raise ProcexecError(f"dataset {spec.id!r} is not in the suite ({source})")
    examples = generate_dataset(spec, lengths, per_length, seed)
    write_jsonl(args.out, (e.to_json() for e in examples))


def cmd_execute(args: argparse.Namespace) -> None:
    def references() -> Iterator[dict[str, Any]]:
        seen: dict[str, int] = {}
        for line, obj in read_jsonl(args.input):
            where = f"{args.input}:{line}"
            example = Example.from_json(obj, where)
            if example.id in seen:
                raise ProcexecError(f"{where}: duplicate id {example.id!r} (first on line {seen[example.id]})")
            seen[example.id] = line
            try:
                yield execute(example, args.semantics).to_json()
            except ProcexecError as exc:
                raise ProcexecError(f"{where}: {exc}") from None

    write_jsonl(args.out, references())


def cmd_card(args: argparse.Namespace) -> None:
    _, _, seed, lengths, per_length = _suite_settings(args)
    directory = Path(args.datasets_dir)
    if not directory.is_dir():
        raise ProcexecError(f"{directory}: datasets directory not found")
    names = args.datasets or sorted(p.name.removesuffix(".jsonl") for p in directory.glob("*.jsonl"))
    if not names:
        raise ProcexecError(f"{directory}: no dataset files (*.jsonl)")
    files = [directory / f"{name}.jsonl" for name in names]
    missing = [str(f) for f in files if not f.exists()]
    if missing:
        raise ProcexecError(f"dataset files not found: {', '.join(missing)}")
    with atomic_write(args.out) as handle:
        handle.write(render_card(files, seed, lengths, per_length))


def cmd_table4(args: argparse.Namespace) -> None:
    from procexec.benchmark.table4 import (  # pandas: here only
        TABLE4_SEMANTICS,
        base_suite_finals,
        reference_files,
        side_by_side,
        table4,
    )
    from procexec.io.formats import format_sci

    files = reference_files(args.references_dir, args.datasets)
    if not files:
        raise ProcexecError(f"{args.references_dir}: no reference files (<dataset id>.jsonl)")
    ours = table4(base_suite_finals(files, args.semantics or TABLE4_SEMANTICS))
    if ours.empty:
        raise ProcexecError(f"no base-suite (k1) references in {args.references_dir}")
    table = side_by_side(ours)
    table["n"] = ours["n"]
    table["n_nan"] = ours["n_nan"]
    if args.out:
        with atomic_write(args.out) as handle:
            table.to_csv(handle, float_format="%.6g")
    shown = table[[c for c in table.columns if not c.endswith("_gap") and c not in ("n", "n_nan")]]
    print(shown.map(format_sci).to_string(), file=sys.stdout)


def cmd_check_config(args: argparse.Namespace) -> None:
    """The workflow's own verdict (``Study.checked``: schema, cross-field rules, endpoint keys, the lock, the
    budget, the nodes' host memory, the pilot's measurement)."""
    from procexec.cluster.workflow import Study

    study = Study.checked(args.configs)
    print(f"{' + '.join(args.configs)}: valid ({len(study.datasets)} datasets, {len(study.run_models)} run models)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("check-config", help="validate config files merged as the workflow merges them")
    p.add_argument("configs", nargs="+", metavar="CONFIG", help="config.yaml, then the overlays in --configfile order")
    p.set_defaults(func=cmd_check_config)

    p = subparsers.add_parser("generate", help="write one dataset's examples as JSON Lines")
    p.add_argument("--dataset", required=True, help="dataset id, e.g. add_int_1-10_k1")
    p.add_argument("--out", required=True, help="output .jsonl")
    _add_suite_options(p)
    p.set_defaults(func=cmd_generate)

    p = subparsers.add_parser("execute", help="compute reference outputs for a dataset file")
    p.add_argument("--in", dest="input", required=True, help="dataset .jsonl from `procexec generate`")
    p.add_argument("--out", required=True, help="output references .jsonl")
    p.add_argument(
        "--semantics",
        choices=SEMANTICS,
        default="default",
        help="default (spec section 2) or appendix-a (the paper's executor)",
    )
    p.set_defaults(func=cmd_execute)

    p = subparsers.add_parser("card", help="write a markdown dataset card for a generated suite")
    p.add_argument("--datasets-dir", required=True)
    p.add_argument("--datasets", nargs="*", help="dataset ids to include (default: every *.jsonl)")
    p.add_argument("--out", required=True)
    _add_suite_options(p)
    p.set_defaults(func=cmd_card)

    p = subparsers.add_parser("table4", help="the paper's Table 4 from the references, beside the paper's values")
    p.add_argument("--references-dir", required=True)
    p.add_argument("--datasets", nargs="*", help="dataset ids to summarise (default: every <id>.jsonl of the folder)")
    p.add_argument("--out", help="also write the table as CSV")
    p.add_argument(
        "--semantics",
        choices=SEMANTICS,
        help="which final value to summarise: appendix-a (what the paper's executor returned, as the "
        "paper's Table 4 and every Table 4 of the study do; the default), or default",
    )
    p.set_defaults(func=cmd_table4)

"""Report subcommands: figures, tables, report (flags as in docs/interfaces.md).

The heavy modules (matplotlib, seaborn) are imported inside the handlers so that
every other ``procexec`` command starts fast.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from procexec.cli.options import add_config_option, int_range, load_config, positive_int, seed_int


def cmd_figures(args: argparse.Namespace) -> None:
    from procexec.analysis.figures.write import write_figures

    manifest = write_figures(
        load_config(args.config), args.aggregate_dir, args.out_dir, workers=args.workers, dpi=args.dpi
    )
    drawn = sum(1 for f in manifest if f["files"])
    print(f"{args.out_dir}: {drawn} figures drawn (PNG + SVG), {len(manifest) - drawn} without data", file=sys.stderr)


def cmd_tables(args: argparse.Namespace) -> None:
    from procexec.analysis.tables import write_tables

    written = write_tables(
        load_config(args.config),
        args.aggregate_dir,
        args.references_dir,
        args.out_dir,
        args.datasets,
        resamples=args.resamples,
        seed=args.seed,
    )
    print(f"{args.out_dir}: {len(written) // 2} tables (CSV + LaTeX)", file=sys.stderr)


def cmd_report(args: argparse.Namespace) -> None:
    from procexec.analysis.loops import read_cost, read_loop_figures
    from procexec.analysis.report import TEMPLATES_DIR, render
    from procexec.generation.speculative import read_pilot_figures

    config = load_config(args.config)
    page = render(
        args.config,
        config,
        args.aggregate_dir,
        args.figures_dir,
        args.tables_dir,
        args.generations_dir,
        args.references_dir,
        args.benchmarks,
        args.out,
        args.templates_dir or TEMPLATES_DIR,
        args.prompts_dir,
        read_pilot_figures(args.speculative, config.run_models),  # the pilot's, by model
        read_loop_figures(args.loops),  # the pilot's loops against the guard, by model
        read_cost(args.cost),
    )
    print(f"{page}: report written", file=sys.stderr)


def cmd_speculative_pilot(args: argparse.Namespace) -> None:
    from procexec.generation.speculative import pilot_figures
    from procexec.io.files import atomic_write

    figures = pilot_figures(
        args.model,
        [Path(p) for p in args.plain],
        [Path(p) for p in args.speculative],
        Path(args.plain_store),
        Path(args.speculative_store),
    )
    with atomic_write(args.out) as handle:
        handle.write(json.dumps(figures.model_dump(), indent=1) + "\n")
    print(
        f"{args.model}: token ids identical {figures.identical} of {figures.generations}, "
        f"mean acceptance length {figures.mean_acceptance_length}, speed x{figures.speed_ratio}",
        file=sys.stderr,
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("figures", help="the paper's figures and the trace diagnostics (PNG + SVG)")
    add_config_option(p, what="workflow config (model names, groups)")
    p.add_argument("--aggregate-dir", required=True, help="folder with metrics.parquet and scores.parquet")
    p.add_argument("--out-dir", required=True, help="writes <figure>.png, <figure>.svg and manifest.json")
    p.add_argument(
        "--workers", type=positive_int, default=None, help="drawing processes (>= 1); default: the CPUs available"
    )
    p.add_argument("--dpi", type=int_range(10, 1200), default=90, help="PNG resolution, 10..1200; default: %(default)s")
    p.set_defaults(func=cmd_figures)

    p = subparsers.add_parser("tables", help="the paper's Tables 1-4 and the reproduction table (CSV + booktabs LaTeX)")
    add_config_option(p, what="workflow config (Table 1)")
    p.add_argument("--aggregate-dir", required=True, help="folder with metrics.parquet and scores.parquet")
    p.add_argument("--references-dir", required=True, help="reference JSON Lines (Table 4)")
    p.add_argument("--datasets", nargs="*", help="dataset ids for Table 4 (default: every <id>.jsonl of the folder)")
    p.add_argument("--out-dir", required=True, help="writes <table>.csv and <table>.tex")
    p.add_argument(
        "--resamples",
        type=int_range(1, 1_000_000),
        default=1000,
        help="bootstrap resamples of the reproduction table (as for aggregate), 1..1000000; default: %(default)s",
    )
    p.add_argument("--seed", type=seed_int, default=0, help="bootstrap seed (as for aggregate); default: %(default)s")
    p.set_defaults(func=cmd_tables)

    p = subparsers.add_parser("report", help="the appendix report: one HTML page that opens from disk")
    add_config_option(p, what="workflow config")
    p.add_argument("--aggregate-dir", required=True, help="folder with metrics.parquet and scores.parquet")
    p.add_argument("--figures-dir", required=True, help="output of `procexec figures`")
    p.add_argument("--tables-dir", required=True, help="output of `procexec tables`")
    p.add_argument("--generations-dir", required=True, help="results/generations (Appendix I examples)")
    p.add_argument("--references-dir", required=True, help="reference JSON Lines (Appendix I traces)")
    p.add_argument(
        "--benchmarks",
        nargs="*",
        default=[],
        metavar="TSV",
        help="the infer jobs' Snakemake benchmark files, .../infer/MODEL/SHARD.tsv: summed into GPU-hours",
    )
    p.add_argument(
        "--prompts-dir",
        default=None,
        help="rendered prompts, KEY.json from `procexec show-prompt --out` (Appendix B, commits); optional",
    )
    p.add_argument(
        "--speculative",
        nargs="*",
        default=[],
        metavar="JSON",
        help="the pilot's speculative figures per model (`procexec speculative-pilot --out`); optional",
    )
    p.add_argument(
        "--loops",
        nargs="*",
        default=[],
        metavar="JSON",
        help="the pilot's loop figures per model (`procexec loops --out`): the Loops section; optional",
    )
    p.add_argument(
        "--cost",
        default=None,
        metavar="JSON",
        help="the pilot's projection (`procexec cost --measured RESULTS --json --out`): the Loops section's "
        "GPU-hours; optional",
    )
    p.add_argument("--out", required=True, help="the HTML page to write, e.g. results/report/index.html")
    p.add_argument(
        "--templates-dir", default=None, help="Jinja2 templates; default: the package's own (procexec/templates)"
    )
    p.set_defaults(func=cmd_report)

    p = subparsers.add_parser(
        "speculative-pilot", help="one model's pilot run plain and with drafting: acceptance, speed, identical ids"
    )
    p.add_argument("--model", required=True, help="model key in the config")
    p.add_argument("--plain", nargs="+", required=True, metavar="SHARD", help="the plain half's shard files")
    p.add_argument("--speculative", nargs="+", required=True, metavar="SHARD", help="the speculative half's shards")
    p.add_argument("--plain-store", required=True, help="the plain half's store (its stats/ give the decode rate)")
    p.add_argument("--speculative-store", required=True, help="the speculative half's store (rate, draft counters)")
    p.add_argument("--out", required=True, help="the figures, .json (the report's --speculative)")
    p.set_defaults(func=cmd_speculative_pilot)

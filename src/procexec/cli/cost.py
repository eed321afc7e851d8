"""``procexec cost``: the study's decoded tokens, GPU-hours and wall time, projected or fitted to a pilot."""

from __future__ import annotations

import argparse
import json

from procexec import config as config_module
from procexec.cli.options import int_range, seed_int


def cmd_cost(args: argparse.Namespace) -> None:
    from procexec.cluster.cost import format_projection, project_study

    rows = project_study(config_module.load(args.config), args.measured, seed=args.seed, resamples=args.resamples)
    if args.json:
        print(json.dumps([r.to_json() for r in rows], indent=2))
    else:
        print(format_projection(rows))


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("cost", help="per model: decoded tokens, H200 GPU-hours and wall time of the full study")
    p.add_argument("--config", required=True, help="workflow config (suite, models, rerun rule, budgets)")
    p.add_argument("--measured", default=None,
                   help="a smoke/pilot's results folder (RESULTS/generations/<model>/store): fit the projection to it")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--seed", type=seed_int, default=0, help="bootstrap seed (with --measured); default: %(default)s")
    p.add_argument("--resamples", type=int_range(1, 100_000), default=1000,
                   help="bootstrap resamples of the measured examples, 1..100000; default: %(default)s")
    p.set_defaults(func=cmd_cost)

"""``procexec cost``: the study's decoded tokens, GPU-hours and wall time, projected or fitted to a pilot."""

from __future__ import annotations

import argparse
import json

from procexec.cli.options import add_config_option, float_range, int_range, load_config, seed_int
from procexec.errors import ProcexecError


def cmd_cost(args: argparse.Namespace) -> None:
    from procexec.cluster.cost.catalog import GIB, catalog_for
    from procexec.cluster.cost.levers import format_levers, lever_report
    from procexec.cluster.cost.projection import project_study
    from procexec.cluster.cost.report import budget_checks, format_projection, haircuts, paper_ratio
    from procexec.config.hardware import hardware_label, hardware_title
    from procexec.io.files import atomic_write

    config = load_config(args.config)
    catalog = catalog_for(config).with_haircuts(args.runtime_overhead_gib, args.ep_overhead)
    memory = catalog.hardware.memory_bytes
    if args.runtime_overhead_gib is not None and args.runtime_overhead_gib * GIB >= memory:
        raise ProcexecError(
            f"--runtime-overhead-gib {args.runtime_overhead_gib:g}: not below one GPU's memory "
            f"({hardware_label(config.cluster)}: {memory / GIB:.0f} GiB)"
        )
    rows = project_study(config, args.measured, seed=args.seed, resamples=args.resamples, catalog=catalog)
    budgets = budget_checks(config, rows)
    paper = args.baseline == "paper"
    cuts = haircuts(catalog, rows)
    # the levers: stated on both sides of the ratio (a measured projection's tokens are the pilot's own)
    levers = None
    if paper:
        levers = lever_report(
            config, catalog, rows if args.measured is None else project_study(config, catalog=catalog)
        )
    if args.json:
        report = {
            "models": [r.to_json() for r in rows],
            "gpu_hours": sum(r.gpu_hours for r in rows),
            "gpu_hours_interval": [sum(r.gpu_hours_interval[i] for r in rows) for i in (0, 1)],
            "tokens_interval": [sum(r.tokens_interval[i] for r in rows) for i in (0, 1)],
            "haircuts": cuts,
            "budgets": [b.to_json() for b in budgets],
        }
        if paper:
            report["baseline"] = {
                "name": "paper",
                "gpu_hours": sum(r.paper_gpu_hours for r in rows),
                "ratio": paper_ratio(rows),
                **(levers.to_json() if levers else {}),
            }
        text = json.dumps(report, indent=2)
    else:
        text = format_projection(
            rows,
            budgets,
            paper,
            cuts,
            levers=format_levers(levers) if levers else (),
            gpu=hardware_title(config.cluster),
        )
    if args.out is None:
        print(text)
        return
    with atomic_write(args.out) as handle:
        handle.write(text + "\n")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "cost",
        help="per model: decoded tokens, GPU-hours (on cluster.hardware) and wall time of the full study, "
        "its parallel layout, and the budgets (cluster.gpu_hours_budget, model_gpu_hours_budgets)",
    )
    add_config_option(p, what="workflow config (suite, models, rerun rule, budgets)")
    p.add_argument(
        "--measured",
        default=None,
        help="a smoke/pilot's results folder (RESULTS/generations/<model>/store): fit the projection to it",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--out", default=None, help="write the table or JSON to this file (atomically) instead of stdout")
    p.add_argument(
        "--baseline",
        choices=["paper"],
        default=None,
        help="paper: beside each model, the GPU-hours of the paper's layout (tensor parallel in-process, "
        "truncated generations regenerated) under the same stated token model, and the ratio",
    )
    p.add_argument(
        "--runtime-overhead-gib",
        type=float_range(0.0, 10000.0),
        default=None,
        help="GPU memory per GPU that is neither weights nor KV cache (activations, CUDA graphs, buffers), for "
        "every model, below one GPU's memory; default: architecture.yaml's (4, DS-685 and KK-1T 10)",
    )
    p.add_argument(
        "--ep-overhead",
        type=float_range(0.0, 10.0),
        default=None,
        help="decode step time added by expert parallel's all-to-all, as a share of the step, 0..10; "
        "default: architecture.yaml's (0.2)",
    )
    p.add_argument("--seed", type=seed_int, default=0, help="bootstrap seed (with --measured); default: %(default)s")
    p.add_argument(
        "--resamples",
        type=int_range(1, 100_000),
        default=1000,
        help="bootstrap resamples of the measured examples, 1..100000; default: %(default)s",
    )
    p.set_defaults(func=cmd_cost)

"""``procexec plan``: each model's layout on a GPU of the catalog (or the config's own), before any GPU is held."""

from __future__ import annotations

import argparse
import json

from procexec.cli.options import add_config_option


def cmd_plan(args: argparse.Namespace) -> int:
    from procexec import config as config_module
    from procexec.cluster.layouts import planned
    from procexec.cluster.plan import format_plan, plan_report, plan_rows
    from procexec.config.hardware import catalog_names
    from procexec.errors import ProcexecError

    raw = config_module.read_merged(args.config)
    if args.hardware is not None:
        if args.hardware not in catalog_names():
            raise ProcexecError(
                f"--hardware {args.hardware!r}: not in the catalog ({', '.join(catalog_names())}; "
                "procexec/data/hardware.yaml); a GPU of your own goes in the config's cluster.hardware"
            )
        raw.setdefault("cluster", {})
        if isinstance(raw["cluster"], dict):
            raw["cluster"]["hardware"] = args.hardware
    # a layout that does not fit is reported per model (and the exit code says so), not refused as a whole
    source = " + ".join(args.config)
    config = planned(config_module.prepare(raw, source), source, refuse_unfit=False)
    rows = plan_rows(config)
    if args.json:
        print(json.dumps(plan_report(config, rows), indent=2))
    else:
        print(format_plan(config, rows))
    return 0 if all(r.plan.fits for r in rows) else 1


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "plan",
        help="per model: its parallel layout on the GPU (cluster.hardware, or --hardware), the nodes, the "
        "sequences of KV room at the mean and the maximum context, and the projected GPU-hours beside the "
        "paper-style baseline; exit 1 when a run model's layout does not fit",
    )
    add_config_option(p, what="workflow config (models, cluster.hardware)")
    p.add_argument(
        "--hardware",
        default=None,
        metavar="NAME",
        help="a GPU of procexec/data/hardware.yaml (h200, h100, a100, b200) in place of cluster.hardware",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=cmd_plan)

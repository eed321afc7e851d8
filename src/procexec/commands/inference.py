"""Inference subcommands: prepare-model, infer, collect (docs/inference.md)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from procexec import config as config_module
from procexec.commands import positive_int




def cmd_prepare_model(args: argparse.Namespace) -> None:
    from procexec.inference.prepare import prepare_model
    from procexec.inference.run import model_entry

    config = config_module.load(args.config)
    manifest = prepare_model(model_entry(config, args.model), Path(args.out), seed=args.seed)
    print(f"prepared {args.model} ({manifest['source']}) -> {args.out}", file=sys.stderr)


def cmd_infer(args: argparse.Namespace) -> None:
    from procexec.inference.run import run_job

    config = config_module.load(args.config)
    result = run_job(
        config,
        args.model,
        Path(args.datasets_dir),
        args.datasets,
        args.shard,
        args.num_shards,
        Path(args.store),
        Path(args.out),
        Path(args.manifest) if args.manifest else None,
        progress=not args.no_progress,
    )
    print(
        f"{args.model} shard {args.shard}-of-{args.num_shards}: {len(result.records)} records, "
        f"{result.generated} generated, {result.cached} from the store, {result.wall_time_s:.1f} s",
        file=sys.stderr,
    )


def cmd_collect(args: argparse.Namespace) -> None:
    from procexec.inference.collect import collect

    written = collect(args.model, [Path(s) for s in args.shards], Path(args.datasets_dir), args.datasets, Path(args.out_dir))
    print(f"{args.model}: collected {sum(written.values())} records into {len(written)} file(s)", file=sys.stderr)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("prepare-model", help="make a configured model loadable and write its manifest")
    p.add_argument("--config", required=True)
    p.add_argument("--model", required=True, help="model key in the config")
    p.add_argument("--out", required=True, help="manifest .json; local models are built into hf/ beside it")
    p.add_argument("--seed", type=int, default=0, help="seed of the tiny-llama recipe; default: %(default)s")
    p.set_defaults(func=cmd_prepare_model)

    p = subparsers.add_parser("infer", help="generate one shard of a model's outputs with vLLM (resumable)")
    p.add_argument("--config", required=True)
    p.add_argument("--model", required=True, help="model key in the config")
    p.add_argument("--datasets-dir", required=True)
    p.add_argument("--datasets", nargs="+", required=True, help="dataset ids")
    p.add_argument("--shard", type=positive_int, default=1, help="which shard, 1..N; default: %(default)s")
    p.add_argument("--num-shards", type=positive_int, default=1, help="N; default: %(default)s")
    p.add_argument("--store", required=True, help="resumable store directory (not a workflow output)")
    p.add_argument("--out", required=True, help="shard records, .jsonl.gz")
    p.add_argument("--manifest", help="manifest from prepare-model (required for local sources)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=cmd_infer)

    p = subparsers.add_parser("collect", help="merge shard files into one {dataset}.jsonl.gz per dataset")
    p.add_argument("--model", required=True)
    p.add_argument("--shards", nargs="+", required=True)
    p.add_argument("--datasets-dir", required=True)
    p.add_argument("--datasets", nargs="+", required=True)
    p.add_argument("--out-dir", required=True)
    p.set_defaults(func=cmd_collect)

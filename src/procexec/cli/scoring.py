"""Scoring subcommands: score, aggregate, simulate, loops (file I/O around the pure scoring modules).

Bad input (a broken line, an id that is not in the references, a missing
generation) stops the command with the file and line; outputs are written to a
temporary file and renamed (``aggregate``'s three files as one ``FileSet``), so
a failed run leaves the previous outputs as they were.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from procexec.cli.options import add_config_option, float_range, int_range, load_config, seed_int
from procexec.errors import ProcexecError

# pandas/pyarrow load inside the commands: every workflow job starts this CLI,
# and most of them (generate, execute, infer) never need them.


def cmd_score(args: argparse.Namespace) -> None:
    from procexec.io.parquet import write_parquet
    from procexec.scoring.files import score_file

    table = score_file(args.generations, args.references, args.dataset)
    write_parquet(table, args.out)
    print(f"{args.out}: {table.num_rows} examples scored", file=sys.stderr)


def cmd_aggregate(args: argparse.Namespace) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from procexec.analysis.aggregate import aggregate
    from procexec.io.files import FileSet
    from procexec.scoring.files import read_scores

    scores = read_scores(args.scores)
    frame = scores.to_pandas()
    duplicated = frame.duplicated(["model", "id"])
    if duplicated.any():
        row = frame[duplicated].iloc[0]
        raise ProcexecError(f"example {row['id']!r} of model {row['model']!r} appears in more than one score file")
    metrics = aggregate(frame, resamples=args.resamples, seed=args.seed)
    out = Path(args.out_dir)
    with FileSet(out) as files:  # the three files change together or not at all
        with files.open("scores.parquet", binary=True) as handle:
            pq.write_table(scores, handle)
        with files.open("metrics.parquet", binary=True) as handle:
            pq.write_table(pa.Table.from_pandas(metrics, preserve_index=False), handle)
        with files.open("metrics.csv") as handle:
            metrics.to_csv(handle, index=False)
    print(f"{out}: {len(metrics)} metric rows from {len(frame)} examples", file=sys.stderr)


def cmd_simulate(args: argparse.Namespace) -> None:
    from procexec.io.jsonl import write_jsonl
    from procexec.records import Example, Reference
    from procexec.scoring.files import read_records
    from procexec.scoring.simulator import simulate

    refs = read_records(args.references, Reference)
    examples = read_records(args.dataset, Example)
    for rid, (line, _) in refs.items():
        if rid not in examples:
            raise ProcexecError(f"{args.references}:{line}: id {rid!r} is not in the dataset {args.dataset}")

    def records() -> Iterator[dict[str, Any]]:
        for rid, (line, ref) in refs.items():
            example_line, example = examples[rid]
            if len(ref.trace) != example.length + 2:
                raise ProcexecError(f"{args.references}:{line}: the simulator needs a default-semantics trace")
            try:
                record = simulate(
                    example, ref, seed=args.seed, failure_rate=args.failure_rate, target_chars=args.target_chars
                )
            except ProcexecError as exc:  # a procedure outside the grammar
                raise ProcexecError(f"{args.dataset}:{example_line}: {exc}") from None
            yield record.to_json()

    count = write_jsonl(args.out, records())
    print(f"{args.out}: {count} SIMULATED generations (model key 'simulator'; not a language model)")


def cmd_loops(args: argparse.Namespace) -> None:
    import json

    from procexec.analysis.loops import loop_figures
    from procexec.config.guard import evaluated_guard
    from procexec.generation.job_settings import model_entry
    from procexec.io.files import atomic_write

    config = load_config(args.config)
    model = model_entry(config, args.model)
    guard, source = evaluated_guard(model, config.inference)
    figures = loop_figures(args.model, guard, source, args.generations, args.references_dir, args.datasets_dir)
    with atomic_write(args.out) as handle:
        handle.write(json.dumps(figures, indent=1) + "\n")
    print(
        f"{args.model}: {figures['loops']} of {figures['reruns']} reruns end in a loop ({figures['tail_tokens']:,} "
        f"tail tokens); the guard ({source}) stops {figures['guard_stops']}, saving {figures['saved_tokens']:,} "
        f"tokens; {figures['escapes']} escape(s)",
        file=sys.stderr,
    )


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("score", help="score one generations file against its references (one row per example)")
    p.add_argument("--generations", required=True, help="GenerationRecord JSON Lines (.jsonl or .jsonl.gz)")
    p.add_argument("--references", required=True, help="Reference JSON Lines of the same dataset")
    p.add_argument(
        "--dataset", required=True, help="Example JSON Lines of the same dataset (procedures, for trace alignment)"
    )
    p.add_argument("--out", required=True, help="score parquet to write")
    p.set_defaults(func=cmd_score)

    p = subparsers.add_parser("aggregate", help="tidy metrics with bootstrap CIs from score files")
    p.add_argument("--scores", required=True, nargs="+", help="score parquet files")
    p.add_argument("--out-dir", required=True, help="writes metrics.parquet, metrics.csv, scores.parquet")
    p.add_argument(
        "--resamples",
        type=int_range(1, 1_000_000),
        default=1000,
        help="bootstrap resamples, 1..1000000; default: %(default)s",
    )
    p.add_argument("--seed", type=seed_int, default=0, help="bootstrap seed (>= 0); default: %(default)s")
    p.set_defaults(func=cmd_aggregate)

    p = subparsers.add_parser(
        "simulate", help="write SIMULATED step-by-step generations with labelled failures (a test fixture, not a model)"
    )
    p.add_argument("--dataset", required=True, help="Example JSON Lines")
    p.add_argument("--references", required=True, help="Reference JSON Lines of the same dataset")
    p.add_argument("--out", required=True, help="GenerationRecord JSON Lines to write (.jsonl or .jsonl.gz)")
    p.add_argument("--seed", type=seed_int, default=0, help="simulator seed (>= 0); default: %(default)s")
    p.add_argument(
        "--failure-rate",
        type=float_range(0.0, 1.0),
        default=0.5,
        help="share of examples with a failure, 0..1; default: %(default)s",
    )
    p.add_argument(
        "--target-chars",
        type=int_range(0, 10_000_000),
        default=8000,
        help="approximate output length in characters; default: %(default)s",
    )
    p.set_defaults(func=cmd_simulate)

    p = subparsers.add_parser(
        "loops",
        help="one model's pilot against the repetition guard: loops, tails, where the guard stops each rerun and "
        "what the cut changes (escapes)",
    )
    add_config_option(p, what="workflow config (the guard: models.KEY.rerun_repetition_guard, else inference's)")
    p.add_argument("--model", required=True, help="model key")
    p.add_argument(
        "--generations",
        required=True,
        nargs="+",
        help="the model's generation files, one per dataset (DATASET.jsonl.gz)",
    )
    p.add_argument("--references-dir", required=True, help="Reference JSON Lines per dataset (DATASET.jsonl)")
    p.add_argument("--datasets-dir", required=True, help="Example JSON Lines per dataset (DATASET.jsonl)")
    p.add_argument("--out", required=True, help="the figures, .json (the report's --loops)")
    p.set_defaults(func=cmd_loops)

"""Scoring subcommands: score, aggregate, simulate (file I/O around the pure scoring modules).

Bad input (a broken line, an id that is not in the references, a missing
generation) stops the command with the file and line; outputs are written to a
temporary file and renamed, so a failed run leaves nothing behind.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from procexec.aggregate import aggregate
from procexec.errors import ProcexecError
from procexec.jsonio import atomic_write, read_jsonl, write_jsonl
from procexec.records import Example, GenerationRecord, Reference
from procexec.scoring import SCORE_COLUMNS, score_example
from procexec.simulator import simulate

SCORE_SCHEMA = pa.schema([(name, pa.type_for_alias(kind)) for name, kind in SCORE_COLUMNS.items()])


def read_records(path: str | Path, cls: type) -> dict[str, tuple[int, Any]]:
    """``id -> (line, record)`` of a JSON Lines file of ``cls`` records; duplicate ids are refused."""
    records: dict[str, tuple[int, Any]] = {}
    for line, obj in read_jsonl(path):
        record = cls.from_json(obj, f"{path}:{line}")
        if record.id in records:
            raise ProcexecError(f"{path}:{line}: duplicate id {record.id!r} (first on line {records[record.id][0]})")
        records[record.id] = (line, record)
    return records


def default_dataset_path(references: str | Path) -> Path:
    """``results/references/ID.jsonl`` -> ``results/datasets/ID.jsonl`` (the workflow layout)."""
    ref = Path(references)
    return ref.parent.parent / "datasets" / ref.name


def score_file(generations: str | Path, references: str | Path, dataset: str | Path | None = None) -> pa.Table:
    """Score rows of one generations file (the highest attempt of every id), in reference order."""
    dataset = Path(dataset) if dataset else default_dataset_path(references)
    if not dataset.exists():
        raise ProcexecError(f"{dataset}: dataset file not found (needed for the procedures; pass --dataset)")
    refs = read_records(references, Reference)
    examples = read_records(dataset, Example)
    best: dict[str, tuple[int, dict[str, Any]]] = {}
    seen: dict[tuple[str, int], int] = {}
    model = None
    for line, obj in read_jsonl(generations):
        where = f"{generations}:{line}"
        gen = GenerationRecord.from_json(obj, where)
        if gen.id not in refs:
            raise ProcexecError(f"{where}: id {gen.id!r} is not in the references {references}")
        if gen.id not in examples:
            raise ProcexecError(f"{where}: id {gen.id!r} is not in the dataset {dataset}")
        ref_line, ref = refs[gen.id]
        if (gen.dataset, gen.length, gen.index) != (ref.dataset, ref.length, ref.index):
            raise ProcexecError(f"{where}: dataset/length/index disagree with {references}:{ref_line}")
        if model is not None and gen.model != model:
            raise ProcexecError(f"{where}: model {gen.model!r} differs from {model!r} earlier in the file")
        model = gen.model
        if (gen.id, gen.attempt) in seen:
            raise ProcexecError(
                f"{where}: attempt {gen.attempt} of {gen.id!r} already on line {seen[gen.id, gen.attempt]}"
            )
        seen[gen.id, gen.attempt] = line
        if gen.id not in best or gen.attempt > best[gen.id][0]:
            example_line, example = examples[gen.id]
            try:
                best[gen.id] = (gen.attempt, score_example(gen, ref, example))
            except ProcexecError as exc:  # a procedure outside the grammar
                raise ProcexecError(f"{dataset}:{example_line}: {exc}") from None
    missing = [(line, rid) for rid, (line, _) in refs.items() if rid not in best]
    if missing:
        line, rid = missing[0]
        raise ProcexecError(
            f"{references}:{line}: no generation for id {rid!r} in {generations} ({len(missing)} ids missing)"
        )
    return pa.Table.from_pylist([best[rid][1] for rid in refs], schema=SCORE_SCHEMA)


def write_parquet(table: pa.Table, path: str | Path) -> None:
    with atomic_write(path, binary=True) as handle:
        pq.write_table(table, handle)


def read_scores(paths: list[str]) -> pa.Table:
    """Concatenate score files, refusing foreign columns and repeated (model, id) rows."""
    tables = []
    for path in paths:
        if not Path(path).exists():
            raise ProcexecError(f"{path}: file not found")
        try:
            table = pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise ProcexecError(f"{path}: not a readable parquet file ({exc})") from None
        if table.column_names != list(SCORE_COLUMNS):
            raise ProcexecError(f"{path}: columns differ from the score columns of docs/interfaces.md")
        tables.append(table.cast(SCORE_SCHEMA))
    if not tables:
        raise ProcexecError("no score files given")
    return pa.concat_tables(tables)


def cmd_score(args: argparse.Namespace) -> None:
    table = score_file(args.generations, args.references, args.dataset)
    write_parquet(table, args.out)
    print(f"{args.out}: {table.num_rows} examples scored")


def cmd_aggregate(args: argparse.Namespace) -> None:
    scores = read_scores(args.scores)
    frame = scores.to_pandas()
    duplicated = frame.duplicated(["model", "id"])
    if duplicated.any():
        row = frame[duplicated].iloc[0]
        raise ProcexecError(f"example {row['id']!r} of model {row['model']!r} appears in more than one score file")
    metrics = aggregate(frame, resamples=args.resamples, seed=args.seed)
    out = Path(args.out_dir)
    write_parquet(scores, out / "scores.parquet")
    write_parquet(pa.Table.from_pandas(metrics, preserve_index=False), out / "metrics.parquet")
    with atomic_write(out / "metrics.csv") as handle:
        metrics.to_csv(handle, index=False)
    print(f"{out}: {len(metrics)} metric rows from {len(frame)} examples")


def cmd_simulate(args: argparse.Namespace) -> None:
    refs = read_records(args.references, Reference)
    examples = read_records(args.dataset, Example)
    for rid, (line, _) in refs.items():
        if rid not in examples:
            raise ProcexecError(f"{args.references}:{line}: id {rid!r} is not in the dataset {args.dataset}")
    records = (
        simulate(examples[rid][1], ref, seed=args.seed, failure_rate=args.failure_rate, target_chars=args.target_chars)
        for rid, (_, ref) in refs.items()
    )
    count = write_jsonl(args.out, (r.to_json() for r in records))
    print(f"{args.out}: {count} SIMULATED generations (model key 'simulator'; not a language model)")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("score", help="score one generations file against its references (one row per example)")
    p.add_argument("--generations", required=True, help="GenerationRecord JSON Lines (.jsonl or .jsonl.gz)")
    p.add_argument("--references", required=True, help="Reference JSON Lines of the same dataset")
    p.add_argument(
        "--dataset",
        help="Example JSON Lines (procedures, for trace alignment); default: ../datasets/<name> beside the references",
    )
    p.add_argument("--out", required=True, help="score parquet to write")
    p.set_defaults(func=cmd_score)

    p = subparsers.add_parser("aggregate", help="tidy metrics with bootstrap CIs from score files")
    p.add_argument("--scores", required=True, nargs="+", help="score parquet files")
    p.add_argument("--out-dir", required=True, help="writes metrics.parquet, metrics.csv, scores.parquet")
    p.add_argument("--resamples", type=int, default=1000, help="bootstrap resamples; default: %(default)s")
    p.add_argument("--seed", type=int, default=0, help="bootstrap seed; default: %(default)s")
    p.set_defaults(func=cmd_aggregate)

    p = subparsers.add_parser(
        "simulate", help="write SIMULATED step-by-step generations with labelled failures (a test fixture, not a model)"
    )
    p.add_argument("--dataset", required=True, help="Example JSON Lines")
    p.add_argument("--references", required=True, help="Reference JSON Lines of the same dataset")
    p.add_argument("--out", required=True, help="GenerationRecord JSON Lines to write (.jsonl or .jsonl.gz)")
    p.add_argument("--seed", type=int, default=0, help="simulator seed; default: %(default)s")
    p.add_argument(
        "--failure-rate", type=float, default=0.5, help="share of examples with a failure; default: %(default)s"
    )
    p.add_argument("--target-chars", type=int, default=8000, help="approximate output length; default: %(default)s")
    p.set_defaults(func=cmd_simulate)

"""Score files: read a generations file and its references, score every example, write parquet.

The file-level edge of scoring (``procexec.scoring`` is the pure per-example
part): duplicate or unknown ids and broken lines are refused naming file and
line, and parquet is written atomically.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from procexec.errors import ProcexecError
from procexec.jsonio import atomic_write, read_jsonl
from procexec.records import Example, GenerationRecord, Reference
from procexec.scoring import SCORE_COLUMNS, score_example

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

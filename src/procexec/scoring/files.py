"""Score files: read a generations file and its references, score every example; read score files back.

The file-level edge of scoring (``procexec.scoring.score`` is the pure per-example
part): duplicate or unknown ids and broken lines are refused naming file and
line. Parquet itself is ``procexec.io.parquet``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import pyarrow as pa

from procexec.errors import ProcexecError
from procexec.io.jsonl import read_jsonl
from procexec.io.parquet import read_schema, read_table
from procexec.records import Example, GenerationRecord, Reference, first_missing
from procexec.scoring.score import SCORE_COLUMNS, score_example

SCORE_SCHEMA = pa.schema([(name, pa.type_for_alias(kind)) for name, kind in SCORE_COLUMNS.items()])

KeyedRecord = TypeVar("KeyedRecord", Example, Reference)


def read_records(path: str | Path, cls: type[KeyedRecord]) -> dict[str, tuple[int, KeyedRecord]]:
    """``id -> (line, record)`` of a JSON Lines file of ``cls`` records; duplicate ids are refused."""
    records: dict[str, tuple[int, KeyedRecord]] = {}
    for line, obj in read_jsonl(path):
        record = cls.from_json(obj, f"{path}:{line}")
        if record.id in records:
            raise ProcexecError(f"{path}:{line}: duplicate id {record.id!r} (first on line {records[record.id][0]})")
        records[record.id] = (line, record)
    return records


def score_file(generations: str | Path, references: str | Path, dataset: str | Path) -> pa.Table:
    """Score rows of one generations file (the highest attempt of every id), in reference order.

    ``dataset`` is the Example file of the same dataset: the procedures, for trace alignment.
    """
    dataset = Path(dataset)
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
    if gap := first_missing(((f"{references}:{line}", rid) for rid, (line, _) in refs.items()), best):
        raise ProcexecError(f"{gap.where}: no generation for id {gap.id!r} in {generations} ({gap.count} ids missing)")
    return pa.Table.from_pylist([best[rid][1] for rid in refs], schema=SCORE_SCHEMA)


def _column_difference(names: list[str]) -> str:
    missing = [c for c in SCORE_COLUMNS if c not in names]
    unknown = [c for c in names if c not in SCORE_COLUMNS]
    parts = [
        f"{what} {', '.join(columns[:5])}" for what, columns in (("missing", missing), ("unknown", unknown)) if columns
    ]
    return "; ".join(parts) or "in another order"


def read_scores(paths: list[str]) -> pa.Table:
    """Concatenate score files, refusing foreign columns and repeated (model, id) rows."""
    tables = []
    for path in paths:
        names = read_schema(path).names
        if names != list(SCORE_COLUMNS):
            raise ProcexecError(
                f"{path}: columns differ from the score columns of docs/interfaces.md "
                f"({_column_difference(names)}; scored by another procexec version? score it again)"
            )
        tables.append(read_table(path, SCORE_SCHEMA))
    if not tables:
        raise ProcexecError("no score files given")
    return pa.concat_tables(tables)

"""``procexec export generations``: the study's generations and their scores as a dataset, one config per model.

One row per generation record (every attempt; ``scored`` marks the attempt the score row is of, whose score
columns are filled), read from the files the workflow wrote: ``<results>/generations/<model>/<dataset>.jsonl.gz``
(``procexec collect`` or ``procexec import-harness``) and ``<results>/scores/<model>/<dataset>.parquet``.  The
card gives each model's provenance, as its records state it, and the reproduction verdict.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from procexec.analysis.reproduction import summary_line
from procexec.benchmark.suite import expand_suite
from procexec.config.model import Config
from procexec.errors import ProcexecError, reading
from procexec.io.jsonl import read_jsonl
from procexec.records import GenerationRecord
from procexec.release.folder import Input, data_file, dataset_folder, file_checksums, output_folder, readme, write_table
from procexec.scoring.files import SCORE_SCHEMA, read_scores

_GENERATION_COLUMNS: dict[str, pa.DataType] = {
    "id": pa.string(),
    "model": pa.string(),
    "dataset": pa.string(),
    "length": pa.int64(),
    "index": pa.int64(),
    "attempt": pa.int64(),
    "continues_attempt": pa.int64(),
    "prompt_sha256": pa.string(),
    "prompt_tokens": pa.int64(),
    "system_folded": pa.bool_(),
    "text": pa.string(),
    "num_generated_tokens": pa.int64(),
    "finish_reason": pa.string(),
    "provenance": pa.string(),
    "scored": pa.bool_(),
}
#: The generation's own fields, then every score column the record does not already hold.
GENERATIONS_SCHEMA = pa.schema(
    [*_GENERATION_COLUMNS.items(), *((f.name, f.type) for f in SCORE_SCHEMA if f.name not in _GENERATION_COLUMNS)]
)
#: The provenance fields the card shows (as the records hold them; absent ones are left out).
CARD_PROVENANCE = (
    "hf_id",
    "revision",
    "commit",
    "backend",
    "vllm_version",
    "stage",
    "template_date",
    "procexec_version",
    "harness",
)  # harness: lm-eval or inspect_ai (procexec import-harness)


def _generation_row(record: GenerationRecord, score: dict[str, Any] | None) -> dict[str, Any]:
    fields = record.to_json()
    row = {name: fields.get(name) for name in _GENERATION_COLUMNS if name not in ("provenance", "scored")}
    row["provenance"] = json.dumps(record.provenance, sort_keys=True, ensure_ascii=False)
    row["scored"] = score is not None
    return {**(score or {}), **row}


def model_rows(results: Path, model: str, datasets: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Every record of one model with its score columns, and the first record's provenance."""
    rows: list[dict[str, Any]] = []
    provenance: dict[str, Any] = {}
    for dataset in datasets:
        generations = results / "generations" / model / f"{dataset}.jsonl.gz"
        scores_file = results / "scores" / model / f"{dataset}.parquet"
        for path in (generations, scores_file):
            if not path.is_file():
                raise ProcexecError(f"{path}: not found (run the workflow, or import-harness and score, first)")
        scores = {(s["id"], s["attempt"]): s for s in read_scores([str(scores_file)]).to_pylist()}
        for line, obj in read_jsonl(generations):
            record = GenerationRecord.from_json(obj, f"{generations}:{line}")
            provenance = provenance or record.provenance
            rows.append(_generation_row(record, scores.pop((record.id, record.attempt), None)))
        if scores:
            (rid, attempt), _ = next(iter(scores.items()))
            raise ProcexecError(f"{scores_file}: scores {rid} attempt {attempt}, which {generations} does not hold")
    return rows, provenance


def _verdict(results: Path) -> str:
    table = results / "tables" / "reproduction.csv"
    if not table.is_file():
        return f"No reproduction table ({table} not found)."
    with reading(table, (pd.errors.ParserError, KeyError)):
        return summary_line(pd.read_csv(table)) + f" (`{table.name}`)."


def generations_card(
    results: Path, provenance: dict[str, dict[str, Any]], counts: dict[str, int], checksums: list[tuple[str, str]]
) -> str:
    head = " | ".join(CARD_PROVENANCE)
    lines = [
        "# procexec study: generations and scores",
        "",
        "Every generation of the study's models on the procexec suite (one config per model; one row per",
        "attempt: the truncation rerun is attempt 2) with procexec's score columns on the scored attempt",
        "(`scored`). Columns: docs/file-formats.md and docs/interfaces.md of procexec. A null finish reason or",
        "token count is unknown (a harness log that does not keep it), never a guess.",
        "",
        "## Reproduction",
        "",
        _verdict(results),
        "",
        "## Models",
        "",
        f"| config | rows | {head} | engine settings |",
        "|---|---|" + "---|" * (len(CARD_PROVENANCE) + 1),
    ]
    for model, prov in provenance.items():
        cells = " | ".join(str(prov.get(name, "")) for name in CARD_PROVENANCE)
        engine = json.dumps(prov.get("engine", {}), sort_keys=True)
        lines.append(f"| `{model}` | {counts[model]} | {cells} | `{engine}` |")
    lines += ["", "## Files (sha256)", "", "| file | sha256 |", "|---|---|"]
    lines += [f"| `{path}` | `{digest}` |" for path, digest in checksums]
    return "\n".join(lines) + "\n"


def export_generations(
    config: Config, results: str | Path, out: str | Path, inputs: Iterable[Input] = ()
) -> dict[str, int]:
    """Write the folder of every run model's generations and scores under ``results`` to ``out``; rows per model.
    ``out`` may neither be, hold nor lie in what the export reads: the results' generations (records and
    stores), scores and tables, and ``inputs`` (the config files)."""
    results = Path(results)
    if not results.is_dir():
        raise ProcexecError(f"--results {results}: not a folder")
    read = [(f"the results' {name}", results / name) for name in ("generations", "scores", "tables")]
    target = output_folder(out, [*read, *inputs])
    datasets = [spec.id for spec in expand_suite(config.suite)]
    tables = {model: model_rows(results, model, datasets) for model in config.run_models}
    with dataset_folder(target) as folder:
        for model, (rows, _) in tables.items():
            write_table(pa.Table.from_pylist(rows, schema=GENERATIONS_SCHEMA), folder / data_file(model))
        models = list(tables)
        card = generations_card(
            results,
            {m: p for m, (_, p) in tables.items()},
            {m: len(rows) for m, (rows, _) in tables.items()},
            file_checksums(folder, models),
        )
        (folder / "README.md").write_text(readme(models, GENERATIONS_SCHEMA, card), encoding="utf-8")
    return {model: len(rows) for model, (rows, _) in tables.items()}

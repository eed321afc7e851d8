"""procexec export generations: a model's records and score rows, every attempt, back out of the dataset unchanged."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from harness_fixtures import run_session
from procexec.benchmark.executor import execute
from procexec.benchmark.suite import DatasetSpec, generate_dataset
from procexec.cli import main
from procexec.io.jsonl import write_jsonl
from procexec.io.parquet import write_parquet
from procexec.records import GenerationRecord
from procexec.release.folder import data_file
from procexec.release.generations import GENERATIONS_SCHEMA
from procexec.scoring.files import score_file
from procexec.scoring.simulator import simulate

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
DATASETS = ["add_int_1-10_k1", "mixed_float_1-10_k1"]


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    """A results folder laid out as the demo's (config, records of two attempts, scores), from simulated traces."""
    root = tmp_path_factory.mktemp("study")
    overlay = root / "overlay.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {"suite": {"lengths": [5], "examples_per_length": 3, "datasets": DATASETS}, "run_models": [MODEL]}
        )
    )
    results = root / "results"
    records: dict[str, list[GenerationRecord]] = {}
    for dataset in DATASETS:
        examples = generate_dataset(DatasetSpec.from_id(dataset), [5], 3, 20260101)
        write_jsonl(results / "datasets" / f"{dataset}.jsonl", (e.to_json() for e in examples))
        write_jsonl(results / "references" / f"{dataset}.jsonl", (execute(e).to_json() for e in examples))
        first = [
            dataclasses.replace(
                simulate(e, execute(e), failure="truncation" if e.index == 0 else None, target_chars=400),
                model=MODEL,
                provenance={
                    "hf_id": "HuggingFaceTB/SmolLM2-135M-Instruct",
                    "commit": None,
                    "backend": "vllm",
                    "vllm_version": "0.32.0",
                    "stage": "full",
                    "engine": {"dtype": "float32"},
                },
            )
            for e in examples
        ]
        rerun = dataclasses.replace(
            first[0],
            attempt=2,
            text=first[0].text + " 3\n<answer>1</answer>",
            token_offsets=None,
            num_generated_tokens=first[0].num_generated_tokens + 5,
            finish_reason="stop",
            continues_attempt=1,
        )
        records[dataset] = [*first, rerun]
        generations = results / "generations" / MODEL / f"{dataset}.jsonl.gz"
        write_jsonl(generations, (r.to_json() for r in records[dataset]))
        write_parquet(
            score_file(
                generations, results / "references" / f"{dataset}.jsonl", results / "datasets" / f"{dataset}.jsonl"
            ),
            results / "scores" / MODEL / f"{dataset}.parquet",
        )
    return [str(ROOT / "config.yaml"), str(overlay)], results, records


def test_records_and_scores_round_trip(study, tmp_path):
    config, results, records = study
    out = tmp_path / "generations"
    assert main(["export", "generations", "--config", *config, "--results", str(results), "--out", str(out)]) == 0
    table = pq.read_table(out / data_file(MODEL))
    assert table.schema == GENERATIONS_SCHEMA
    rows = table.to_pylist()
    originals = [r for dataset in DATASETS for r in records[dataset]]
    assert [(r["id"], r["attempt"]) for r in rows] == [(r.id, r.attempt) for r in originals]
    fields = {f.name for f in dataclasses.fields(GenerationRecord)}
    for row, record in zip(rows, originals):
        kept = {k: v for k, v in row.items() if k in fields and k not in ("token_ids", "token_offsets")}
        back = GenerationRecord.from_json({**kept, "provenance": json.loads(row["provenance"])})
        assert back == dataclasses.replace(record, token_ids=None, token_offsets=None)
    scores = {
        (s["id"], s["attempt"]): s
        for d in DATASETS
        for s in pq.read_table(results / "scores" / MODEL / f"{d}.parquet").to_pylist()
    }
    for row in rows:
        score = scores.get((row["id"], row["attempt"]))
        assert row["scored"] is (score is not None)
        if score is None:  # attempt 1 of a rerun example: no score columns
            assert row["faa"] is None and row["step_following"] is None and row["attempt"] == 1
        else:
            assert {k: row[k] for k in score} == pytest.approx(score, nan_ok=True)
    card = (out / "README.md").read_text()
    assert "| `smollm2-135m-instruct` | 8 | HuggingFaceTB/SmolLM2-135M-Instruct |" in card
    assert "No reproduction table" in card and "0.32.0" in card

    [loaded] = run_session(tmp_path, [{"kind": "datasets", "folder": str(out)}])
    assert loaded["configs"] == ["all", MODEL] and loaded["all_rows"] == len(rows) and loaded["config_features_equal"]


def test_a_missing_score_file_is_named(study, tmp_path, capsys):
    config, results, _ = study
    scores = results / "scores" / MODEL / f"{DATASETS[1]}.parquet"
    scores.rename(scores.with_suffix(".kept"))
    try:
        assert (
            main(
                [
                    "export",
                    "generations",
                    "--config",
                    *config,
                    "--results",
                    str(results),
                    "--out",
                    str(tmp_path / "out"),
                ]
            )
            == 2
        )
    finally:
        scores.with_suffix(".kept").rename(scores)
    assert f"{scores}: not found" in capsys.readouterr().err and not (tmp_path / "out").exists()


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_out_that_is_holds_or_lies_in_what_the_export_reads_is_refused_before_any_work(study, tmp_path, capsys):
    """Issue 38.1: --out R replaced the whole results folder (datasets, scores, store), --out R/generations the
    records; each is refused in one line, exit 2, nothing touched.  The workflow's R/release/generations is not."""
    config, results, _ = study
    (results / "generations" / MODEL / "store").mkdir(exist_ok=True)
    (results / "generations" / MODEL / "store" / "1-of-1.seg").write_bytes(b"a store's segment")
    before = _tree(results.parent)
    for out, problem in [
        (results, "holds the results' generations"),
        (results / "generations", "is the results' generations"),
        (results / "generations" / MODEL / "store", "lies inside the results' generations"),
        (results / "scores" / MODEL, "lies inside the results' scores"),
        (ROOT, "holds a --config file"),
    ]:
        argv = ["export", "generations", "--config", *config, "--results", str(results), "--out", str(out)]
        assert main(argv) == 2, out
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"procexec export: error: --out {out}: {problem}"), err
        assert _tree(results.parent) == before
    out = results / "release" / "generations"
    argv = ["export", "generations", "--config", *config, "--results", str(results), "--out", str(out)]
    assert main(argv) == 0 and (out / "README.md").is_file()
    assert {k: v for k, v in _tree(results.parent).items() if "release" not in k} == before

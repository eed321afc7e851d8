"""procexec export suite: a Hugging Face dataset folder that `datasets` and lm-eval load, equal to `procexec generate`."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from harness_fixtures import run_session
from procexec.benchmark.executor import execute
from procexec.cli import main
from procexec.io.files import sha256_file
from procexec.io.jsonl import read_jsonl
from procexec.records import Example
from procexec.release import folder as release_folder
from procexec.release.rows import SUITE_COLUMNS, example_of, reference_of

ROOT = Path(__file__).resolve().parent.parent
SMALL_SUITE = {"suite": {"lengths": [5, 95], "examples_per_length": 2}}  # all 55 datasets, 4 examples each


@pytest.fixture(scope="module")
def small_config(tmp_path_factory) -> list[str]:
    overlay = tmp_path_factory.mktemp("config") / "small.yaml"
    overlay.write_text(yaml.safe_dump(SMALL_SUITE))
    return [str(ROOT / "config.yaml"), str(overlay)]


@pytest.fixture(scope="module")
def exported(small_config, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("release") / "suite"
    assert main(["export", "suite", "--config", *small_config, "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def loaded(exported, tmp_path_factory) -> tuple[dict, dict]:
    """In the harness environment: every config through datasets, and one lm-eval task reading the folder."""
    tmp = tmp_path_factory.mktemp("harness-suite")
    rows = pq.read_table(exported / release_folder.data_file("add_int_1-10_k1")).to_pylist()
    jobs = [
        {"kind": "datasets", "folder": str(exported)},
        {
            "kind": "lm_eval",
            "tasks": ["procexec_add_int_1-10_k1"],
            "output_path": str(tmp / "lm-eval"),
            "scripted": {r["id"]: f"<answer>{r['final']}</answer>" for r in rows},
            "metadata": {"dataset_path": str(exported)},
        },
    ]
    datasets_out, lm_eval_out = run_session(tmp, jobs)
    return datasets_out, lm_eval_out


def folder_digests(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): sha256_file(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def test_every_config_loads_with_datasets_and_equals_procexec_generate(loaded, small_config, tmp_path):
    out = loaded[0]
    configs = out["configs"]
    assert configs[0] == "all" and len(configs) == 56 and out["all_rows"] == 55 * 4
    assert out["features"]["trace"] == "List(Value('string'))" and out["features"]["x"] == "Value('string')"
    assert out["config_features_equal"]  # declared once (config all), every parquet carries the same schema
    for dataset, rows in out["rows"].items():
        generated = tmp_path / f"{dataset}.jsonl"
        assert main(["generate", "--config", *small_config, "--dataset", dataset, "--out", str(generated)]) == 0
        examples = [Example.from_json(obj) for _, obj in read_jsonl(generated)]
        assert [row["id"] for row in rows] == [e.id for e in examples]
        for row, example in zip(rows, examples):
            assert list(row) == list(SUITE_COLUMNS)
            assert example_of(row) == example  # field for field, x and y exact
            assert reference_of(row) == execute(example)  # and its reference, as procexec execute writes it
    mul = out["rows"]["mul_int_10-100_k1"][-1]
    assert len(mul["final"]) > 150 and mul["final_float"] > 1e150  # a 95-step product: every digit kept


def test_the_card_and_configs(exported):
    text = (exported / "README.md").read_text()
    header = yaml.safe_load(text.split("---\n")[1])
    names = [c["config_name"] for c in header["configs"]]
    assert names[0] == "all" and header["configs"][0]["default"] is True and len(names) == 56
    assert len(header["configs"][0]["features"]) == len(SUITE_COLUMNS)
    assert header["configs"][1]["data_files"] == [
        {"split": "test", "path": f"data/{names[1]}/test-00000-of-00001.parquet"}
    ]
    for name in names[1:]:
        digest = sha256_file(exported / release_folder.data_file(name))
        assert f"`{digest}`" in text
    assert "| seed | 20260101 |" in text and "| examples | 220 |" in text
    assert "procexec harness lm-eval-path" in text and "inspect eval procexec/procedural" in text


def test_exporting_twice_gives_identical_bytes(exported, small_config, tmp_path):
    again = tmp_path / "elsewhere" / "suite"
    assert main(["export", "suite", "--config", *small_config, "--out", str(again)]) == 0
    assert folder_digests(again) == folder_digests(exported)
    table = pq.read_table(again / release_folder.data_file("add_int_1-10_k1"))
    assert table.schema.metadata is None or b"pandas" not in table.schema.metadata


def test_lm_eval_reads_the_folder_as_its_dataset(loaded):
    result = loaded[1]["results"]["procexec_add_int_1-10_k1"]
    assert result["sample_len"] == 4 and result["faa,none"] == 1.0


def test_push_needs_a_token_from_the_environment_and_is_checked_first(small_config, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    out = tmp_path / "suite"
    assert main(["export", "suite", "--config", *small_config, "--out", str(out), "--push", "me/procexec"]) == 2
    assert "set HF_TOKEN" in capsys.readouterr().err and not out.exists()  # refused before any work


def test_push_uploads_the_folder_in_one_commit_and_writes_no_token(small_config, tmp_path, monkeypatch):
    """The hub is not reachable here: huggingface_hub's client is replaced at its two calls only."""
    import huggingface_hub

    calls = []

    class Info:
        commit_url = "https://hub.example/commit/1"

    monkeypatch.setattr(
        huggingface_hub.HfApi, "create_repo", lambda self, repo, **kw: calls.append(("create", repo, self.token, kw))
    )
    monkeypatch.setattr(
        huggingface_hub.HfApi,
        "upload_folder",
        lambda self, **kw: calls.append(("upload", kw["repo_id"], self.token, kw)) or Info(),
    )
    secret = "hf_test_secret_4711"
    monkeypatch.setenv("HF_TOKEN", secret)
    out = tmp_path / "suite"
    assert main(["export", "suite", "--config", *small_config, "--out", str(out), "--push", "me/procexec"]) == 0
    assert [c[:3] for c in calls] == [("create", "me/procexec", secret), ("upload", "me/procexec", secret)]
    assert calls[1][3]["repo_type"] == "dataset" and Path(calls[1][3]["folder_path"]) == out
    assert not any(secret.encode() in p.read_bytes() for p in out.rglob("*") if p.is_file())


def test_bad_input_is_one_line_and_a_failed_export_keeps_the_previous_folder(
    exported, small_config, tmp_path, monkeypatch, capsys
):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["export", "suite", "--config", *small_config, "--out", str(a_file)]) == 2
    assert "exists and is not a folder" in capsys.readouterr().err
    before = folder_digests(exported)
    calls = []

    def failing(table, path):
        calls.append(path)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return write_table(table, path)

    write_table = release_folder.write_table
    monkeypatch.setattr("procexec.release.suite.write_table", failing)
    assert main(["export", "suite", "--config", *small_config, "--out", str(exported)]) == 2
    assert "No space left on device" in capsys.readouterr().err
    assert folder_digests(exported) == before
    assert [p.name for p in exported.parent.iterdir() if p.name.startswith(".")] == []  # nothing left behind
    assert os.listdir(exported.parent) == ["suite"]


@pytest.mark.workflow
def test_snakemake_release_target(tmp_path):
    """`snakemake release` plans both folders under results/release/ (and `all` does not); the suite's runs."""
    import subprocess
    import sys

    bin_dir = Path(sys.executable).parent
    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {
                "suite": {
                    "lengths": [5],
                    "examples_per_length": 2,
                    "datasets": ["add_int_1-10_k1", "mixed_float_0-1_k3"],
                },
                "run_models": ["smollm2-135m-instruct"],
            }
        )
    )

    def snakemake(*args: str) -> str:
        done = subprocess.run(
            [
                str(bin_dir / "snakemake"),
                "-s",
                str(ROOT / "Snakefile"),
                "--directory",
                str(tmp_path),
                "--nocolor",
                *args,
                "--configfile",
                str(overlay),
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"},
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done.stdout + done.stderr

    planned = snakemake("-n", "release")
    assert "rule release_suite:" in planned and "rule release_generations:" in planned
    assert "rule release_suite:" not in snakemake("-n")
    snakemake("--cores", "1", "results/release/suite")
    suite = tmp_path / "results" / "release" / "suite"
    assert sorted(p.name for p in (suite / "data").iterdir()) == ["add_int_1-10_k1", "mixed_float_0-1_k3"]
    assert "| examples | 4 |" in (suite / "README.md").read_text()

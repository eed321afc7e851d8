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

ROOT = Path(__file__).resolve().parents[2]
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


ONE_DATASET = {"suite": {"lengths": [5], "examples_per_length": 1, "datasets": ["add_int_1-10_k1"]}}


@pytest.fixture
def one_dataset_config(tmp_path) -> list[str]:
    """config.yaml and an overlay of one dataset, copied into a folder of their own (the working folder)."""
    folder = tmp_path / "study"
    folder.mkdir()
    (folder / "config.yaml").write_text((ROOT / "config.yaml").read_text())
    (folder / "one.yaml").write_text(yaml.safe_dump(ONE_DATASET))
    return [str(folder / "config.yaml"), str(folder / "one.yaml")]


def _tree(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (links as where they point) with its digest: what a refused command keeps."""
    return {
        str(p.relative_to(folder)): os.readlink(p) if p.is_symlink() else sha256_file(p)
        for p in sorted(folder.rglob("*"))
        if p.is_file() or p.is_symlink()
    }


def test_an_out_that_is_holds_or_lies_in_an_input_or_holds_the_working_folder_is_refused_first(
    one_dataset_config, tmp_path, monkeypatch, capsys
):
    """Issue 38.1: `--out .` was a ValueError frame; a folder holding the --config files was replaced whole."""
    study = Path(one_dataset_config[0]).parent
    monkeypatch.chdir(study)
    before = _tree(tmp_path)
    for out, problem in [
        (".", "holds a --config file"),
        (str(study), "holds a --config file"),
        (str(tmp_path), "holds a --config file"),
        (one_dataset_config[0], "exists and is not a folder"),
        ("/", "the file system's root"),
    ]:
        assert main(["export", "suite", "--config", *one_dataset_config, "--out", out]) == 2, out
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"procexec export: error: --out {out}: {problem}"), (out, err)
        assert _tree(tmp_path) == before
    work = tmp_path / "work" / "inner"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    assert main(["export", "suite", "--config", *one_dataset_config, "--out", str(work.parent)]) == 2
    assert capsys.readouterr().err.startswith(f"procexec export: error: --out {work.parent}: holds the working folder")
    assert _tree(tmp_path) == before


def _usage_error(argv: list[str]) -> None:
    """``argv`` refused by argparse (exit 2), as the command line would be."""
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2


def test_a_malformed_push_repo_is_refused_before_the_export(one_dataset_config, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_test_token")
    out = tmp_path / "suite"
    for repo in ("a b/c", "org/name/extra", "org/na--me"):
        _usage_error(["export", "suite", "--config", *one_dataset_config, "--out", str(out), "--push", repo])
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "argument --push: " in err[0] and repr(repo) in err[0], err
        assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_an_out_symlink_replaces_the_folder_it_names_and_leaves_nothing_beside_either(one_dataset_config, tmp_path):
    real = tmp_path / "real" / "suite"
    real.mkdir(parents=True)
    (real / "stale.txt").write_text("the previous export")
    link = tmp_path / "suite-link"
    link.symlink_to(real, target_is_directory=True)
    for _ in range(2):
        assert main(["export", "suite", "--config", *one_dataset_config, "--out", str(link)]) == 0
        assert link.is_symlink() and link.resolve() == real and not (real / "stale.txt").exists()
        assert (real / release_folder.data_file("add_int_1-10_k1")).is_file()
        assert sorted(p.name for p in tmp_path.iterdir()) == ["real", "study", "suite-link"]
        assert [p.name for p in real.parent.iterdir()] == ["suite"]


@pytest.mark.parametrize("when", ["building", "swapping"])
def test_sigterm_during_an_export_leaves_one_folder_and_nothing_beside_it(
    one_dataset_config, tmp_path, monkeypatch, capsys, when
):
    """SIGTERM while the folder is built keeps the previous one; in the swap, it waits for the swap to end."""
    import signal

    out = tmp_path / "out" / "suite"
    assert main(["export", "suite", "--config", *one_dataset_config, "--out", str(out)]) == 0
    (out / "previous.txt").write_text("the previous export")
    before = folder_digests(out)
    if when == "building":
        monkeypatch.setattr(
            "procexec.release.suite.write_table", lambda *a: signal.raise_signal(signal.SIGTERM) or 1 / 0
        )
    else:
        remove = release_folder.shutil.rmtree
        monkeypatch.setattr(
            release_folder.shutil, "rmtree", lambda *a, **k: signal.raise_signal(signal.SIGTERM) or remove(*a, **k)
        )
    assert main(["export", "suite", "--config", *one_dataset_config, "--out", str(out)]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.strip().endswith("interrupted")
    if when == "building":
        assert folder_digests(out) == before
    else:  # the new folder, whole
        assert not (out / "previous.txt").exists() and (out / "README.md").is_file()
    assert os.listdir(out.parent) == ["suite"]

"""The core commands end to end: files, field contract, one-line errors with exit code 2."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from procexec.cli import main

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "config.yaml")


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "procexec.cli", *args], capture_output=True, text=True)


def test_generate_and_execute_write_the_documented_fields(tmp_path):
    data, refs = tmp_path / "datasets" / "mixed_int_1-10_k3.jsonl", tmp_path / "references" / "mixed_int_1-10_k3.jsonl"
    assert (
        main(
            [
                "generate",
                "--config",
                CONFIG,
                "--dataset",
                "mixed_int_1-10_k3",
                "--out",
                str(data),
                "--lengths",
                "5,15",
                "--examples-per-length",
                "3",
            ]
        )
        == 0
    )
    examples = [json.loads(line) for line in data.read_text().splitlines()]
    assert len(examples) == 6
    assert {"id", "dataset", "length", "index", "x", "y", "procedure"} <= set(examples[0])
    assert main(["execute", "--in", str(data), "--out", str(refs)]) == 0
    references = [json.loads(line) for line in refs.read_text().splitlines()]
    assert [r["id"] for r in references] == [e["id"] for e in examples]
    first = references[0]
    assert {"id", "final", "final_float", "trace", "edge_cases"} <= set(first)
    assert isinstance(first["final"], str) and len(first["trace"]) == examples[0]["length"] + 2


def test_execute_appendix_a_semantics(tmp_path):
    data, refs = tmp_path / "d.jsonl", tmp_path / "r.jsonl"
    main(
        [
            "generate",
            "--dataset",
            "div_int_1-10_k1",
            "--seed",
            "1",
            "--lengths",
            "5",
            "--examples-per-length",
            "2",
            "--out",
            str(data),
        ]
    )
    assert main(["execute", "--in", str(data), "--out", str(refs), "--semantics", "appendix-a"]) == 0
    assert all(json.loads(line)["semantics"] == "appendix-a" for line in refs.read_text().splitlines())


@pytest.mark.parametrize(
    "args, message",
    [
        (["generate", "--config", CONFIG, "--dataset", "pow_int_1-10_k1", "--out", "x.jsonl"], "unknown dataset id"),
        (["generate", "--config", CONFIG, "--dataset", "add_int_1-10_k9", "--out", "x.jsonl"], "not in the suite"),
        (
            ["generate", "--config", CONFIG, "--dataset", "add_int_1-10_k1", "--lengths", "0", "--out", "x.jsonl"],
            "lengths must be positive",
        ),
        (
            ["generate", "--config", CONFIG, "--dataset", "add_int_1-10_k1", "--lengths", "five", "--out", "x.jsonl"],
            "bad length list",
        ),
        (["execute", "--in", "missing.jsonl", "--out", "y.jsonl"], "missing.jsonl: file not found"),
    ],
)
def test_cli_errors_are_one_clear_line_with_exit_code_2(tmp_path, args, message):
    result = subprocess.run([sys.executable, "-m", "procexec.cli", *args], capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert message in result.stderr
    assert not (tmp_path / "x.jsonl").exists()


def test_malformed_dataset_line_is_named_and_nothing_is_written(tmp_path):
    data, refs = tmp_path / "d.jsonl", tmp_path / "r.jsonl"
    main(
        [
            "generate",
            "--dataset",
            "add_int_1-10_k1",
            "--seed",
            "1",
            "--lengths",
            "5",
            "--examples-per-length",
            "3",
            "--out",
            str(data),
        ]
    )
    lines = data.read_text().splitlines()
    broken = json.loads(lines[1])
    broken["procedure"] = broken["procedure"].replace("Step 2:", "Step 2 :")
    lines[1] = json.dumps(broken)
    data.write_text("\n".join(lines) + "\n")
    result = run_cli("execute", "--in", str(data), "--out", str(refs))
    assert result.returncode == 2
    assert f"{data}:2:" in result.stderr and "procedure line 5" in result.stderr and "Step 2 :" in result.stderr
    assert not refs.exists() and not list(tmp_path.glob(".r.jsonl*"))


def test_card_lists_counts_and_checksums(tmp_path):
    for dataset in ("add_int_1-10_k1", "div_float_0-1_k1"):
        main(
            [
                "generate",
                "--dataset",
                dataset,
                "--seed",
                "4",
                "--lengths",
                "5,15",
                "--examples-per-length",
                "2",
                "--out",
                str(tmp_path / f"{dataset}.jsonl"),
            ]
        )
    card = tmp_path / "CARD.md"
    assert (
        main(
            [
                "card",
                "--datasets-dir",
                str(tmp_path),
                "--seed",
                "4",
                "--lengths",
                "5,15",
                "--examples-per-length",
                "2",
                "--out",
                str(card),
            ]
        )
        == 0
    )
    text = card.read_text()
    import hashlib

    digest = hashlib.sha256((tmp_path / "add_int_1-10_k1.jsonl").read_bytes()).hexdigest()
    assert digest in text
    assert "| `div_float_0-1_k1` | 2 | 2 | 4 |" in text
    assert "| seed | 4 |" in text and "spec version" in text


def test_table4_prints_ours_beside_the_papers(tmp_path, capsys):
    refs = tmp_path / "refs"
    for op in ("add", "mul"):
        data = tmp_path / f"{op}_int_10-100_k1.jsonl"
        main(
            [
                "generate",
                "--dataset",
                f"{op}_int_10-100_k1",
                "--seed",
                "4",
                "--lengths",
                "95",
                "--examples-per-length",
                "20",
                "--out",
                str(data),
            ]
        )
        main(["execute", "--in", str(data), "--out", str(refs / data.name)])
    assert main(["table4", "--references-dir", str(refs), "--out", str(tmp_path / "t4.csv")]) == 0
    out = capsys.readouterr().out
    assert "median_paper" in out and "3.45e+02" in out and "1.43e+190" in out
    assert "mul" in (tmp_path / "t4.csv").read_text()


# ---------------------------------------------------------------- outside a checkout (issue 21)


def test_generate_outside_a_checkout_uses_the_packaged_suite(tmp_path):
    """No --config and no config.yaml in the working directory: the paper's suite as the package ships it."""
    empty = tmp_path / "empty"
    empty.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "procexec.cli", "generate", "--dataset", "mixed_float_1-10_k3", "--out", "d.jsonl"],
        capture_output=True,
        text=True,
        cwd=empty,
    )
    assert result.returncode == 0, result.stderr
    checkout = tmp_path / "checkout.jsonl"
    assert main(["generate", "--config", CONFIG, "--dataset", "mixed_float_1-10_k3", "--out", str(checkout)]) == 0
    assert (empty / "d.jsonl").read_bytes() == checkout.read_bytes()
    card = subprocess.run(
        [sys.executable, "-m", "procexec.cli", "card", "--datasets-dir", ".", "--out", "CARD.md"],
        capture_output=True,
        text=True,
        cwd=empty,
    )
    assert card.returncode == 0, card.stderr
    assert "| seed | 20260101 |" in (empty / "CARD.md").read_text()
    refused = subprocess.run(
        [sys.executable, "-m", "procexec.cli", "generate", "--dataset", "add_int_1-10_k9", "--out", "x.jsonl"],
        capture_output=True,
        text=True,
        cwd=empty,
    )
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1
    assert "not in the suite (procexec/data/suite.yaml, the paper's suite packaged with procexec)" in refused.stderr


def test_config_takes_several_files_merged_as_the_workflow_merges_them(tmp_path, capsys):
    """``--config config.yaml config/demo.yaml``: the demo's suite and models, as ``snakemake --configfile`` sees them."""
    demo = str(ROOT / "config" / "demo.yaml")
    data = tmp_path / "d.jsonl"
    assert main(["generate", "--config", CONFIG, demo, "--dataset", "add_int_1-10_k1", "--out", str(data)]) == 0
    assert len(data.read_text().splitlines()) == 10  # the demo's examples_per_length 1 x the paper's 10 lengths
    (tmp_path / "results").mkdir()
    assert main(["status", "--config", CONFIG, demo, "--results", str(tmp_path / "results"), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(row["model"], row["total"]) for row in rows] == [("smollm2-135m-instruct", 30)]
    assert main(["status", "--config", CONFIG, str(tmp_path / "missing.yaml"), "--results", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "missing.yaml: configuration file not found" in err


def test_scoring_commands_print_their_completion_line_on_stderr(tmp_path, capsys):
    """score and aggregate tell the job's log what they wrote on stderr, as infer and collect do; stdout carries
    only what a command is asked to show."""
    data, refs, gens = tmp_path / "d.jsonl", tmp_path / "r.jsonl", tmp_path / "g.jsonl"
    scores, aggregate = tmp_path / "s.parquet", tmp_path / "aggregate"
    assert (
        main(
            [
                "generate",
                "--dataset",
                "add_int_1-10_k1",
                "--lengths",
                "5",
                "--examples-per-length",
                "4",
                "--out",
                str(data),
            ]
        )
        == 0
    )
    assert main(["execute", "--in", str(data), "--out", str(refs)]) == 0
    assert main(["simulate", "--dataset", str(data), "--references", str(refs), "--out", str(gens)]) == 0
    capsys.readouterr()
    steps = {
        "examples scored": [
            "score",
            "--generations",
            str(gens),
            "--references",
            str(refs),
            "--dataset",
            str(data),
            "--out",
            str(scores),
        ],
        "metric rows from 4 examples": [
            "aggregate",
            "--scores",
            str(scores),
            "--out-dir",
            str(aggregate),
            "--resamples",
            "10",
        ],
    }
    for completion, argv in steps.items():
        assert main(argv) == 0, argv
        printed = capsys.readouterr()
        assert printed.out == "", argv
        assert len(printed.err.splitlines()) == 1 and completion in printed.err, printed.err


def test_the_cli_starts_without_the_stage_libraries():
    """Every workflow job starts the CLI: loading it loads none of pandas, pyarrow, matplotlib, vLLM or torch
    (the handlers import them), so a job pays only for the stage it runs."""
    heavy = ["pandas", "pyarrow", "matplotlib", "vllm", "torch"]
    probe = f"import sys, procexec.cli; print(sorted(m for m in {heavy!r} if m in sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout

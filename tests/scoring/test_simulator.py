"""The trace simulator: deterministic, labelled, realistic enough for scoring tests and benchmarks."""

import pyarrow.parquet as pq
import pytest

from procexec.benchmark.executor import execute
from procexec.benchmark.suite import DatasetSpec, generate_dataset
from procexec.cli import main
from procexec.io.jsonl import read_jsonl, write_jsonl
from procexec.scoring.extract import extract_answers
from procexec.scoring.score import score_example
from procexec.scoring.simulator import FAILURES, MODEL_KEY, simulate, synthetic_token_offsets

EXAMPLES = generate_dataset(DatasetSpec.from_id("mixed_int_10-100_k2"), lengths=(15,), examples_per_length=3, seed=5)
EX = EXAMPLES[0]
REF = execute(EX)


def test_deterministic_per_seed():
    assert simulate(EX, REF, seed=1) == simulate(EX, REF, seed=1)
    texts = {simulate(EX, REF, seed=s, failure="none").text for s in range(5)}
    assert len(texts) > 1


def test_labelled_and_never_presented_as_a_model():
    gen = simulate(EX, REF, seed=2, failure="arithmetic_slip", step=4)
    assert gen.model == MODEL_KEY == "simulator"
    assert gen.provenance["engine"] == "simulator"
    assert gen.provenance["simulated_failure"] == {"class": "arithmetic_slip", "step": 4}
    assert simulate(EX, REF, failure="missing_answer").provenance["simulated_failure"] == {
        "class": "missing_answer",
        "step": None,
    }


def test_realistic_length_and_token_offsets():
    gen = simulate(EX, REF, seed=3, failure="none")
    assert 7000 <= len(gen.text) <= 9000
    assert gen.token_offsets == synthetic_token_offsets(gen.text) and gen.num_generated_tokens == len(gen.token_offsets)
    assert gen.token_offsets[0] == 0 and all(a < b for a, b in zip(gen.token_offsets, gen.token_offsets[1:]))
    assert "Step 1: S3 = S" in gen.text and gen.text.rstrip().endswith("</answer>")


@pytest.mark.parametrize(
    "failure, faa, caa, parseable, steps, finish",
    [
        ("none", True, True, True, 15, "stop"),
        ("arithmetic_slip", None, None, True, 15, "stop"),
        ("wrong_operand", None, None, True, 15, "stop"),
        ("skipped_step", True, True, True, 14, "stop"),
        ("early_stop", None, None, True, 6, "stop"),
        ("missing_answer", False, False, False, 15, "stop"),
        ("repeated_answer", False, True, True, 15, "stop"),
        ("truncation", False, False, False, 7, "length"),
    ],
)
def test_each_failure_shows_in_the_scores(failure, faa, caa, parseable, steps, finish):
    gen = simulate(EX, REF, seed=4, failure=failure, step=7)
    row = score_example(gen, REF, EX)
    assert row["parseable"] is parseable and row["steps_generated"] == steps and gen.finish_reason == finish
    if faa is not None:
        assert row["faa"] is faa and row["caa"] is caa
    if failure == "repeated_answer":
        assert len(extract_answers(gen.text)) == 2


def test_every_failure_class_is_drawn():
    drawn = {
        simulate(ex, execute(ex), seed=s).provenance["simulated_failure"]["class"] for ex in EXAMPLES for s in range(40)
    }
    assert drawn == set(FAILURES)


def test_unknown_failure_is_refused():
    with pytest.raises(ValueError):
        simulate(EX, REF, failure="gremlins")


def test_simulate_command_output_scores(tmp_path, capsys):
    (tmp_path / "datasets").mkdir()
    (tmp_path / "references").mkdir()
    dataset, refs = tmp_path / "datasets" / "d.jsonl", tmp_path / "references" / "d.jsonl"
    write_jsonl(dataset, (e.to_json() for e in EXAMPLES))
    write_jsonl(refs, (execute(e).to_json() for e in EXAMPLES))
    gens = tmp_path / "g.jsonl.gz"
    assert (
        main(
            [
                "simulate",
                "--dataset",
                str(dataset),
                "--references",
                str(refs),
                "--out",
                str(gens),
                "--failure-rate",
                "0",
            ]
        )
        == 0
    )
    assert "SIMULATED" in capsys.readouterr().out
    records = [obj for _, obj in read_jsonl(gens)]
    assert len(records) == 3 and {r["model"] for r in records} == {"simulator"}
    assert (
        main(
            [
                "score",
                "--generations",
                str(gens),
                "--references",
                str(refs),
                "--dataset",
                str(dataset),
                "--out",
                str(tmp_path / "s.parquet"),
            ]
        )
        == 0
    )
    assert all(pq.read_table(tmp_path / "s.parquet").column("faa").to_pylist())

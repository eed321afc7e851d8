"""procexec's lm-eval and inspect tasks on scripted models: the scorer's cases, scored as procexec scores them.

The harnesses are the real packages (in .venv-harness); only the model is scripted.  Cases: a correct
answer, a wrong one, no answer, an answer inside a think block (which inspect's chat path would strip from
output.completion), a generation cut by the token budget, and (inspect) a context-length error.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from harness_fixtures import harness, run_check
from procexec import config
from procexec.benchmark.executor import execute
from procexec.benchmark.suite import DatasetSpec, generate_dataset
from procexec.harness.lm_eval_files import TASK_DIR, task_files
from procexec.harness.samples import HARNESS_METRICS, metric_values
from procexec.io.jsonl import read_jsonl
from procexec.records import GenerationRecord
from procexec.scoring.score import score_example

DATASET = "add_int_1-10_k1"
CASES = ("correct", "wrong", "missing", "think", "truncated", "context_error")


@pytest.fixture(scope="module")
def examples():
    suite = config.default_suite()
    return generate_dataset(DatasetSpec.from_id(DATASET), [5], len(CASES), suite["seed"])


def case_texts(examples) -> dict[str, tuple[str, str, str]]:
    """example id -> (case, raw text, what inspect's chat path would leave as output.completion)."""
    texts = {}
    for case, example in zip(CASES, examples):
        final = execute(example).final
        wrong = str(int(final) + 1)
        raw = {
            "correct": f"Step 1: S3 = {final}\n<answer>{final}</answer>",
            "wrong": f"Step 1: S3 = 1\n<answer>{wrong}</answer>",
            "missing": f"S3 = 5\nThe final result is {final}.",
            "think": f"<think>\nS3 = 1\n<answer>{final}</answer>\n</think>\n\n<answer>{wrong}</answer>",
            "truncated": "Step 1: S3 = 1\nStep 2: S4 =",
            "context_error": "",
        }[case]
        completion = f"<answer>{wrong}</answer>" if case == "think" else raw
        texts[example.id] = (case, raw, completion)
    return texts


def expected_scores(examples, texts, finish_reasons) -> dict[str, dict]:
    """procexec's own score rows of the raw texts (character positions: the point here is the answers)."""
    rows = {}
    for example in examples:
        case, raw, _ = texts[example.id]
        record = GenerationRecord(id=example.id, model="harness", dataset=example.dataset, length=example.length,
                                  index=example.index, attempt=1, text=raw, num_generated_tokens=None,
                                  finish_reason=finish_reasons.get(case))
        rows[case] = score_example(record, execute(example), example)
    return rows


def test_shipped_task_files_are_the_generated_ones():
    shipped = {path.name: path.read_text(encoding="utf-8") for path in TASK_DIR.glob("*.yaml")}
    assert shipped == task_files(), "regenerate with: python -m procexec.harness.lm_eval_files"
    assert len(shipped) == 55 + 2  # a task per dataset, the template, the group


def test_lm_eval_scores_each_case_as_procexec_and_refuses_a_truncating_model_setting(examples, tmp_path):
    texts = {i: t for i, t in case_texts(examples).items() if t[0] != "context_error"}
    spec = {"tasks": [f"procexec_{DATASET}"], "metadata": {"lengths": [5], "examples_per_length": len(texts)},
            "output_path": str(tmp_path / "out"), "scripted": {i: raw for i, (_, raw, _) in texts.items()}}
    out = run_check(tmp_path, "lm_eval_run.py", spec)
    expected = expected_scores(examples[:len(texts)], texts, {})
    [samples_file] = (tmp_path / "out").rglob("samples_*.jsonl")
    logged = {}
    for line in samples_file.read_text().splitlines():
        sample = json.loads(line)
        logged[texts[sample["doc"]["id"]][0]] = sample
    assert set(logged) == set(expected)
    for case, sample in logged.items():
        values = metric_values(expected[case])
        assert {m: sample[m] for m in HARNESS_METRICS} == pytest.approx(values, nan_ok=True), case
        assert sample["arguments"]["gen_args_0"]["arg_1"]["until"] == []  # only EOS stops
        assert sample["arguments"]["gen_args_0"]["arg_1"]["max_gen_toks"] == 32768
    assert [logged[c]["faa"] for c in ("correct", "wrong", "missing", "think", "truncated")] == [1, 0, 0, 1, 0]
    assert logged["missing"]["par"] == 0 and logged["think"]["caa"] == 1 and math.isnan(logged["truncated"]["ap"])
    reported = out["results"][f"procexec_{DATASET}"]
    for metric in HARNESS_METRICS:
        values = [metric_values(row)[metric] for row in expected.values()]
        kept = [v for v in values if not math.isnan(v)]
        assert reported[f"{metric},none"] == pytest.approx(sum(kept) / len(kept)), metric

    # A local-completions model without max_length would lose the prompt: the task refuses to build.
    spec = {**spec, "metadata": {**spec["metadata"], "base_url": "http://127.0.0.1:9/v1/completions"},
            "output_path": str(tmp_path / "refused")}
    (tmp_path / "refused.json").write_text(json.dumps(spec))
    done = harness(tmp_path, "python", "tests/harness_checks/lm_eval_run.py", str(tmp_path / "refused.json"))
    assert done.returncode != 0 and "procexec task: set max_length in --model_args" in done.stderr


def test_inspect_scores_the_raw_text_and_fails_a_context_error(examples, tiny_manifest, tmp_path):
    texts = case_texts(examples)
    stop = {"truncated": "max_tokens", "context_error": "model_length"}
    spec = {"log_dir": str(tmp_path / "logs"),
            "task_args": {"model_dir": str(tiny_manifest.parent / "hf"), "datasets": [DATASET], "lengths": [5],
                          "examples_per_length": len(CASES), "route": "chat"},
            "scripted": {i: {"text": raw, "completion": completion, "stop_reason": stop.get(case, "stop")}
                         for i, (case, raw, completion) in texts.items()}}
    out = run_check(tmp_path, "inspect_run.py", spec)
    assert out["task"] == "procexec/procedural"
    by_case = {texts[i][0]: s for i, s in out["samples"].items()}
    assert "model_length" in by_case["context_error"]["error"] and by_case["context_error"]["value"] is None
    expected = expected_scores(examples, texts, {"truncated": "length"})
    for case in CASES[:-1]:
        sample = by_case[case]
        row = sample["metadata"]["score_row"]
        assert sample["metadata"]["raw_text"] == texts[next(i for i in texts if texts[i][0] == case)][1]
        for column in ("faa", "caa", "parseable", "n_answers", "first_answer_value", "step_following"):
            assert row[column] == expected[case][column], (case, column)
        assert row["truncated"] is (case == "truncated") and row["num_generated_tokens"] > 0
        assert row["answer_position_basis"] in ("tokens", None)
        assert sample["value"] == pytest.approx(metric_values(row), nan_ok=True)
    # the think case: output.completion holds only the wrong answer; the raw text's first answer is right
    assert by_case["think"]["completion"].startswith("<answer>") and by_case["think"]["value"]["faa"] == 1
    faa = out["metrics"]["faa"]
    assert faa["grouped_all"] == pytest.approx(sum(expected[c]["faa"] for c in CASES[:-1]) / 5)
    assert faa[f"grouped_{DATASET}"] == faa["grouped_all"]

    # import-harness: the log becomes generation records; what failed is refused, naming the sample
    log = out["log"]
    done = harness(tmp_path, "procexec", "import-harness", "--inspect", log, "--config", "config.yaml",
                   "--model", "smollm2-135m-instruct", "--out", str(tmp_path / "imported"))
    assert done.returncode == 2 and ":5:5: " in done.stderr and "model_length" in done.stderr


def test_import_harness_turns_lm_eval_samples_into_records_with_unknowns(examples, tmp_path):
    texts = {i: t for i, t in case_texts(examples).items() if t[0] != "context_error"}
    spec = {"tasks": [f"procexec_{DATASET}"], "metadata": {"lengths": [5], "examples_per_length": len(texts)},
            "output_path": str(tmp_path / "out"), "scripted": {i: raw for i, (_, raw, _) in texts.items()}}
    run_check(tmp_path, "lm_eval_run.py", spec)
    [samples_file] = (tmp_path / "out").rglob("samples_*.jsonl")
    done = harness(tmp_path, "procexec", "import-harness", "--lm-eval", str(samples_file), "--config", "config.yaml",
                   "--model", "smollm2-135m-instruct", "--out", str(tmp_path / "imported"))
    assert done.returncode == 0, done.stderr
    records = [GenerationRecord.from_json(obj) for _, obj in read_jsonl(tmp_path / "imported" / f"{DATASET}.jsonl.gz")]
    assert [r.id for r in records] == list(texts)
    for record in records:
        assert record.text == texts[record.id][1] and record.model == "smollm2-135m-instruct"
        assert record.finish_reason is None and record.num_generated_tokens is None  # lm-eval keeps neither
        assert record.provenance["harness"] == "lm-eval"
    expected = expected_scores(examples[:len(texts)], texts, {})
    for record, example in zip(records, examples):
        row = score_example(record, execute(example), example)
        assert row["truncated"] is None and row["num_generated_tokens"] is None
        assert {k: v for k, v in row.items() if k != "model"} == pytest.approx(
            {k: v for k, v in expected[texts[record.id][0]].items() if k != "model"}, nan_ok=True)

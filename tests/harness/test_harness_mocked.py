"""procexec's lm-eval and inspect tasks on scripted models: the scorer's cases, scored as procexec scores them.

The harnesses are the real packages (in .venv-harness, one process for the module); only the model is
scripted.  Cases: a correct answer, a wrong one, no answer, an answer inside a think block (which inspect's
chat path strips from output.completion), a generation cut by the token budget, and (inspect) a
context-length error.  Then ``procexec import-harness`` reads both logs back.
"""

from __future__ import annotations

import json
import math

import pytest

from harness_fixtures import run_session
from procexec.benchmark.executor import execute
from procexec.benchmark.suite import DatasetSpec, default_suite, generate_dataset
from procexec.harness.lm_eval_files import TASK_DIR, task_files
from procexec.harness.lm_eval_task import HarnessSettingError, refuse_traps
from procexec.harness.samples import HARNESS_METRICS, metric_values
from procexec.io.jsonl import read_jsonl
from procexec.records import GenerationRecord
from procexec.scoring.score import score_example

DATASET = "add_int_1-10_k1"
CASES = ("correct", "wrong", "missing", "think", "truncated", "context_error")
LM_EVAL_CASES = CASES[:-1]  # a context error never reaches lm-eval's scorer: its client raises
MODEL = "smollm2-135m-instruct"


@pytest.fixture(scope="module")
def examples():
    return generate_dataset(DatasetSpec.from_id(DATASET), [5], len(CASES), default_suite()["seed"])


@pytest.fixture(scope="module")
def texts(examples) -> dict[str, tuple[str, str, str]]:
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
        texts[example.id] = (case, raw, f"<answer>{wrong}</answer>" if case == "think" else raw)
    return texts


@pytest.fixture(scope="module")
def session(texts, tiny_manifest, tmp_path_factory):
    """lm-eval and inspect on the cases, then import-harness on both logs: one harness process."""
    tmp = tmp_path_factory.mktemp("harness-mocked")
    stop = {"truncated": "max_tokens", "context_error": "model_length"}
    lm_eval_texts = {i: raw for i, (case, raw, _) in texts.items() if case in LM_EVAL_CASES}
    jobs = [
        {
            "kind": "lm_eval",
            "tasks": [f"procexec_{DATASET}"],
            "output_path": str(tmp / "lm-eval"),
            "metadata": {"lengths": [5], "examples_per_length": len(LM_EVAL_CASES)},
            "scripted": lm_eval_texts,
        },
        {
            "kind": "inspect",
            "log_dir": str(tmp / "inspect"),
            "log_format": "eval",  # inspect's default format
            "task_args": {
                "model_dir": str(tiny_manifest.parent / "hf"),
                "datasets": [DATASET],
                "lengths": [5],
                "examples_per_length": len(CASES),
                "route": "chat",
            },
            "scripted": {
                i: {"text": raw, "completion": completion, "stop_reason": stop.get(case, "stop")}
                for i, (case, raw, completion) in texts.items()
            },
        },
        {
            "kind": "procexec",
            "argv": [
                "import-harness",
                "--lm-eval",
                f"glob:{tmp}/lm-eval/*/samples_*.jsonl",
                "--config",
                "config.yaml",
                "--model",
                MODEL,
                "--out",
                str(tmp / "generations" / MODEL),
            ],
        },
        {
            "kind": "procexec",
            "argv": [
                "import-harness",
                "--inspect",
                f"glob:{tmp}/inspect/*.eval",
                "--config",
                "config.yaml",
                "--model",
                MODEL,
                "--out",
                str(tmp / "refused"),
            ],
        },
    ]
    lm_eval, inspect, imported, refused = run_session(tmp, jobs)
    return {"tmp": tmp, "lm_eval": lm_eval, "inspect": inspect, "imported": imported, "refused": refused}


def expected_scores(examples, texts, finish_reasons) -> dict[str, dict]:
    """procexec's own score rows of the raw texts, by case."""
    rows = {}
    for example in examples:
        case, raw, _ = texts[example.id]
        record = GenerationRecord(
            id=example.id,
            model="harness",
            dataset=example.dataset,
            length=example.length,
            index=example.index,
            attempt=1,
            text=raw,
            num_generated_tokens=None,
            finish_reason=finish_reasons.get(case),
        )
        rows[case] = score_example(record, execute(example), example)
    return rows


def test_shipped_task_files_are_the_generated_ones():
    shipped = {path.name: path.read_text(encoding="utf-8") for path in TASK_DIR.glob("*.yaml")}
    assert shipped == task_files(), "regenerate with: python -m procexec.harness.lm_eval_files"
    assert len(shipped) == 55 + 2  # a task per dataset, the template, the group


def test_lm_eval_scores_each_case_as_procexec(session, examples, texts):
    expected = expected_scores(examples[: len(LM_EVAL_CASES)], texts, {})
    [samples_file] = (session["tmp"] / "lm-eval").rglob("samples_*.jsonl")
    logged = {}
    for line in samples_file.read_text().splitlines():
        sample = json.loads(line)
        logged[texts[sample["doc"]["id"]][0]] = sample
    assert set(logged) == set(LM_EVAL_CASES)
    for case, sample in logged.items():
        assert {m: sample[m] for m in HARNESS_METRICS} == pytest.approx(metric_values(expected[case]), nan_ok=True)
        generation = sample["arguments"]["gen_args_0"]["arg_1"]
        assert generation["until"] == [] and generation["max_gen_toks"] == 32768  # only EOS stops; the budget
    assert [logged[c]["faa"] for c in LM_EVAL_CASES] == [1, 0, 0, 1, 0]  # the think block's answer comes first
    assert logged["missing"]["par"] == 0 and math.isnan(logged["truncated"]["ap"])
    reported = session["lm_eval"]["results"][f"procexec_{DATASET}"]
    for metric in HARNESS_METRICS:
        values = [v for v in (metric_values(row)[metric] for row in expected.values()) if not math.isnan(v)]
        assert reported[f"{metric},none"] == pytest.approx(sum(values) / len(values)), metric


def test_lm_eval_task_refuses_model_settings_that_change_the_prompt():
    with pytest.raises(HarnessSettingError, match="set max_length in --model_args"):
        refuse_traps({"base_url": "http://127.0.0.1:8000/v1/completions", "timeout": 86400})
    with pytest.raises(HarnessSettingError, match="set timeout in --model_args"):
        refuse_traps({"base_url": "http://127.0.0.1:8000/v1/completions", "max_length": 40000})
    with pytest.raises(HarnessSettingError, match="add_bos_token=False"):
        refuse_traps({"pretrained": "/models/x"})
    refuse_traps({"pretrained": "/models/x", "add_bos_token": "False"})
    refuse_traps({"base_url": "http://127.0.0.1:8000/v1/completions", "max_length": 40000, "timeout": 86400})


def test_inspect_scores_the_raw_text_and_fails_a_context_error(session, examples, texts):
    out = session["inspect"]
    assert out["task"] == "procexec/procedural"
    by_case = {texts[i][0]: s for i, s in out["samples"].items()}
    assert "model_length" in by_case["context_error"]["error"] and by_case["context_error"]["value"] is None
    expected = expected_scores(examples, texts, {**dict.fromkeys(CASES, "stop"), "truncated": "length"})
    raw = {case: text for case, text, _ in texts.values()}
    for case in LM_EVAL_CASES:
        sample = by_case[case]
        row = sample["metadata"]["score_row"]
        assert sample["metadata"]["raw_text"] == raw[case]
        for column in ("faa", "caa", "parseable", "n_answers", "first_answer_value", "step_following", "truncated"):
            assert row[column] == expected[case][column], (case, column)
        assert row["finish_reason"] == ("length" if case == "truncated" else "stop") and row["num_generated_tokens"] > 0
        assert sample["value"] == pytest.approx(metric_values(row), nan_ok=True)
    # the think case: output.completion holds only the wrong answer; the raw text's first answer is right
    assert by_case["think"]["completion"] == texts[examples[3].id][2] and by_case["think"]["value"]["faa"] == 1
    assert by_case["think"]["metadata"]["score_row"]["answer_position_basis"] == "tokens"
    faa = out["metrics"]["faa"]
    assert faa["grouped_all"] == pytest.approx(sum(expected[c]["faa"] for c in LM_EVAL_CASES) / len(LM_EVAL_CASES))
    assert faa[f"grouped_{DATASET}"] == faa["grouped_all"]


def test_import_harness_reads_lm_eval_samples_with_unknowns_and_refuses_a_failed_sample(session, examples, texts):
    assert session["imported"]["code"] == 0, session["imported"]["stderr"]
    records = [
        GenerationRecord.from_json(obj)
        for _, obj in read_jsonl(session["tmp"] / "generations" / MODEL / f"{DATASET}.jsonl.gz")
    ]
    assert [r.id for r in records] == [e.id for e in examples[: len(LM_EVAL_CASES)]]
    expected = expected_scores(examples[: len(LM_EVAL_CASES)], texts, {})
    for record, example in zip(records, examples):
        assert record.text == texts[record.id][1] and record.model == MODEL
        assert record.finish_reason is None and record.num_generated_tokens is None  # lm-eval keeps neither
        assert record.provenance["harness"] == "lm-eval"
        row = score_example(record, execute(example), example)
        assert row["truncated"] is None and row["num_generated_tokens"] is None
        assert {k: v for k, v in row.items() if k != "model"} == pytest.approx(
            {k: v for k, v in expected[texts[record.id][0]].items() if k != "model"}, nan_ok=True
        )
    refused = session["refused"]
    assert (
        refused["code"] == 2 and f"sample {examples[5].id}" in refused["stderr"] and "model_length" in refused["stderr"]
    )
    assert not (session["tmp"] / "refused").exists()


def test_imported_records_run_through_score_aggregate_figures_tables_and_report(session, tmp_path):
    """A model evaluated elsewhere enters the report: unknown truncation and token counts stay unknown (NaN)."""
    import pandas as pd
    import yaml

    from procexec.cli import main

    overlay = tmp_path / "overlay.yaml"
    overlay.write_text(
        yaml.safe_dump(
            {
                "suite": {"lengths": [5], "examples_per_length": len(LM_EVAL_CASES), "datasets": [DATASET]},
                "run_models": [MODEL],
            }
        )
    )
    config = ["--config", "config.yaml", str(overlay)]
    results = tmp_path / "results"
    assert main(["generate", *config, "--dataset", DATASET, "--out", f"{results}/datasets/{DATASET}.jsonl"]) == 0
    assert (
        main(
            ["execute", "--in", f"{results}/datasets/{DATASET}.jsonl", "--out", f"{results}/references/{DATASET}.jsonl"]
        )
        == 0
    )
    generations = session["tmp"] / "generations" / MODEL  # where the workflow's collect puts a model's records
    steps = [
        [
            "score",
            "--generations",
            f"{generations}/{DATASET}.jsonl.gz",
            "--references",
            f"{results}/references/{DATASET}.jsonl",
            "--dataset",
            f"{results}/datasets/{DATASET}.jsonl",
            "--out",
            f"{results}/scores/{MODEL}/{DATASET}.parquet",
        ],
        ["aggregate", "--scores", f"{results}/scores/{MODEL}/{DATASET}.parquet", "--out-dir", f"{results}/aggregate"],
        [
            "figures",
            *config,
            "--aggregate-dir",
            f"{results}/aggregate",
            "--out-dir",
            f"{results}/figures",
            "--workers",
            "1",
        ],
        [
            "tables",
            *config,
            "--aggregate-dir",
            f"{results}/aggregate",
            "--references-dir",
            f"{results}/references",
            "--out-dir",
            f"{results}/tables",
        ],
        [
            "report",
            *config,
            "--aggregate-dir",
            f"{results}/aggregate",
            "--figures-dir",
            f"{results}/figures",
            "--tables-dir",
            f"{results}/tables",
            "--generations-dir",
            str(generations.parent),
            "--references-dir",
            f"{results}/references",
            "--out",
            f"{results}/report/index.html",
        ],
    ]
    for argv in steps:
        assert main(argv) == 0, argv[0]
    metrics = pd.read_parquet(results / "aggregate" / "metrics.parquet").set_index(["grouping", "metric"])
    assert metrics.loc[("overall", "faa"), "value"] == pytest.approx(2 / len(LM_EVAL_CASES))
    assert math.isnan(metrics.loc[("overall", "truncation_rate"), "value"])  # unknown, not 0
    assert math.isnan(metrics.loc[("overall", "mean_generated_tokens"), "value"])
    assert (results / "report" / "index.html").stat().st_size > 0


def test_the_core_package_never_imports_the_harnesses():
    """Every module but the inspect task (which is inspect's) imports without lm-eval, inspect_ai or datasets."""
    import importlib
    import pkgutil
    import sys

    import procexec

    modules = [
        m.name
        for m in pkgutil.walk_packages(procexec.__path__, "procexec.")
        if m.name != "procexec.harness.inspect_task" and not m.name.endswith("__main__")
    ]
    for name in modules:
        importlib.import_module(name)
    assert not {"lm_eval", "inspect_ai", "datasets"} & set(sys.modules)


def test_import_harness_bad_input_is_one_line_before_any_work(tmp_path, capsys):
    from procexec.cli import main

    not_a_sample = tmp_path / "samples.jsonl"
    not_a_sample.write_text('{"doc_id": 0}\n')
    common = ["--config", "config.yaml", "--model", MODEL, "--out", str(tmp_path / "out")]
    cases = {
        "not an lm-eval sample": ["--lm-eval", str(not_a_sample)],
        f"{tmp_path / 'missing.jsonl'}: file not found": ["--lm-eval", str(tmp_path / "missing.jsonl")],
        "--inspect needs inspect_ai": ["--inspect", str(not_a_sample)],  # this venv has no harness
    }
    for message, logs in cases.items():
        assert main(["import-harness", *logs, *common]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert main(["import-harness", "--lm-eval", str(not_a_sample), *common[:3], "nope", *common[4:]]) == 2
    assert "--model nope: not a model of the config" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_import_harness_names_the_lm_eval_flag_that_changed_the_prompt(session, tiny_manifest, tmp_path, capsys):
    """With --model-dir every logged prompt must re-encode to procexec's: the scripted run used no chat template."""
    from transformers import AutoTokenizer

    from procexec.benchmark.prompts import SYSTEM_PROMPT
    from procexec.cli import main

    model_dir = tiny_manifest.parent / "hf"
    common = [
        "--model-dir",
        str(model_dir),
        "--config",
        "config.yaml",
        "--model",
        MODEL,
        "--out",
        str(tmp_path / "out"),
    ]
    [glued] = (session["tmp"] / "lm-eval").rglob("samples_*.jsonl")
    assert main(["import-harness", "--lm-eval", str(glued), *common]) == 2
    assert "glued together: run lm-eval with --apply_chat_template" in capsys.readouterr().err

    # what --system_instruction does with --apply_chat_template: its text, a blank line, then procexec's system text
    sample = json.loads(glued.read_text().splitlines()[0])
    turns = [
        {"role": "system", "content": f"Be brief.\n\n{SYSTEM_PROMPT}"},
        {"role": "user", "content": sample["doc"]["user"]},
    ]
    sample["arguments"]["gen_args_0"]["arg_0"] = AutoTokenizer.from_pretrained(model_dir).apply_chat_template(
        turns, tokenize=False, add_generation_prompt=True
    )
    instructed = tmp_path / "samples_instructed.jsonl"
    instructed.write_text(json.dumps(sample) + "\n")
    assert main(["import-harness", "--lm-eval", str(instructed), *common]) == 2
    assert "drop --system_instruction" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_import_harness_writes_exactly_the_study_examples_its_dataset_files_hold(tmp_path, capsys):
    """The workflow's import (--datasets-dir/--datasets): every example of the study's files, as the file has it,
    from real lm-eval samples (tests/data/harness); other samples left out; a gap or another suite is one line."""
    from pathlib import Path

    import yaml

    from procexec.cli import main

    logs = sorted(str(p) for p in (Path(__file__).parents[1] / "data" / "harness" / "lm-eval").glob("samples_*.jsonl"))
    datasets = ["add_int_1-10_k1", "mixed_float_0-1_k2"]

    def study(name: str, **suite) -> list[str]:
        overlay = tmp_path / f"{name}.yaml"
        overlay.write_text(yaml.safe_dump({"suite": {"lengths": [5, 15], "examples_per_length": 2, **suite}}))
        for dataset in datasets:
            out = tmp_path / name / f"{dataset}.jsonl"
            assert (
                main(["generate", "--config", "config.yaml", str(overlay), "--dataset", dataset, "--out", str(out)])
                == 0
            )
        return ["--datasets-dir", str(tmp_path / name), "--datasets", *datasets]

    def imported(out: str, *study_files: str) -> int:
        common = ["--config", "config.yaml", "--model", MODEL, "--out", str(tmp_path / out)]
        return main(["import-harness", "--lm-eval", *logs, *common, *study_files])

    assert imported("all") == 0 and imported("tiny", *study("tiny")) == 0
    for dataset in datasets:  # the logs hold the tiny study: the same records
        everything = (tmp_path / "all" / f"{dataset}.jsonl.gz").read_bytes()
        assert (tmp_path / "tiny" / f"{dataset}.jsonl.gz").read_bytes() == everything
    assert imported("first", *study("first", examples_per_length=1)) == 0
    first = [obj["id"] for _, obj in read_jsonl(tmp_path / "first" / "add_int_1-10_k1.jsonl.gz")]
    assert first == ["add_int_1-10_k1:5:0", "add_int_1-10_k1:15:0"]  # the others left out
    capsys.readouterr()
    wider = study("wider", examples_per_length=3)
    assert imported("refused", *wider) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path}/wider/add_int_1-10_k1.jsonl:3: no sample for add_int_1-10_k1:5:2" in err, err
    assert err.count("\n") == 1
    assert imported("refused", *study("reseeded", seed=7)) == 2
    err = capsys.readouterr().err
    assert "the logged example add_int_1-10_k1:5:0 is not" in err and "(another seed or suite version)" in err, err
    assert imported("refused", *wider[2:]) == 2
    assert "--datasets-dir and --datasets: give both" in capsys.readouterr().err
    assert not (tmp_path / "refused").exists()


def _task_rows(dataset: str, length: int, count: int) -> list[dict]:
    from procexec.release.rows import suite_row

    return [suite_row(e) for e in generate_dataset(DatasetSpec.from_id(dataset), [length], count, 20260101)]


def _lm_eval_prompt(folder: str, row: dict) -> tuple[str, int]:
    """A row's prompt as lm-eval's local-completions renders it with --apply_chat_template, and its tokens."""
    from procexec.harness.tokens import hf_tokenizer

    tokenizer = hf_tokenizer(folder)
    turns = [{"role": "system", "content": row["system"]}, {"role": "user", "content": row["user"]}]
    text = tokenizer.apply_chat_template(turns, tokenize=False, add_generation_prompt=True)
    return text, len(tokenizer.encode(text, add_special_tokens=False))


def test_the_task_counts_each_prompt_against_the_room_the_model_args_leave(tiny_manifest):
    """Issue 38.7: with max_length=384 lm-eval sent only the last 255 tokens of a 506-token prompt, scored, exit 0.
    The task counts every prompt as lm-eval renders it (the model's tokenizer, when the arguments name a folder)."""
    from procexec.harness.lm_eval_task import prompt_room, refuse_cut_prompts

    folder = str(tiny_manifest.parent / "hf")
    rows = _task_rows("mul_int_10-100_k1", 95, 2)
    api = {"base_url": "http://127.0.0.1:8000/v1/completions", "tokenizer": folder, "timeout": 60}
    counts = [_lm_eval_prompt(folder, row)[1] for row in rows]
    tokens = max(counts)
    assert min(counts) > 255  # a length-95 procedure: ~1,900 tokens
    assert prompt_room({**api, "max_length": "384"}, 128) == (255, "max_length 384 - 1 - max_gen_toks 128")
    with pytest.raises(HarnessSettingError, match=rf"prompt of {rows[0]['id']} is {counts[0]} tokens, but max_length"):
        refuse_cut_prompts(rows, {**api, "max_length": 384}, 128)
    refuse_cut_prompts(rows, {**api, "max_length": tokens + 128 + 1}, 128)  # the longest fits exactly
    with pytest.raises(HarnessSettingError, match="leaves no prompt token"):
        refuse_cut_prompts(rows, {**api, "max_length": 40000}, 40000)
    with pytest.raises(HarnessSettingError, match="max_length='many' in --model_args is not a whole number"):
        refuse_cut_prompts(rows, {**api, "max_length": "many"}, 128)
    vllm = {"pretrained": folder, "max_model_len": tokens + 127, "add_bos_token": False}
    with pytest.raises(HarnessSettingError, match=rf"max_model_len {tokens + 127} - max_gen_toks 128"):
        refuse_cut_prompts(rows, vllm, 128)
    refuse_cut_prompts(rows, {"pretrained": folder}, 128)  # the engine's own context length: not known here
    # lm-eval reads max_model_len=None as None, vLLM's own length (a TypeError here before; mypy found it)
    assert prompt_room({"pretrained": folder, "max_model_len": None}, 128) is None


def test_the_task_s_refusals_are_one_line_and_exit_2(capsys):
    """lm-eval printed the refusal at the bottom of a 51-line traceback: the task prints one line and exits 2."""
    from procexec.harness.lm_eval_task import rows

    for model_args, words in [
        ({"base_url": "http://127.0.0.1:8000/v1/completions", "timeout": 60}, "set max_length in --model_args"),
        ({"base_url": "http://127.0.0.1:8000/v1/completions", "max_length": 40000}, "set timeout in --model_args"),
    ]:
        with pytest.raises(SystemExit) as stop:
            rows(DATASET, **model_args)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"procexec task: error: {words}"), err


def test_lm_eval_ends_on_the_task_s_one_line_before_any_request(tiny_manifest, tmp_path):
    """The real lm-eval 0.4.13 (simple_evaluate, as `lm-eval run` calls it) on a max_length that would cut the
    length-95 prompts, against no server: the run ends while the task builds its rows, exit 2, no traceback."""
    from harness_fixtures import harness

    script = tmp_path / "run.py"
    script.write_text(
        "from lm_eval import simple_evaluate\n"
        "from lm_eval.tasks import TaskManager\n"
        "from procexec.harness.lm_eval_files import TASK_DIR\n"
        f"args = {{'model': 'tiny', 'base_url': 'http://127.0.0.1:9/v1/completions', 'tokenizer': "
        f"{str(tiny_manifest.parent / 'hf')!r}, 'tokenizer_backend': 'huggingface', 'max_length': 384, 'timeout': 9}}\n"
        "manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False,\n"
        "                      metadata={**args, 'lengths': [95], 'examples_per_length': 1, 'max_gen_toks': 128})\n"
        "simple_evaluate(model='local-completions', model_args=args, tasks=['procexec_mul_int_10-100_k1'],\n"
        "                task_manager=manager, apply_chat_template=True, gen_kwargs={'max_gen_toks': 128})\n"
    )
    done = harness(tmp_path, "python", str(script))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    ours = [line for line in done.stderr.splitlines() if "procexec task" in line]
    assert len(ours) == 1 and ours[0].startswith("procexec task: error: the prompt of mul_int_10-100_k1:95:0 is ")
    assert done.stderr.strip().splitlines()[-1] == ours[0]


def _logged_run(folder, tiny_dir, rows, max_length, max_gen_toks=128, results=True):
    """An lm-eval run's files as 0.4.13 writes them: samples_<task>_<date>.jsonl and results_<date>.json."""
    folder.mkdir(parents=True)
    date = "2026-08-22T10-11-12.123456"
    lines = []
    for doc_id, row in enumerate(rows):
        request = {
            "arg_0": _lm_eval_prompt(tiny_dir, row)[0],
            "arg_1": {"until": [], "max_gen_toks": max_gen_toks, "do_sample": False},
        }
        sample = {"doc_id": doc_id, "doc": row, "arguments": {"gen_args_0": request}, "resps": [["<answer>1</answer>"]]}
        lines.append(json.dumps(sample) + "\n")
    samples = folder / f"samples_procexec_{rows[0]['dataset']}_{date}.jsonl"
    samples.write_text("".join(lines))
    if results:
        args = f"model=tiny,base_url=http://127.0.0.1:8000/v1/completions,max_length={max_length},timeout=60"
        (folder / f"results_{date}.json").write_text(
            json.dumps({"config": {"model": "local-completions", "model_args": args}})
        )
    return samples


def test_import_harness_refuses_a_log_whose_prompt_the_run_cut(tiny_manifest, tmp_path, capsys):
    """The log keeps the whole prompt even where lm-eval sent its last tokens only: with --model-dir the prompt's
    tokens are held to the run's max_length (its results file) and the request's max_gen_toks."""
    from procexec.cli import main

    tiny_dir = str(tiny_manifest.parent / "hf")
    rows = _task_rows(DATASET, 15, 2)
    tokens = max(_lm_eval_prompt(tiny_dir, row)[1] for row in rows)
    common = ["--model-dir", tiny_dir, "--config", "config.yaml", "--model", MODEL]
    cut = _logged_run(tmp_path / "cut", tiny_dir, rows, max_length=384)
    assert main(["import-harness", "--lm-eval", str(cut), *common, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert f"{cut}:1: the prompt is " in err and "max_length 384 - 1 - max_gen_toks 128 left 255" in err, err
    bare = _logged_run(tmp_path / "bare", tiny_dir, rows, max_length=40000, results=False)
    assert main(["import-harness", "--lm-eval", str(bare), *common, "--out", str(tmp_path / "out")]) == 2
    assert f"{bare}: no results_<date>.json of its run beside it" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
    whole = _logged_run(tmp_path / "whole", tiny_dir, rows, max_length=tokens + 128 + 1)
    assert main(["import-harness", "--lm-eval", str(whole), *common, "--out", str(tmp_path / "out")]) == 0
    assert main(["import-harness", "--lm-eval", str(bare), *common[2:], "--out", str(tmp_path / "unchecked")]) == 0

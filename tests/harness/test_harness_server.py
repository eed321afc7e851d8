"""Both harnesses against vLLM's real OpenAI server on the CPU with SmolLM2, next to procexec's own run.

One server for the module; procexec's endpoint backend, lm-eval ``local-completions`` with
--apply_chat_template, and inspect on the completions and the chat route ask it for the same examples of two
datasets (greedy, a small budget).  Per example: the prompt ids equal ``procexec show-prompt``'s, the raw
text equals procexec's record, every score equals procexec's score row, the reported means equal the rows'
means; and the logs read back by ``procexec import-harness`` score as procexec's own run.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from endpoint_fixtures import VLLMServer
from harness_fixtures import run_session
from procexec.cli import main
from procexec.harness.samples import HARNESS_METRICS, metric_values
from procexec.io.jsonl import read_jsonl
from procexec.records import GenerationRecord

pytestmark = [pytest.mark.vllm, pytest.mark.smollm2]

ROOT = Path(__file__).resolve().parents[2]
MODEL = "smollm2-135m-instruct"
DATASETS = ["add_int_1-10_k1", "mixed_float_0-1_k3"]
BUDGET = 48  # new tokens: enough text to compare, little CPU time
#: What lm-eval's log does not know (no finish reason, no token ids or count): null, or measured in characters.
LM_EVAL_UNKNOWN = {
    "truncated",
    "finish_reason",
    "num_generated_tokens",
    "answer_position",
    "answer_position_basis",
    "looping",
    "loop_period",
}


def procexec(*argv: str) -> None:
    assert main(list(argv)) == 0, argv


@pytest.fixture(scope="module")
def study(smollm2_manifest, tmp_path_factory):
    """procexec's own run and both harnesses' runs on one server, and the harness logs imported."""
    tmp = tmp_path_factory.mktemp("harness-server")
    model_dir = smollm2_manifest.parent / "hf"
    server = VLLMServer(model_dir, tmp / "server.log", served_name="smollm2", max_model_len=2048).start()
    try:
        overlay = tmp / "overlay.yaml"
        overlay.write_text(
            yaml.safe_dump(
                {
                    "suite": {"lengths": [5], "examples_per_length": 2, "datasets": DATASETS},
                    "inference": {"max_new_tokens": BUDGET, "truncation_rerun": "off"},
                    "run_models": [MODEL],
                    "models": {
                        MODEL: {
                            "backend": "openai",
                            "base_url": server.base_url,
                            "served_model": "smollm2",
                            "source": "path",
                            "path": str(model_dir),
                            "max_new_tokens": BUDGET,
                            "max_model_len": 2048,
                            "max_context": 2048,
                            "max_concurrency": 4,
                            "request_timeout_s": 300,
                            "max_retries": 1,
                        }
                    },
                }
            )
        )
        config = [str(ROOT / "config.yaml"), str(overlay)]
        for dataset in DATASETS:
            procexec("generate", "--config", *config, "--dataset", dataset, "--out", f"{tmp}/datasets/{dataset}.jsonl")
            procexec("execute", "--in", f"{tmp}/datasets/{dataset}.jsonl", "--out", f"{tmp}/references/{dataset}.jsonl")
        procexec(
            "infer",
            "--config",
            *config,
            "--model",
            MODEL,
            "--datasets-dir",
            f"{tmp}/datasets",
            "--datasets",
            *DATASETS,
            "--store",
            f"{tmp}/store",
            "--out",
            f"{tmp}/shard.jsonl.gz",
            "--no-progress",
        )
        procexec(
            "collect",
            "--model",
            MODEL,
            "--shards",
            f"{tmp}/shard.jsonl.gz",
            "--datasets-dir",
            f"{tmp}/datasets",
            "--datasets",
            *DATASETS,
            "--out-dir",
            f"{tmp}/procexec",
        )
        task_args = {
            "model_dir": str(model_dir),
            "datasets": DATASETS,
            "lengths": [5],
            "examples_per_length": 2,
            "max_tokens": BUDGET,
        }
        imports = [
            ("lm-eval", ["--lm-eval", f"glob:{tmp}/lm-eval/*/samples_*.jsonl", "--model-dir", str(model_dir)]),
            ("inspect-completions", ["--inspect", f"glob:{tmp}/inspect-completions/*.json"]),
            ("inspect-chat", ["--inspect", f"glob:{tmp}/inspect-chat/*.json"]),
        ]
        outputs = run_session(
            tmp,
            [
                {
                    "kind": "lm_eval",
                    "tasks": [f"procexec_{d}" for d in DATASETS],
                    "output_path": f"{tmp}/lm-eval",
                    # the budget --gen_kwargs lowers, told to the task too (it counts each prompt against it)
                    "metadata": {"lengths": [5], "examples_per_length": 2, "max_gen_toks": BUDGET},
                    "gen_kwargs": f"max_gen_toks={BUDGET}",
                    "model_args": {
                        "model": "smollm2",
                        "base_url": f"{server.base_url}/completions",
                        "tokenizer": str(model_dir),
                        "tokenizer_backend": "huggingface",
                        "max_length": 2048,
                        "timeout": 300,
                        "num_concurrent": 4,
                    },
                },
                {
                    "kind": "inspect",
                    "model": "vllm-completions/smollm2",
                    "base_url": server.base_url,
                    "log_dir": f"{tmp}/inspect-completions",
                    "task_args": {**task_args, "route": "completions"},
                },
                {
                    "kind": "inspect",
                    "model": "vllm/smollm2",
                    "base_url": server.base_url,
                    "log_dir": f"{tmp}/inspect-chat",
                    "task_args": {**task_args, "route": "chat"},
                },
                *(
                    {
                        "kind": "procexec",
                        "argv": [
                            "import-harness",
                            *logs,
                            "--config",
                            *config,
                            "--model",
                            MODEL,
                            "--out",
                            f"{tmp}/imported/{name}",
                        ],
                    }
                    for name, logs in imports
                ),
            ],
        )
    finally:
        server.stop()
    lm_eval, inspect_completions, inspect_chat, *imported = outputs
    for result in imported:
        assert result["code"] == 0, result["stderr"]
    for name, _ in [("procexec", None), *imports]:
        for dataset in DATASETS:
            generations = f"{tmp}/{'imported/' if name != 'procexec' else ''}{name}/{dataset}.jsonl.gz"
            procexec(
                "score",
                "--generations",
                generations,
                "--references",
                f"{tmp}/references/{dataset}.jsonl",
                "--dataset",
                f"{tmp}/datasets/{dataset}.jsonl",
                "--out",
                f"{tmp}/scores/{name}/{dataset}.parquet",
            )
    return {
        "tmp": tmp,
        "config": config,
        "model_dir": model_dir,
        "lm_eval": lm_eval,
        "inspect": {"completions": inspect_completions, "chat": inspect_chat},
    }


def records(study, name: str = "procexec") -> dict[str, GenerationRecord]:
    folder = study["tmp"] / name if name == "procexec" else study["tmp"] / "imported" / name
    return {
        r.id: r
        for d in DATASETS
        for r in (GenerationRecord.from_json(o) for _, o in read_jsonl(folder / f"{d}.jsonl.gz"))
    }


def score_rows(study, name: str = "procexec") -> dict[str, dict]:
    return {
        row["id"]: row
        for d in DATASETS
        for row in pq.read_table(study["tmp"] / "scores" / name / f"{d}.parquet").to_pylist()
    }


def lm_eval_samples(study) -> dict[str, dict]:
    return {
        sample["doc"]["id"]: sample
        for path in (study["tmp"] / "lm-eval").rglob("samples_*.jsonl")
        for sample in map(json.loads, path.read_text().splitlines())
    }


def ids_sha256(ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode("ascii")).hexdigest()


def without(row: dict, columns: set[str]) -> dict:
    return {k: v for k, v in row.items() if k not in columns}


def test_prompts_are_procexec_show_prompts(study, capsys):
    from transformers import AutoTokenizer

    ours = records(study)
    assert len(ours) == 4 and all(r.provenance["prompt_route"] == "completions" for r in ours.values())
    tokenizer = AutoTokenizer.from_pretrained(study["model_dir"])
    lm_eval = lm_eval_samples(study)
    inspect = study["inspect"]["completions"]["samples"]
    for example_id, record in ours.items():
        capsys.readouterr()
        procexec("show-prompt", "--config", *study["config"], "--model", MODEL, "--example", example_id, "--json")
        shown = json.loads(capsys.readouterr().out)
        assert record.prompt_sha256 == shown["sha256"] and record.prompt_tokens == shown["prompt_tokens"]
        assert inspect[example_id]["prompt_token_ids"] == shown["token_ids"]  # what vllm-completions sent
        sent = tokenizer.encode(lm_eval[example_id]["arguments"]["gen_args_0"]["arg_0"], add_special_tokens=False)
        assert ids_sha256(sent) == shown["sha256"]  # lm-eval's prompt, encoded as local-completions encodes it


def test_raw_texts_equal_procexecs_records(study):
    ours = records(study)
    lm_eval = lm_eval_samples(study)
    for example_id, record in ours.items():
        assert lm_eval[example_id]["resps"][0][0] == record.text
        for route in ("completions", "chat"):
            sample = study["inspect"][route]["samples"][example_id]
            assert sample["error"] is None and sample["metadata"]["raw_text"] == record.text, route
            assert sample["metadata"]["num_generated_tokens"] == record.num_generated_tokens
            assert sample["metadata"]["finish_reason"] == record.finish_reason


def test_harness_scores_and_means_equal_procexecs_rows(study):
    rows = score_rows(study)
    lm_eval = lm_eval_samples(study)
    for example_id, row in rows.items():
        values = metric_values(row)
        logged = lm_eval[example_id]
        for metric in HARNESS_METRICS:
            if metric == "ap":  # lm-eval has no tokens: AP in characters, over the same answers
                assert math.isnan(logged["ap"]) == math.isnan(values["ap"])
            else:
                assert logged[metric] == values[metric], (example_id, metric)
        for route in ("completions", "chat"):
            sample = study["inspect"][route]["samples"][example_id]
            assert without(sample["metadata"]["score_row"], {"model"}) == pytest.approx(
                without(row, {"model"}), nan_ok=True
            ), route
            assert sample["value"] == pytest.approx(values, nan_ok=True)
    for dataset in DATASETS:
        mine = [metric_values(r) for r in rows.values() if r["dataset"] == dataset]
        reported = study["lm_eval"]["results"][f"procexec_{dataset}"]
        for metric in HARNESS_METRICS:
            kept = [m[metric] for m in mine if not math.isnan(m[metric])]
            mean = sum(kept) / len(kept) if kept else math.nan
            if metric != "ap":
                assert reported[f"{metric},none"] == pytest.approx(mean), (dataset, metric)
            for route in ("completions", "chat"):
                grouped = study["inspect"][route]["metrics"][metric]
                assert grouped.get(f"grouped_{dataset}", math.nan) == pytest.approx(mean, nan_ok=True)


def test_imported_logs_score_as_procexecs_own_run(study):
    ours = score_rows(study)
    for name in ("inspect-completions", "inspect-chat"):
        theirs = score_rows(study, name)
        assert set(theirs) == set(ours)
        for example_id, row in ours.items():
            assert theirs[example_id] == pytest.approx(row, nan_ok=True), (name, example_id)
    theirs = score_rows(study, "lm-eval")
    for example_id, row in ours.items():
        assert without(theirs[example_id], LM_EVAL_UNKNOWN) == pytest.approx(without(row, LM_EVAL_UNKNOWN), nan_ok=True)
        assert theirs[example_id]["truncated"] is None and theirs[example_id]["num_generated_tokens"] is None
    ours = records(study)
    for name in ("lm-eval", "inspect-completions"):  # the ids sent: show-prompt's
        assert {i: (r.prompt_sha256, r.prompt_tokens) for i, r in records(study, name).items()} == {
            i: (r.prompt_sha256, r.prompt_tokens) for i, r in ours.items()
        }, name
    for example_id, record in records(study, "inspect-chat").items():
        # the server rendered the turns: keyed as procexec's chat route keys them, counted by the server
        assert record.prompt_sha256 != ours[example_id].prompt_sha256
        assert record.prompt_tokens == ours[example_id].prompt_tokens
        assert record.provenance["route"] == "chat"

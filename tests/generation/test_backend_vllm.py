"""Acceptance tests on the real vLLM CPU engine with the tiny Llama built at test time."""

from __future__ import annotations

import copy
import os
import signal
import subprocess
import sys
import time

import pytest
import yaml

from config_changes import changed_config
from procexec.config import prepare
from procexec.generation.backends import create_backend
from procexec.generation.engine_stats import read_stats, stats_path
from procexec.generation.job import Job, load_examples, run_job
from procexec.generation.job_settings import JobSettings
from procexec.io.jsonl import read_jsonl
from procexec.records import GenerationRecord
from store_view import stored_keys, stored_records

pytestmark = pytest.mark.vllm


def _run(config, tiny_datasets, store, out, manifest, model="tiny"):
    directory, ids = tiny_datasets
    return run_job(
        JobSettings.from_config(config, model), directory, ids, 1, 1, store, out, manifest, progress_interval=None
    )


def _job(config, examples, store, writer, manifest, model="tiny"):
    settings = JobSettings.from_config(config, model)
    return Job(settings, examples, store, writer, create_backend(settings, manifest), progress_interval=None)


def _texts(records):
    return {(r.id, r.attempt): (r.text, r.token_ids) for r in records}


def test_records_complete_greedy_stable_and_resumable(tiny_config, tiny_datasets, tiny_manifest, tmp_path, monkeypatch):
    first = _run(tiny_config, tiny_datasets, tmp_path / "s1", tmp_path / "a.jsonl.gz", tiny_manifest)
    examples = load_examples(*tiny_datasets)
    assert first.generated == len(examples)
    # Records are complete and valid, one per example, as written to the shard file.
    records = [GenerationRecord.from_json(obj) for _, obj in read_jsonl(tmp_path / "a.jsonl.gz")]
    assert sorted(r.id for r in records) == sorted(e.id for e in examples)
    for r in records:
        assert r.attempt == 1 and r.model == "tiny" and r.finish_reason in ("stop", "length")
        assert len(r.token_ids) == len(r.token_offsets) == r.num_generated_tokens <= 24
        assert r.token_offsets == sorted(r.token_offsets) and r.token_offsets[-1] <= len(r.text)
        assert len(r.prompt_sha256) == 64 and r.prompt_tokens > 0 and not r.system_folded
        p = r.provenance
        assert p["model_key"] == "tiny" and p["hf_id"] == "procexec/tiny-llama" and p["revision"] == "seed-0"
        assert p["engine"]["dtype"] == "float32" and p["engine"]["enforce_eager"] is True
        assert p["sampling"] == {"temperature": 0.0, "top_p": 1.0, "seed": 0, "max_tokens": 24}
        assert p["vllm_version"] and p["wall_time_s"] >= 0 and len(p["cache_key"]) == 64
        assert p["token_offsets_match_text"] is True

    # A second, independent run (fresh store) produces the same greedy text and ids.
    second = _run(tiny_config, tiny_datasets, tmp_path / "s2", tmp_path / "b.jsonl.gz", tiny_manifest)
    assert _texts(second.records) == _texts(first.records)

    # Nothing changed: nothing generated, the engine is not even started.
    from procexec.generation.backends.vllm import VLLMBackend

    with monkeypatch.context() as patch:
        patch.setattr(VLLMBackend, "_engine", lambda self: pytest.fail("engine started with everything stored"))
        again = _run(tiny_config, tiny_datasets, tmp_path / "s1", tmp_path / "c.jsonl.gz", tiny_manifest)
    assert again.generated == 0
    assert [r.to_json() for r in again.records] == [r.to_json() for r in first.records]

    # Changing the token limit regenerates everything for that model.
    changed = changed_config(tiny_config, models={"tiny": {"max_new_tokens": 12}})
    fewer = _run(changed, tiny_datasets, tmp_path / "s1", tmp_path / "d.jsonl.gz", tiny_manifest)
    assert fewer.generated == len(examples)
    assert all(r.num_generated_tokens <= 12 for r in fewer.records)


def test_changing_one_model_invalidates_only_that_model(tiny_config, tiny_datasets, tiny_manifest, tmp_path):
    store = tmp_path / "store"
    _run(tiny_config, tiny_datasets, store, tmp_path / "a.jsonl.gz", tiny_manifest)
    changed = changed_config(
        tiny_config,
        models={
            "tiny-nosys": {"engine_kwargs": {"max_num_seqs": 4}},  # another model's settings
            "tiny": {"shards": 3},  # not an output-affecting setting
        },
    )
    assert _run(changed, tiny_datasets, store, tmp_path / "b.jsonl.gz", tiny_manifest).generated == 0
    changed = changed_config(changed, models={"tiny": {"engine_kwargs": {"max_num_seqs": 4}}})
    job = _job(changed, load_examples(*tiny_datasets), store, "1-of-1", tiny_manifest)
    assert not any(p.key in job.store for p in job.plan_first())


def test_template_without_system_role_folds_and_records_it(tiny_config, tiny_datasets, tmp_path):
    result = _run(tiny_config, tiny_datasets, tmp_path / "s", tmp_path / "a.jsonl.gz", None, model="tiny-nosys")
    assert result.records and all(r.system_folded for r in result.records)
    # config system_role: false folds without trying the template
    config = changed_config(tiny_config, models={"tiny-nosys": {"system_role": False}})
    folded = _run(config, tiny_datasets, tmp_path / "s", tmp_path / "b.jsonl.gz", None, model="tiny-nosys")
    assert folded.generated == 0 and all(r.system_folded for r in folded.records)


def test_truncation_rule_reruns_only_truncated_incorrect(tiny_config, tiny_datasets, tiny_manifest, tmp_path):
    from procexec.benchmark.executor import execute

    config = changed_config(tiny_config, inference={"truncation_rerun": "regenerate"})
    directory, ids = tiny_datasets
    examples = load_examples(directory, ids)
    store = tmp_path / "store"
    # Seed the store with a correct-but-truncated attempt 1 for the first example.
    job = _job(config, examples, store, "seed", tiny_manifest)
    item = job.plan_first()[0]
    ex = item.example
    job.store.put(
        item.key,
        GenerationRecord(
            id=ex.id,
            model="tiny",
            dataset=ex.dataset,
            length=ex.length,
            index=ex.index,
            attempt=1,
            text=f"<answer>{execute(ex).final}</answer>",
            num_generated_tokens=24,
            finish_reason="length",
        ).to_json(),
    )
    job.store.close()

    result = run_job(
        JobSettings.from_config(config, "tiny"),
        directory,
        ids,
        1,
        1,
        store,
        tmp_path / "out.jsonl.gz",
        tiny_manifest,
        progress_interval=None,
    )
    by_attempt = {(r.id, r.attempt): r for r in result.records}
    assert (ex.id, 2) not in by_attempt  # correct answer: no rerun
    for other in examples[1:]:
        first, second = by_attempt[(other.id, 1)], by_attempt[(other.id, 2)]
        assert first.finish_reason == "length"
        budget = 768 - second.prompt_tokens
        assert second.provenance["sampling"]["max_tokens"] == budget > 24
        assert second.num_generated_tokens > first.num_generated_tokens
        assert second.text.startswith(first.text)  # greedy: attempt 2 extends attempt 1


def test_kill_9_mid_job_then_rerun_keeps_persisted_records(tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path):
    raw = copy.deepcopy(tiny_raw_config)
    raw["inference"].update(max_new_tokens=120, store_commit_records=2)
    raw["models"]["tiny"]["engine_kwargs"] = {"max_num_seqs": 1}  # one at a time: completions are staggered
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    directory, ids = tiny_datasets
    store = tmp_path / "store"
    argv = [
        sys.executable,
        "-m",
        "procexec.cli",
        "infer",
        "--config",
        str(config_path),
        "--model",
        "tiny",
        "--datasets-dir",
        str(directory),
        "--datasets",
        *ids,
        "--store",
        str(store),
        "--out",
        str(tmp_path / "shard.jsonl.gz"),
        "--manifest",
        str(tiny_manifest),
        "--no-progress",
    ]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=os.environ.copy())
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if len(stored_keys(store) if store.exists() else []) >= 2:
            break
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the job finished before it could be killed"
    assert not (tmp_path / "shard.jsonl.gz").exists()
    before = stored_records(store)
    examples = load_examples(directory, ids)
    assert 2 <= len(before) < len(examples)

    config = prepare(copy.deepcopy(raw))
    result = run_job(
        JobSettings.from_config(config, "tiny"),
        directory,
        ids,
        1,
        1,
        store,
        tmp_path / "shard.jsonl.gz",
        tiny_manifest,
        progress_interval=None,
    )
    assert result.generated == len(examples) - len(before)
    assert sorted(r.id for r in result.records) == sorted(e.id for e in examples)
    keys = stored_keys(store)
    assert len(keys) == len(set(keys)) == len(examples)  # each generation stored exactly once
    for record in result.records:
        key = record.provenance["cache_key"]
        if key in before:
            assert record.to_json() == before[key]  # pre-kill records unchanged


def test_continue_gives_regenerates_tokens_token_for_token_with_fewer_decoded(
    tiny_config, tiny_datasets, tiny_manifest, tmp_path
):
    """Greedy on the CPU engine: attempt 2 continued from attempt 1's ids == attempt 2 decoded from scratch."""
    results = {}
    for mode in ("continue", "regenerate"):
        config = changed_config(tiny_config, inference={"truncation_rerun": mode, "max_new_tokens": 16})
        results[mode] = _run(
            config, tiny_datasets, tmp_path / f"s-{mode}", tmp_path / f"{mode}.jsonl.gz", tiny_manifest
        )
    cont, regen = results["continue"].records, results["regenerate"].records
    seconds = [(c, g) for c, g in zip(cont, regen) if c.attempt == 2]
    assert seconds and [(r.id, r.attempt) for r in cont] == [(r.id, r.attempt) for r in regen]
    for c, g in seconds:
        assert c.token_ids == g.token_ids and c.text == g.text and c.finish_reason == g.finish_reason
        assert c.token_offsets == g.token_offsets and c.continues_attempt == 1
    decoded = {mode: r.decoded_tokens for mode, r in results.items()}
    print(f"decoded tokens: continue {decoded['continue']}, regenerate {decoded['regenerate']}")
    assert decoded["continue"] == decoded["regenerate"] - 16 * len(seconds)


#: Provenance that differs between two runs of the same generations: timings, and what the prefix cache served.
RUN_FACTS = ("wall_time_s", "created_utc", "engine_load_s", "num_cached_tokens")


def test_no_barrier_between_attempts_same_records_and_continuations_served_from_the_prefix_cache(
    tiny_config, tiny_datasets, tiny_manifest, tmp_path
):
    """Attempt 2 queued as its attempt 1 finishes gives the records the barrier gave (ids, text, keys,
    provenance), and each continuation's prompt and attempt-1 ids come from the prefix cache."""
    config = changed_config(tiny_config, inference={"truncation_rerun": "continue", "max_new_tokens": 16})
    examples = load_examples(*tiny_datasets)
    runs, cached = {}, {}
    for barrier in (True, False):
        settings = JobSettings.from_config(config, "tiny")
        backend = create_backend(settings, tiny_manifest)
        backend.start()
        block = backend._llm.llm_engine.vllm_config.cache_config.block_size  # 128 on the CPU (engine notes)
        job = Job(settings, examples, tmp_path / f"s-{barrier}", "1-of-1", backend, None, attempt_barrier=barrier)
        runs[barrier] = job.run().records
        cached[barrier] = sum(r.provenance["num_cached_tokens"] for r in runs[barrier] if r.attempt == 2)
        stats = read_stats(stats_path(tmp_path / f"s-{barrier}", "1-of-1"))  # the shard's, for procexec status
        assert stats.cached_prefill_tokens == cached[barrier]
        assert stats.continuation_prefill_tokens == sum(
            r.prompt_tokens + r.provenance["continued_tokens"] for r in runs[barrier] if r.attempt == 2
        )
    without, barrier = runs[False], runs[True]
    seconds = [r for r in without if r.attempt == 2]
    assert len(seconds) >= 4  # the tiny Llama loops: most attempts 1 end truncated

    def same(record):
        obj = record.to_json()
        return {**obj, "provenance": {k: v for k, v in obj["provenance"].items() if k not in RUN_FACTS}}

    assert [same(r) for r in without] == [same(r) for r in barrier]
    print(f"cached prefill tokens of {len(seconds)} continuations: {cached[False]} (with the barrier {cached[True]})")
    for record in seconds:  # every whole block of the prefix but the one holding its last token, which is computed
        prefix = record.prompt_tokens + record.provenance["continued_tokens"]
        assert record.provenance["num_cached_tokens"] == (prefix - 1) // block * block, record.id


def test_the_in_process_engine_records_its_preemptions_start_and_kv_pool(
    tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path, capfd
):
    """As a job server's: eight ~630-token prompts into a pool of 11 blocks of 128 tokens
    (``num_gpu_blocks_override``) preempt; the shard's statistics get the engine's counter (its statistics on,
    ``LLM.get_metrics``), the seconds it took to build and its pool, and the job's log states the pool."""
    from procexec.generation.engine_stats import model_stats

    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["tiny"]["engine_kwargs"] = {"num_gpu_blocks_override": 11}
    _run(prepare(raw), tiny_datasets, tmp_path / "store", tmp_path / "out.jsonl.gz", tiny_manifest)
    stats = model_stats(tmp_path / "store", warn=pytest.fail)
    assert stats.preemptions > 0 and stats.kv_capacity_tokens == 11 * 128
    assert stats.starts == 1 and stats.startup_s > 0 and stats.load_s == stats.warmup_s == 0  # no log read in-process
    assert "KV cache of one engine: 1,408 tokens = 1.83 sequences of max_model_len 768" in capfd.readouterr().err

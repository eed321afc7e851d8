"""The generation job (plans, keys, store, budgets, truncation policy) against a small in-test backend."""

from __future__ import annotations

import pytest

from config_changes import changed_config
from fake_backend import ScriptedBackend
from procexec.errors import ProcexecError
from procexec.generation.job import load_examples, run_job
from procexec.generation.job_settings import JobSettings


def _config(tiny_config, **inference):
    return changed_config(tiny_config, inference=inference)


def _run(config, tiny_datasets, tmp_path, backend, store="store", out="out.jsonl.gz"):
    directory, ids = tiny_datasets
    return run_job(
        JobSettings.from_config(config, "tiny"),
        directory,
        ids,
        1,
        1,
        tmp_path / store,
        tmp_path / out,
        None,
        progress_interval=None,
        backend_factory=lambda *a: backend,
    )


def test_resume_generates_only_what_is_missing_and_keys_follow_the_engine(tiny_config, tiny_datasets, tmp_path):
    config = _config(tiny_config, max_new_tokens=400)  # every script fits: no truncation
    backend = ScriptedBackend()
    first = _run(config, tiny_datasets, tmp_path, backend)
    examples = load_examples(*tiny_datasets)
    assert first.generated == len(examples) == len(first.records)
    again = _run(config, tiny_datasets, tmp_path, ScriptedBackend(), out="again.jsonl.gz")
    assert again.generated == 0 and [r.to_json() for r in again.records] == [r.to_json() for r in first.records]
    other_engine = _run(config, tiny_datasets, tmp_path, ScriptedBackend(version=2), out="v2.jsonl.gz")
    assert other_engine.generated == len(examples)  # another engine identity never reuses generations
    for record in first.records:
        assert record.provenance["template_date"] == "2026-01-01" and record.provenance["backend"] == "scripted"
        assert record.provenance["sampling"]["max_tokens"] == 400
        assert "max_tokens_requested" not in record.provenance["sampling"]


def test_attempt_1_budget_is_clamped_to_the_engine_context_and_recorded(tiny_config, tiny_datasets, tmp_path):
    examples = load_examples(*tiny_datasets)
    backend = ScriptedBackend(context=2000)
    prompt_tokens = max(
        len(backend.render(lambda s, e=e: [{"role": "user", "content": e.procedure}]).token_ids) for e in examples
    )
    assert prompt_tokens < 2000
    config = _config(tiny_config, max_new_tokens=5000)
    result = _run(config, tiny_datasets, tmp_path, backend)
    for record in result.records:
        sampling = record.provenance["sampling"]
        assert sampling["max_tokens"] == 2000 - record.prompt_tokens < 5000
        assert sampling["max_tokens_requested"] == 5000
    for request in backend.requests:  # never more than the engine can hold
        assert len(request.prompt.token_ids) + request.max_tokens == 2000


def test_a_prompt_longer_than_the_engine_context_fails_before_any_generation(tiny_config, tiny_datasets, tmp_path):
    backend = ScriptedBackend(context=100)
    with pytest.raises(
        ProcexecError, match=r"add_int_1-10_k1:5:0: the prompt has \d+ tokens, models.tiny.max_model_len"
    ):
        _run(tiny_config, tiny_datasets, tmp_path, backend)
    assert backend.requests == []


@pytest.fixture
def truncating(tiny_config):
    """Attempt 1 gets 24 tokens of a 40-99-token script; the context (768 - prompt) holds the whole script."""

    def make(mode):
        config = _config(tiny_config, truncation_rerun=mode, max_new_tokens=24)
        return changed_config(config, models={"tiny": {"max_context": 100_000, "max_model_len": 100_000}})

    return make


def test_continue_gives_the_records_regenerate_gives_with_fewer_decoded_tokens(truncating, tiny_datasets, tmp_path):
    results, backends = {}, {}
    for mode in ("continue", "regenerate"):
        backends[mode] = ScriptedBackend()
        results[mode] = _run(
            truncating(mode), tiny_datasets, tmp_path, backends[mode], store=f"s-{mode}", out=f"{mode}.jsonl.gz"
        )
    cont, regen = results["continue"].records, results["regenerate"].records
    assert [(r.id, r.attempt) for r in cont] == [(r.id, r.attempt) for r in regen]
    seconds = [r for r in cont if r.attempt == 2]
    assert seconds, "no attempt 2: the test does not exercise the rerun"
    for c, g in zip(cont, regen):
        assert (c.text, c.token_ids, c.token_offsets, c.num_generated_tokens, c.finish_reason) == (
            g.text,
            g.token_ids,
            g.token_offsets,
            g.num_generated_tokens,
            g.finish_reason,
        )
        if c.attempt == 2:
            assert c.continues_attempt == 1 and g.continues_attempt is None
            assert c.provenance["continued_tokens"] == 24
            assert c.token_offsets == list(range(len(c.text)))  # offsets re-based onto the joined text
    assert results["continue"].decoded_tokens == backends["continue"].decoded
    assert backends["continue"].decoded == backends["regenerate"].decoded - 24 * len(seconds)
    # A continuation request carries attempt 1's ids after the prompt and asks only for the rest.
    for request in backends["continue"].requests:
        if request.prefix_ids:
            assert len(request.prefix_ids) == 24 and request.max_tokens == 100_000 - len(request.prompt.token_ids) - 24


def _job(config, tiny_datasets, store, backend, attempt_barrier=False):
    from procexec.generation.job import Job

    settings = JobSettings.from_config(config, "tiny")
    return Job(settings, load_examples(*tiny_datasets), store, "1-of-1", backend, None, attempt_barrier=attempt_barrier)


def test_an_attempt_2_is_sent_as_its_attempt_1_finishes_and_the_records_are_the_barriers(
    truncating, tiny_datasets, tmp_path
):
    """No barrier between attempts: each continuation goes out right after its attempt 1, before the attempts 1
    still waiting; the records (and the store) are those of attempt 2 after all of attempt 1."""
    order, records = {}, {}
    for barrier in (True, False):
        backend = ScriptedBackend()
        records[barrier] = _job(truncating("continue"), tiny_datasets, tmp_path / f"s{barrier}", backend, barrier).run()
        order[barrier] = [(r.tag.example.id, r.tag.attempt) for r in backend.requests]
    seconds = [first for first, attempt in order[False] if attempt == 2]
    assert len(seconds) >= 4
    assert order[True] == sorted(order[True], key=lambda sent: sent[1])  # the barrier: every attempt 1 first
    for example in seconds:  # no barrier: each attempt 2 right after its own attempt 1
        assert order[False][order[False].index((example, 1)) + 1] == (example, 2)
    assert [r.to_json() | {"provenance": None} for r in records[False].records] == [
        r.to_json() | {"provenance": None} for r in records[True].records
    ]
    assert [r.provenance["cache_key"] for r in records[False].records] == [
        r.provenance["cache_key"] for r in records[True].records
    ]


def test_a_store_with_attempt_1_done_sends_the_missing_attempts_2_with_the_rest(truncating, tiny_datasets, tmp_path):
    """A shard stopped after attempt 1 (attempts 2 missing) resumes with its attempts 2 in the first submission."""
    config = truncating("continue")
    whole = _job(config, tiny_datasets, tmp_path / "whole", ScriptedBackend()).run()
    off = changed_config(config, inference={"truncation_rerun": "off"})
    _job(off, tiny_datasets, tmp_path / "resumed", ScriptedBackend()).run()  # attempt 1 only
    backend = ScriptedBackend()
    generate = backend.generate
    submissions = []
    backend.generate = lambda requests, *rest: submissions.append(len(requests)) or generate(requests, *rest)
    resumed = _job(config, tiny_datasets, tmp_path / "resumed", backend).run()
    seconds = [r for r in resumed.records if r.attempt == 2]
    assert submissions == [len(seconds)] and resumed.generated == len(seconds) >= 4
    assert [r.to_json() | {"provenance": None} for r in resumed.records] == [
        r.to_json() | {"provenance": None} for r in whole.records
    ]


def test_the_progress_phase_counts_each_attempt_2_as_it_is_queued(truncating, tiny_datasets, tmp_path, capsys):
    """One phase, attempts 1-2: it starts with the attempts 1 and ends with every generation of the shard done."""
    from procexec.generation.job import Job

    settings = JobSettings.from_config(truncating("continue"), "tiny")
    examples = load_examples(*tiny_datasets)
    job = Job(settings, examples, tmp_path / "store", "1-of-1", ScriptedBackend(), progress_interval=0)
    records = job.run().records
    lines = [line for line in capsys.readouterr().err.splitlines() if "attempts 1-2:" in line]
    total = len(records)
    assert total > len(examples)
    assert f"attempts 1-2: 0/{len(examples)} done" in lines[0]
    assert f"attempts 1-2: {total}/{total} done (100.0%)" in lines[-1] and len(lines) == 2


def test_off_never_reruns_and_a_correct_truncated_answer_is_not_rerun(truncating, tiny_datasets, tmp_path):
    from procexec.benchmark.executor import execute
    from procexec.benchmark.prompts import chat_messages

    off = _run(truncating("off"), tiny_datasets, tmp_path, ScriptedBackend(), store="off", out="off.jsonl.gz")
    assert {r.attempt for r in off.records} == {1}

    examples = load_examples(*tiny_datasets)
    finals = {}
    probe = ScriptedBackend()
    for example in examples:
        finals[probe.render(lambda s, e=example: chat_messages(e, s)).sha256] = execute(example).final
    for answer_first, reruns in ((True, set()), (False, {e.id for e in examples})):
        config = changed_config(
            truncating("continue"), inference={"max_new_tokens": 60}
        )  # room for the tagged answer when it comes first
        backend = ScriptedBackend(
            script_tokens=lambda digest: 300, answer=lambda p: finals[p.sha256], answer_first=answer_first
        )
        result = _run(config, tiny_datasets, tmp_path, backend, store=f"s{answer_first}", out=f"{answer_first}.gz")
        assert all(r.finish_reason == "length" for r in result.records if r.attempt == 1)
        assert {r.id for r in result.records if r.attempt == 2} == reruns


def test_the_job_asks_the_truncation_check_it_is_handed(truncating, tiny_datasets, tmp_path):
    """Which truncated attempts 1 get a rerun is the handed check's answer (scoring's, versioned), asked
    once per truncated generation with its text and example."""
    from procexec.generation.job import Job

    asked = []

    def answered(text, example):
        asked.append(example.id)
        return example.index == 0  # "answered" for index 0 only

    examples = load_examples(*tiny_datasets)
    backend = ScriptedBackend(script_tokens=lambda digest: 300)
    job = Job(
        JobSettings.from_config(truncating("continue"), "tiny"),
        examples,
        tmp_path / "store",
        "1-of-1",
        backend,
        None,
        answered=answered,
    )
    plans = job.run().plans
    assert sorted(asked) == sorted(e.id for e in examples)
    assert {p.example.id for p in plans if p.attempt == 2} == {e.id for e in examples if e.index != 0}


def test_an_interrupt_keeps_every_finished_generation(tiny_config, tiny_datasets, tmp_path):
    config = _config(tiny_config, max_new_tokens=400)
    examples = load_examples(*tiny_datasets)
    with pytest.raises(KeyboardInterrupt):
        _run(config, tiny_datasets, tmp_path, ScriptedBackend(fail_after=3))
    assert not (tmp_path / "out.jsonl.gz").exists()
    resumed_backend = ScriptedBackend()
    resumed = _run(config, tiny_datasets, tmp_path, resumed_backend)
    assert resumed.generated == len(examples) - 3 and len(resumed_backend.requests) == len(examples) - 3


def test_job_refuses_a_backend_without_continuation_by_falling_back_to_regenerate(truncating, tiny_datasets, tmp_path):
    backend = ScriptedBackend()
    backend.supports_continuation = False
    result = _run(truncating("continue"), tiny_datasets, tmp_path, backend)
    assert all(not r.prefix_ids for r in backend.requests)
    assert all(r.continues_attempt is None for r in result.records)
    assert any(r.attempt == 2 for r in result.records)


def test_a_record_is_checked_once_on_its_way_to_the_shard_file(tiny_config, tiny_datasets, tmp_path, monkeypatch):
    """Checked as it is made (no round trip through JSON), never again by this job: the shard file is
    written from the store. A later run checks each stored record once, as today's reader."""
    from procexec.io.jsonl import read_jsonl
    from procexec.records import GenerationRecord

    checked = []
    check = GenerationRecord.check
    monkeypatch.setattr(
        GenerationRecord, "check", classmethod(lambda cls, values: checked.append(values["id"]) or check(values))
    )
    config = _config(tiny_config, max_new_tokens=400)  # every script fits: attempt 1 only
    first = _run(config, tiny_datasets, tmp_path, ScriptedBackend())
    examples = load_examples(*tiny_datasets)
    assert first.generated == len(examples) and sorted(checked) == sorted(e.id for e in examples)
    checked.clear()
    again = _run(config, tiny_datasets, tmp_path, ScriptedBackend(), out="again.jsonl.gz")
    assert again.generated == 0 and sorted(checked) == sorted(e.id for e in examples)
    shard = [obj for _, obj in read_jsonl(tmp_path / "out.jsonl.gz")]
    assert shard == [obj for _, obj in read_jsonl(tmp_path / "again.jsonl.gz")]
    assert [GenerationRecord.from_json(obj) for obj in shard] == first.records


def test_a_shard_submits_its_longest_procedures_first_and_writes_its_file_in_shard_order(truncating, tmp_path):
    """Issue 37: the longest procedures go out first (they truncate most and rerun longest), a resumed
    shard's attempts 2 first of their length; the shard file, the store keys and the records are the shortest-first
    order's (only the engine's queue changes)."""
    from procexec.benchmark.suite import DatasetSpec, generate_dataset
    from procexec.generation.job import Job
    from procexec.generation.planning import shard_slice
    from procexec.io.jsonl import write_jsonl

    ids = ["add_int_1-10_k1", "mixed_int_1-10_k1"]
    for dataset in ids:
        examples = generate_dataset(DatasetSpec.from_id(dataset), lengths=(5, 15, 25), examples_per_length=2, seed=1)
        write_jsonl(tmp_path / f"{dataset}.jsonl", (e.to_json() for e in examples))
    settings = JobSettings.from_config(truncating("continue"), "tiny")
    examples = shard_slice(load_examples(tmp_path, ids), 1, 1)
    runs = {}
    for shortest_first in (False, True):
        backend = ScriptedBackend()
        job = Job(
            settings,
            examples,
            tmp_path / f"store-{shortest_first}",
            "1-of-1",
            backend,
            None,
            shortest_first=shortest_first,
        )
        result = job.run()
        runs[shortest_first] = (backend, result, list(job.shard_lines(result.plans)))
    longest, shortest = runs[False][0], runs[True][0]
    firsts = [r.tag.example.length for r in longest.requests if r.tag.attempt == 1]
    assert firsts == sorted(firsts, reverse=True) and firsts[0] == 25
    assert [r.tag.example.length for r in shortest.requests if r.tag.attempt == 1] == sorted(firsts)
    # the same plans, keys and records; the file in the shard's (length, dataset, index) order either way
    assert [p.key for p in runs[False][1].plans] == [p.key for p in runs[True][1].plans]
    strip = ("wall_time_s", "created_utc")
    lines = {
        k: [{**obj, "provenance": {n: v for n, v in obj["provenance"].items() if n not in strip}} for obj in run[2]]
        for k, run in runs.items()
    }
    assert lines[False] == lines[True]
    assert [(o["length"], o["dataset"], o["index"]) for o in lines[False] if o["attempt"] == 1] == sorted(
        (e.length, e.dataset, e.index) for e in examples
    )

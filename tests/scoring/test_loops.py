"""Repetition loops at a generation's tail: planted loops are found with their period, non-loops are not; a
generation is judged once, when its record is made, and everything that counts loops reads that verdict."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import json
import random

import pyarrow.parquet as pq
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from fake_backend import ScriptedBackend
from procexec.benchmark.executor import execute
from procexec.benchmark.suite import DatasetSpec, generate_example
from procexec.cli import main
from procexec.config import prepare
from procexec.generation.collect import collect
from procexec.generation.job import load_examples, run_job
from procexec.generation.job_settings import JobSettings
from procexec.io.jsonl import write_jsonl
from procexec.io.parquet import write_parquet
from procexec.records import GenerationRecord, Loop
from procexec.scoring import loops
from procexec.scoring.files import score_file
from procexec.scoring.loops import CHAR_THRESHOLDS, TOKEN_THRESHOLDS, LoopThresholds, detect_loop, find_loop
from procexec.scoring.score import score_example

TOKENS = TOKEN_THRESHOLDS


def make_example(dataset: str, length: int, index: int, seed: int = 0):
    return generate_example(DatasetSpec.from_id(dataset), length, index, seed)


def _prefix(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(1000, 50000) for _ in range(n)]


def _block(rng: random.Random, period: int) -> list[int]:
    """A block whose smallest period is ``period`` (distinct ids)."""
    return rng.sample(range(100, 999), period)


@settings(max_examples=60, deadline=None)
@given(period=st.integers(1, 512), seed=st.integers(0, 2**32), prefix=st.integers(0, 300), cut=st.integers(0, 511))
def test_planted_loop_is_found_with_its_period(period, seed, prefix, cut):
    rng = random.Random(seed)
    block = _block(rng, period)
    repeats = max(TOKENS.min_count, -(-TOKENS.min_span // period)) + 1
    loop = block * repeats + block[: cut % period]  # cut mid-block, as max_new_tokens does
    found = detect_loop(_prefix(rng, prefix) + loop, "")
    assert found is not None and found.period == period and found.basis == "tokens"
    assert found.span >= len(loop)


@settings(max_examples=60, deadline=None)
@given(period=st.integers(1, 512), seed=st.integers(0, 2**32))
def test_too_few_repetitions_are_not_a_loop(period, seed):
    rng = random.Random(seed)
    block = _block(rng, period)
    short = max(TOKENS.min_count * period, TOKENS.min_span) - 1  # one element short
    tail = (block * (short // period + 1))[-short:]
    assert detect_loop(_prefix(rng, 400) + tail, "") is None


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), n=st.integers(0, 5000))
def test_random_text_is_not_a_loop(seed, n):
    rng = random.Random(seed)
    assert detect_loop(_prefix(rng, n), "") is None


def test_loop_that_stopped_is_not_at_the_tail():
    rng = random.Random(1)
    block = _block(rng, 7)
    assert detect_loop(block * 100 + _prefix(rng, 20), "") is None
    assert detect_loop(block * 100, "").period == 7


def test_boundaries_exactly():
    t = LoopThresholds(min_period=2, max_period=10, min_count=3, min_span=12)
    assert find_loop([0, 1] * 6, t, "tokens").period == 2  # 12 elements, 6 periods
    assert find_loop([0, 1] * 5 + [0], t, "tokens") is None  # 11 < min_span
    assert find_loop([5] * 50, t, "tokens").period == 2  # period 1 is below min_period
    assert find_loop(list(range(10)) * 3, t, "tokens").period == 10
    assert find_loop(list(range(11)) * 5, t, "tokens") is None  # period above max_period


def test_characters_when_there_are_no_token_ids():
    text = "Step 1: S3 = 2 + 3 = 5\n" + "Wait, let me recompute S4. " * 60
    found = detect_loop(None, text)
    assert found is not None and found.basis == "chars" and found.period == len("Wait, let me recompute S4. ")
    assert detect_loop([], text).basis == "chars"
    assert detect_loop(None, "Step 1: S3 = 2 + 3 = 5\n" * 3 + "x" * 100) is None
    assert len("Wait, let me recompute S4. ") * 60 >= CHAR_THRESHOLDS.min_span


def test_a_long_faithful_trace_is_not_a_loop():
    ex = make_example("mul_int_1-10_k1", 95, 0, seed=0)
    ref = execute(ex)
    lines = [f"Step {k}: S{k + 2} = {v}" for k, v in enumerate(ref.trace[2:], start=1)]
    assert detect_loop(None, "\n".join(lines) + f"\n<answer>{ref.final}</answer>") is None


def _gen(ex, text, ids, finish="length", attempt=1):
    return GenerationRecord(
        id=ex.id, model="m", dataset=ex.dataset, length=ex.length, index=ex.index, attempt=attempt, text=text,
        num_generated_tokens=len(ids) if ids else max(1, len(text) // 4), finish_reason=finish, token_ids=ids,
    )  # fmt: skip


def test_score_rows_carry_the_flag(tmp_path):
    ex = make_example("add_int_1-10_k1", 5, 0, seed=0)
    ref = execute(ex)
    rng = random.Random(3)
    looping_ids = _prefix(rng, 50) + _block(rng, 13) * 40
    row = score_example(_gen(ex, "blah " * 10, looping_ids), ref, ex)
    assert row["looping"] is True and row["loop_period"] == 13
    row = score_example(_gen(ex, "<answer>1</answer>", _prefix(rng, 600), finish="stop"), ref, ex)
    assert row["looping"] is False and row["loop_period"] is None
    # a rerun vLLM's repetition guard stopped is looping, even when its loop is shorter than our thresholds
    row = score_example(_gen(ex, "abab", [1, 2] * 4, finish="repetition", attempt=2), ref, ex)
    assert row["looping"] is True and row["loop_period"] is None and row["truncated"] is False
    # through the file path: the parquet keeps the flag and the period (null when not looping)
    ex2 = make_example("add_int_1-10_k1", 5, 1, seed=0)
    write_jsonl(tmp_path / "d.jsonl", [ex.to_json(), ex2.to_json()])
    write_jsonl(tmp_path / "r.jsonl", [ref.to_json(), execute(ex2).to_json()])
    write_jsonl(
        tmp_path / "g.jsonl",
        [
            _gen(ex, "x", _prefix(rng, 10) + [7, 8, 9] * 100).to_json(),
            _gen(ex2, "ab" * 1000, None).to_json(),
        ],
    )
    write_parquet(score_file(tmp_path / "g.jsonl", tmp_path / "r.jsonl", tmp_path / "d.jsonl"), tmp_path / "s.parquet")
    rows = pq.read_table(tmp_path / "s.parquet").to_pylist()
    assert [(r["looping"], r["loop_period"]) for r in rows] == [(True, 3), (True, 2)]


def test_a_score_row_reads_the_verdict_its_record_carries_and_judges_a_record_without_one():
    """The row's loop columns are the record's own verdict (``provenance.loop``), not judged again; a record
    without one (made before records carried it, or outside a job) is judged as it is read."""
    ex = make_example("add_int_1-10_k1", 5, 0, seed=0)
    ref = execute(ex)
    rng = random.Random(5)
    plain, looping = _prefix(rng, 600), _prefix(rng, 50) + _block(rng, 13) * 40
    carried = dataclasses.replace(
        _gen(ex, "x", plain), provenance={"loop": {"period": 7, "span": 300, "basis": "tokens"}}
    )
    row = score_example(carried, ref, ex)
    assert (row["looping"], row["loop_period"]) == (True, 7)  # its tokens do not loop: the carried verdict counts
    row = score_example(dataclasses.replace(_gen(ex, "x", looping), provenance={"loop": None}), ref, ex)
    assert (row["looping"], row["loop_period"]) == (False, None)
    row = score_example(_gen(ex, "x", looping), ref, ex)  # no provenance.loop: judged now
    assert (row["looping"], row["loop_period"]) == (True, 13)


class _SometimesLooping(ScriptedBackend):
    """Some prompts' outputs end in a loop ('ab' repeated: 400 tokens of period 2), the rest are the plain
    script; records are made off the engine loop, on the store's writer thread, as the vLLM backend's are."""

    finish_off_loop = True

    def script(self, prompt):
        return "ab" * 200 if sum(prompt.token_ids) % 2 else super().script(prompt)


def _generate(tiny_raw_config, tiny_datasets, tmp_path) -> str:
    """One shard of the tiny model into ``results/``'s store; returns its last progress line."""
    directory, ids = tiny_datasets
    raw = copy.deepcopy(tiny_raw_config)
    raw["inference"]["max_new_tokens"] = 400  # every output whole: attempt 1 only
    config = prepare(raw)
    with contextlib.redirect_stderr(io.StringIO()) as log:
        run_job(
            JobSettings.from_config(config, "tiny"),
            directory,
            ids,
            1,
            1,
            tmp_path / "results" / "generations" / "tiny" / "store",
            tmp_path / "shard.jsonl.gz",
            None,
            progress_interval=3600,
            backend_factory=lambda *a: _SometimesLooping(),
        )
    return log.getvalue().strip().splitlines()[-1]


def _status_and_scores(tiny_raw_config, tiny_datasets, tmp_path, capsys) -> tuple[dict[str, int], list[dict]]:
    """What ``procexec status`` says of the loops per attempt, and the score rows of the collected shard."""
    directory, ids = tiny_datasets
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tiny_raw_config))
    capsys.readouterr()
    assert main(["status", "--config", str(config), "--results", str(tmp_path / "results"), "--json"]) == 0
    (status,) = json.loads(capsys.readouterr().out)
    collect("tiny", [tmp_path / "shard.jsonl.gz"], directory, ids, tmp_path / "collected")
    rows = []
    for dataset in ids:
        references = tmp_path / f"{dataset}.references.jsonl"
        write_jsonl(references, (execute(e).to_json() for e in load_examples(directory, [dataset])))
        rows += score_file(
            tmp_path / "collected" / f"{dataset}.jsonl.gz", references, directory / f"{dataset}.jsonl"
        ).to_pylist()
    return status["looping"], rows


def test_each_generation_is_judged_once_and_its_progress_line_status_and_score_row_agree(
    tiny_raw_config, tiny_datasets, tmp_path, monkeypatch, capsys
):
    judged = []
    find = loops.find_loop
    monkeypatch.setattr(loops, "find_loop", lambda *args: judged.append(args[2]) or find(*args))
    last_line = _generate(tiny_raw_config, tiny_datasets, tmp_path)
    status, rows = _status_and_scores(tiny_raw_config, tiny_datasets, tmp_path, capsys)
    assert len(judged) == len(rows) == len(load_examples(*tiny_datasets))  # once each: made, never again
    looping = sum(row["looping"] for row in rows)
    assert 0 < looping < len(rows), "the script should make some outputs loop and others not"
    assert all(row["loop_period"] == 2 for row in rows if row["looping"])
    assert status == {"1": looping, "2": 0}
    assert f"{len(rows)}/{len(rows)} done" in last_line and f" {looping} looping" in last_line, last_line


def test_status_and_scores_keep_agreeing_after_the_loop_test_changes(
    tiny_raw_config, tiny_datasets, tmp_path, monkeypatch, capsys
):
    """Generations judged by one loop test, read after it changed: status and the score rows both say
    what the records carry."""
    with monkeypatch.context() as earlier:  # a loops.py that called every generation a loop of period 1
        earlier.setattr(loops, "find_loop", lambda seq, thresholds, basis: Loop(1, len(seq), basis))
        _generate(tiny_raw_config, tiny_datasets, tmp_path)
    status, rows = _status_and_scores(tiny_raw_config, tiny_datasets, tmp_path, capsys)
    assert [(row["looping"], row["loop_period"]) for row in rows] == [(True, 1)] * len(rows)
    assert status == {"1": len(rows), "2": 0}

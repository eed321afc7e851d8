"""The optional rerun guard: vLLM's repetition detection on attempt 2 only, keyed, recorded, finish reason stored."""

from __future__ import annotations

import copy
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from config_changes import changed_config
from fake_backend import ScriptedBackend
from procexec.benchmark.executor import execute
from procexec.benchmark.suite import DatasetSpec, generate_example
from procexec.config import prepare
from procexec.config.guard import CANDIDATE_GUARD, evaluated_guard
from procexec.config.keys import output_settings
from procexec.config.model import RepetitionGuard, plain
from procexec.errors import ProcexecError
from procexec.generation.backend import Completion
from procexec.generation.job import run_job
from procexec.generation.job_settings import JobSettings
from procexec.generation.store import FINISH_CODES, entries_of
from procexec.io.jsonl import read_jsonl
from procexec.records import Example, GenerationRecord
from procexec.scoring.guard import guard_effect, guard_stop

GUARD = {"max_pattern_size": 8, "min_pattern_size": 1, "min_count": 3}


class LoopingBackend(ScriptedBackend):
    """Attempt 2 (any request with a guard) loops: 'ab' repeated; the guard stops it as vLLM would."""

    def complete(self, request):
        if request.repetition_detection is None:
            return super().complete(request)
        piece = "ab" * request.repetition_detection["min_count"]
        return Completion(
            tag=request.tag,
            text=piece,
            token_ids=list(piece.encode()),
            token_offsets=list(range(len(piece))),
            finish_reason="repetition",
            num_generated_tokens=len(piece),
            wall_time_s=0.0,
        )


def _config(tiny_config, guard, mode="regenerate"):
    guard = None if guard is None else RepetitionGuard.model_validate(guard)
    return changed_config(
        tiny_config,
        inference={"truncation_rerun": mode, "max_new_tokens": 24, "rerun_repetition_guard": guard},
        models={"tiny": {"max_context": 100_000, "max_model_len": 100_000}},
    )


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


@pytest.mark.parametrize("mode", ["regenerate", "continue"])
def test_guard_on_attempt_2_only_keyed_recorded_and_its_finish_reason_stored(
    tiny_config, tiny_datasets, tmp_path, mode
):
    plain = _run(_config(tiny_config, None, mode), tiny_datasets, tmp_path, ScriptedBackend())
    reruns = sum(r.attempt == 2 for r in plain.records)
    assert reruns > 0, "no attempt 2: the test does not exercise the rerun"
    assert all(
        "rerun_repetition_guard" in r.provenance and r.provenance["rerun_repetition_guard"] is None
        for r in plain.records
    )

    backend = LoopingBackend()
    guarded = _run(_config(tiny_config, GUARD, mode), tiny_datasets, tmp_path, backend, out="guarded.jsonl.gz")
    # attempt 1's keys ignore the guard (reused from the store); attempt 2's include it (made again)
    assert guarded.generated == reruns
    assert [r.repetition_detection for r in backend.requests] == [GUARD] * reruns
    for record in guarded.records:
        if record.attempt == 2:
            assert record.finish_reason == "repetition"
            assert record.provenance["sampling"]["repetition_detection"] == GUARD
            assert record.provenance["rerun_repetition_guard"] == GUARD
        else:  # reused: its provenance says what was set when it was made
            assert "repetition_detection" not in record.provenance["sampling"]
            assert record.provenance["rerun_repetition_guard"] is None
    fresh = _run(
        _config(tiny_config, GUARD, mode),
        tiny_datasets,
        tmp_path,
        LoopingBackend(),
        store="fresh",
        out="fresh.jsonl.gz",
    )
    assert all(r.provenance["rerun_repetition_guard"] == GUARD for r in fresh.records)  # in every record made
    # the index stores the new reason under its own code (3), read back by name
    entries = [e for seg in (tmp_path / "store").glob("*.seg") for e in entries_of(seg)]
    assert FINISH_CODES["repetition"] == 3
    assert sum(e.finish_reason == "repetition" for e in entries) == reruns
    # again: everything comes from the store
    assert (
        _run(
            _config(tiny_config, GUARD, mode), tiny_datasets, tmp_path, LoopingBackend(), out="again.jsonl.gz"
        ).generated
        == 0
    )


def test_guard_moves_the_rerun_params_only_when_set(tiny_config):
    model = tiny_config.models["tiny"]
    unset = {k: v for k, v in plain(tiny_config.inference).items() if k != "rerun_repetition_guard"}
    base = output_settings(model, unset)
    assert output_settings(model, {**unset, "rerun_repetition_guard": None}) == base  # earlier hashes hold
    assert output_settings(model, {**unset, "rerun_repetition_guard": GUARD}) != base


def test_guard_config_is_checked(tiny_raw_config, tiny_config, tiny_datasets, tmp_path):
    assert prepare(copy.deepcopy(tiny_raw_config)).inference.rerun_repetition_guard is None  # the default
    raw = copy.deepcopy(tiny_raw_config)
    raw["inference"]["rerun_repetition_guard"] = {**GUARD, "min_count": 1}
    with pytest.raises(ProcexecError, match="rerun_repetition_guard"):
        prepare(raw)
    raw["inference"]["rerun_repetition_guard"] = {"max_pattern_size": 8}
    with pytest.raises(ProcexecError, match="rerun_repetition_guard"):
        prepare(raw)
    # bounded: vLLM's check costs the engine ~1 us per pattern length per guarded request per step
    raw["inference"]["rerun_repetition_guard"] = {**GUARD, "max_pattern_size": 129}
    with pytest.raises(ProcexecError, match=r"inference\.rerun_repetition_guard\.max_pattern_size: .*128"):
        prepare(raw)
    with pytest.raises(ProcexecError, match="inference.rerun_repetition_guard: min_pattern_size 9 exceeds"):
        _run(_config(tiny_config, {**GUARD, "min_pattern_size": 9}), tiny_datasets, tmp_path, ScriptedBackend())


def test_a_models_own_guard_over_inferences_and_none_in_the_pilot(tiny_config):
    """``models.KEY.rerun_repetition_guard`` wins over ``inference``'s; the pilot reruns unguarded, as the paper's
    rule has it, and measures what the guard would change (``procexec.scoring.guard``)."""
    own = RepetitionGuard(max_pattern_size=32, min_pattern_size=2, min_count=5)
    config = changed_config(_config(tiny_config, GUARD), models={"tiny": {"rerun_repetition_guard": own}}, stage="full")
    assert JobSettings.from_config(config, "tiny").rerun_repetition_guard == own.model_dump()
    assert JobSettings.from_config(_config(tiny_config, GUARD), "tiny").rerun_repetition_guard == GUARD
    pilot = config.model_copy(update={"stage": "pilot"})
    assert JobSettings.from_config(pilot, "tiny").rerun_repetition_guard is None
    assert evaluated_guard(pilot.models["tiny"], pilot.inference) == (
        own.model_dump(),
        "models.tiny.rerun_repetition_guard",
    )
    assert evaluated_guard(tiny_config.models["tiny"], tiny_config.inference) == (CANDIDATE_GUARD, "candidate")


def test_a_models_guard_is_checked_naming_its_key(tiny_raw_config):
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["tiny"]["rerun_repetition_guard"] = {**GUARD, "min_pattern_size": 9}
    with pytest.raises(ProcexecError, match=r"models\.tiny\.rerun_repetition_guard\.min_pattern_size: 9 exceeds"):
        prepare(raw)


def test_procexec_loops_writes_a_models_figures_against_its_guard(tiny_raw_config, tmp_path, capsys):
    """``procexec loops``: the model's guard from the config, every rerun of its generation files against it, the
    figures as strict JSON (the report's ``--loops``) and one line on stderr."""
    import json

    from procexec.cli import main
    from procexec.io.jsonl import write_jsonl

    example = generate_example(DatasetSpec.from_id("add_int_1-10_k1"), 5, 0, seed=0)
    reference = execute(example)
    first = dataclasses.replace(_rerun(example, "x" * 30, "length"), attempt=1)
    escaped = _rerun(example, "ab" * 40 + f"<answer>{reference.final}</answer>", "stop")
    write_jsonl(tmp_path / "gen" / "add_int_1-10_k1.jsonl.gz", [first.to_json(), escaped.to_json()])
    write_jsonl(tmp_path / "refs" / "add_int_1-10_k1.jsonl", [reference.to_json()])
    write_jsonl(tmp_path / "data" / "add_int_1-10_k1.jsonl", [example.to_json()])
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["tiny"]["rerun_repetition_guard"] = {"max_pattern_size": 4, "min_pattern_size": 1, "min_count": 4}
    (tmp_path / "config.json").write_text(json.dumps(raw, default=str))
    argv = ["loops", "--config", str(tmp_path / "config.json"), "--model", "tiny"]
    argv += ["--generations", str(tmp_path / "gen" / "add_int_1-10_k1.jsonl.gz")]
    argv += ["--references-dir", str(tmp_path / "refs"), "--datasets-dir", str(tmp_path / "data")]
    assert main([*argv, "--out", str(tmp_path / "tiny.json")]) == 0
    figures = json.loads((tmp_path / "tiny.json").read_text())
    assert figures["guard_source"] == "models.tiny.rerun_repetition_guard"
    assert (figures["examples"], figures["reruns"], figures["guard_stops"], figures["escapes"]) == (1, 1, 1, 1)
    [stopped] = figures["stopped"]
    assert stopped["stop"] == 8 and stopped["escape"] and stopped["cut_scores"]["faa"] is False
    assert "tiny: 0 of 1 reruns end in a loop" in capsys.readouterr().err


@settings(max_examples=120, deadline=None)
@given(
    ids=st.lists(st.integers(0, 3), max_size=80),
    block=st.lists(st.integers(0, 3), min_size=1, max_size=9),
    repeats=st.integers(0, 12),
    sizes=st.tuples(st.integers(0, 12), st.integers(0, 12)),
    min_count=st.integers(2, 6),
)
def test_guard_stop_is_where_vllms_own_check_first_fires(ids, block, repeats, sizes, min_count):
    """``guard_stop`` is the first length at which vLLM 0.32's ``check_sequence_repetition`` (the installed one,
    which ``check_stop`` calls after every appended token) holds, over random tails with planted repeats."""
    from vllm.sampling_params import RepetitionDetectionParams
    from vllm.v1.core.sched.utils import check_sequence_repetition

    smallest, largest = min(sizes), max(sizes)
    guard = {"max_pattern_size": largest, "min_pattern_size": smallest, "min_count": min_count}
    tokens = ids + block * repeats
    params = RepetitionDetectionParams(**guard) if largest else None
    first = next(
        (n for n in range(1, len(tokens) + 1) if params and check_sequence_repetition(tokens[:n], params)), None
    )
    assert guard_stop(tokens, guard) == first


def _rerun(example, text, finish):
    """A regenerated attempt 2 of ``example`` whose tokens are its characters (ids and offsets one a char)."""
    return GenerationRecord(
        id=example.id, model="m", dataset=example.dataset, length=example.length, index=example.index, attempt=2,
        text=text, num_generated_tokens=len(text), finish_reason=finish, token_ids=[ord(c) for c in text],
        token_offsets=list(range(len(text))), provenance={"loop": None},
    )  # fmt: skip


def test_a_rerun_that_leaves_its_loop_and_answers_is_an_escape():
    """The guard cuts where vLLM would have stopped the rerun; the answer it gave after the repetition is lost:
    FAA and CAA change (an escape). A loop after the answer costs nothing but AP (its denominator)."""
    example = generate_example(DatasetSpec.from_id("add_int_1-10_k1"), 5, 0, seed=0)
    reference = execute(example)
    guard = {"max_pattern_size": 4, "min_pattern_size": 1, "min_count": 4}
    answer = f"<answer>{reference.final}</answer>"
    left = guard_effect(_rerun(example, "ab" * 40 + answer, "stop"), reference, example, guard)
    assert (left.stop, left.new_tokens, left.saved_tokens) == (8, 80 + len(answer), 72 + len(answer))
    assert left.escape and {"faa", "caa", "parseable"} <= set(left.changed)
    assert left.scores["faa"] is True and left.cut_scores["faa"] is False
    stayed = guard_effect(_rerun(example, "so: " + answer + "ab" * 40, "length"), reference, example, guard)
    assert stayed.stop == 4 + len(answer) + 8 and not stayed.escape and stayed.answer_position_moved
    assert stayed.scores["faa"] is stayed.cut_scores["faa"] is True
    never = guard_effect(_rerun(example, answer, "stop"), reference, example, guard)
    assert never.stop is None and not never.escape and never.scores is None
    assert CANDIDATE_GUARD == {"max_pattern_size": 128, "min_pattern_size": 1, "min_count": 16}


@pytest.mark.vllm
def test_a_guarded_run_stops_where_the_post_hoc_detector_says_and_the_pilot_records_it(
    tiny_config, tiny_datasets, tiny_manifest, tmp_path
):
    """The tiny Llama falls into short greedy cycles.  Unguarded (the pilot, the paper's rule), its
    continuations run to the context; ``guard_stop`` over each one's own tokens says where vLLM's detection
    would have ended it.  Guarded (the same engine, the same store: attempt 1 reused), every rerun stops
    exactly there, with finish reason ``repetition`` and the unguarded tokens up to that point; the pilot's
    figures (``procexec loops``) record the loops, the guard points, the cut scores and the escapes."""
    import json

    from procexec.analysis.loops import loop_figures
    from procexec.generation.backends import create_backend
    from procexec.io.jsonl import write_jsonl
    from procexec.scoring.guard import rerun_ids

    directory, ids = tiny_datasets
    guard = RepetitionGuard(max_pattern_size=16, min_pattern_size=1, min_count=4)
    plain = changed_config(
        tiny_config,
        inference={"truncation_rerun": "continue", "max_new_tokens": 24},
        models={"tiny": {"max_context": 1024}},
    )
    settings = JobSettings.from_config(plain, "tiny")
    backend = create_backend(settings, tiny_manifest)
    close, backend.close = backend.close, lambda: None  # one engine for both runs

    def run(config, out):
        return run_job(
            JobSettings.from_config(config, "tiny"), directory, ids, 1, 1, tmp_path / "store", tmp_path / out,
            tiny_manifest, progress_interval=None, backend_factory=lambda *a: backend,
        )  # fmt: skip

    try:
        unguarded = run(plain, "plain.jsonl.gz")
        guarded = run(changed_config(plain, models={"tiny": {"rerun_repetition_guard": guard}}), "guarded.jsonl.gz")
    finally:
        close()
    assert guarded.generated == sum(r.attempt == 2 for r in unguarded.records)  # attempts 1 came from the store
    reruns = {r.id: r for r in unguarded.records if r.attempt == 2}
    assert reruns, "no attempt 2: the test does not exercise the rerun"
    stops = {rid: guard_stop(rerun_ids(r), guard.model_dump()) for rid, r in reruns.items()}
    assert any(stop is not None for stop in stops.values()), "no rerun loops: nothing to compare"
    for record in (r for r in guarded.records if r.attempt == 2):
        own, whole = rerun_ids(record), rerun_ids(reruns[record.id])
        stop = stops[record.id]
        if stop is not None and stop < len(whole):
            assert (record.finish_reason, own) == ("repetition", whole[:stop]), record.id
        else:
            assert (record.finish_reason, own) == (reruns[record.id].finish_reason, whole), record.id
    print(f"guard stops after {sorted(s for s in stops.values() if s)} of the reruns' own tokens")
    # the pilot's figures, from the unguarded records as the workflow's loops rule reads them
    refs_dir = tmp_path / "references"
    by_dataset: dict[str, list] = {}
    for record in unguarded.records:
        by_dataset.setdefault(record.dataset, []).append(record.to_json())
    for dataset, records in by_dataset.items():
        write_jsonl(tmp_path / f"{dataset}.jsonl.gz", records)
        examples = [Example.from_json(obj, "") for _, obj in read_jsonl(directory / f"{dataset}.jsonl")]
        write_jsonl(refs_dir / f"{dataset}.jsonl", (execute(e).to_json() for e in examples))
    figures = loop_figures(
        "tiny", guard.model_dump(), "models.tiny.rerun_repetition_guard",
        [tmp_path / f"{d}.jsonl.gz" for d in ids], refs_dir, directory,
    )  # fmt: skip
    stopped = {row["id"]: row for row in figures["stopped"]}
    assert stopped == {
        rid: stopped[rid] for rid, s in stops.items() if s is not None and s < len(rerun_ids(reruns[rid]))
    }
    for rid, row in stopped.items():
        assert row["stop"] == stops[rid] and row["cut_scores"] is not None and row["escape"] == bool(row["changed"])
    assert figures["loops"] == sum(r.looping for r in reruns.values()) and figures["reruns"] == len(reruns)
    assert figures["escapes"] == sum(row["escape"] for row in stopped.values())
    json.dumps(figures, allow_nan=False)  # strict JSON, as the report reads it

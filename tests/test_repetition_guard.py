"""The optional rerun guard: vLLM's repetition detection on attempt 2 only, keyed, recorded, finish reason stored."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from config_changes import changed_config
from fake_backend import ScriptedBackend
from procexec.config import prepare
from procexec.config.keys import output_settings
from procexec.config.model import RepetitionGuard
from procexec.errors import ProcexecError
from procexec.generation.backend import Completion
from procexec.generation.job import run_job
from procexec.generation.job_settings import JobSettings, evaluated_guard
from procexec.generation.store import FINISH_CODES, entries_of
from procexec.scoring.guard import CANDIDATE_GUARD, guard_stop
from procexec.scoring.loops import detect_loop

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
    model = tiny_config["models"]["tiny"]
    unset = {k: v for k, v in tiny_config["inference"].items() if k != "rerun_repetition_guard"}
    base = output_settings(model, unset)
    assert output_settings(model, {**unset, "rerun_repetition_guard": None}) == base  # earlier hashes hold
    assert output_settings(model, {**unset, "rerun_repetition_guard": GUARD}) != base


def test_guard_config_is_checked(tiny_raw_config, tiny_config, tiny_datasets, tmp_path):
    assert prepare(copy.deepcopy(tiny_raw_config))["inference"]["rerun_repetition_guard"] is None  # the default
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


@settings(max_examples=200, deadline=None)
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


@pytest.mark.vllm
def test_vllm_cpu_engine_stops_a_looping_rerun_with_finish_reason_repetition(
    tiny_config, tiny_datasets, tiny_manifest, tmp_path
):
    """The random tiny Llama falls into short greedy cycles; vLLM's detection ends them on attempt 2."""
    directory, ids = tiny_datasets
    guard = RepetitionGuard(max_pattern_size=16, min_pattern_size=1, min_count=4)
    config = changed_config(
        tiny_config,
        inference={"truncation_rerun": "regenerate", "max_new_tokens": 24, "rerun_repetition_guard": guard},
        models={"tiny": {"max_context": 1024}},
    )
    result = run_job(
        JobSettings.from_config(config, "tiny"),
        directory,
        ids,
        1,
        1,
        tmp_path / "store",
        tmp_path / "out.jsonl.gz",
        tiny_manifest,
        progress_interval=None,
    )
    seconds = [r for r in result.records if r.attempt == 2]
    assert seconds, "no attempt 2: the test does not exercise the rerun"
    stopped = [r for r in seconds if r.finish_reason == "repetition"]
    print(
        f"attempt 2: {len(seconds)} reruns, {len(stopped)} stopped by the guard at "
        f"{sorted(r.num_generated_tokens for r in stopped)} tokens"
    )
    assert stopped, f"no rerun stopped: {[(r.finish_reason, r.num_generated_tokens) for r in seconds]}"
    for record in stopped:
        assert record.provenance["sampling"]["repetition_detection"]["min_count"] == 4
        assert record.num_generated_tokens < 1024 - record.prompt_tokens  # stopped before the budget
        ids_ = record.token_ids
        period = next(p for p in range(1, 17) if ids_[-4 * p :] == ids_[-p:] * 4)  # vLLM's own criterion held
        assert period <= 16
    assert all(r.finish_reason in ("stop", "length") for r in result.records if r.attempt == 1)
    entries = [e for seg in (tmp_path / "store").glob("*.seg") for e in entries_of(seg)]
    assert sum(e.finish_reason == "repetition" for e in entries) == len(stopped)
    # what our own tail check says of them (its thresholds need a longer span than this guard's)
    assert all(
        detect_loop(r.token_ids, r.text) is None or detect_loop(r.token_ids, r.text).period <= 16 for r in stopped
    )

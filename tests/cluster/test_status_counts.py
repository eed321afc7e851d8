"""procexec status counts what a store holds, once per generation, and says what it leaves out (issue 30).

Stores written here as jobs write them (``Store.put``), with the mishaps a shared study folder meets: a
record regenerated after damage, two shard layouts writing one key, a foreign frame in a segment,
statistics files that cannot be true.
"""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
import yaml

from procexec.cli import main
from procexec.cluster.status import model_status
from procexec.generation.engine_stats import EngineStats, add_stats
from procexec.generation.store import FRAME, MAGIC, Store


def _record(n: int, attempt: int = 1) -> dict:
    return {
        "id": f"ex-{n}",
        "attempt": attempt,
        "finish_reason": "stop",
        "num_generated_tokens": 10 + n,
        "token_ids": list(range(10 + n)),
        "provenance": {"loop": None},
    }


def _write(store: Path, writer: str, keys: list[int]) -> None:
    s = Store(store, writer, commit_records=1)
    s.load()
    for n in keys:
        s.put(f"{n:064x}", _record(n))
    s.close()


def _store(results: Path) -> Path:
    return results / "generations" / "tiny" / "store"


#: A statistics file as jobs wrote them before preemptions, start-up and the KV pool were kept.
OLD_STATS = {"decoded_tokens": 1000, "generate_s": 10.0, "drafts": 0, "draft_tokens": 0, "accepted_tokens": 0}


def test_a_key_written_by_two_shard_layouts_or_rewritten_counts_once(tiny_config, tmp_path):
    store = _store(tmp_path)
    _write(store, "1-of-2", [0, 1])
    _write(store, "2-of-2", [2, 3])
    _write(store, "1-of-1", [0, 1, 2, 3])  # a rerun with another layout regenerated all four
    _write(store, "1-of-2", [1])  # and one record, say a damaged one, was made again
    row = model_status(tiny_config, "tiny", tmp_path)
    assert row.done == 4 and row.tokens == sum(10 + n for n in range(4))


def test_a_foreign_frame_in_a_segment_is_named_by_status(tiny_config, tmp_path, capsys):
    store = _store(tmp_path)
    _write(store, "1-of-1", [0, 1])
    seg = store / "1-of-1.seg"
    size = seg.stat().st_size
    with open(seg, "ab") as handle:  # a whole frame (its CRC right) of bytes no procexec writer made
        payload = b"not a procexec record"
        handle.write(FRAME.pack(MAGIC, len(payload), bytes(32), zlib.crc32(payload)) + payload)
    row = model_status(tiny_config, "tiny", tmp_path)
    err = capsys.readouterr().err.splitlines()
    assert row.done == 2
    assert err == [
        f"procexec status: warning: {seg}: bytes {size}..{seg.stat().st_size} are not a record this "
        "procexec wrote (a damaged or foreign frame); not counted"
    ]
    torn = store / "2-of-2.seg"
    _write(store, "2-of-2", [5])
    with open(torn, "ab") as handle:  # a torn tail (a kill mid-write) is what recovery is for: no word
        handle.write(FRAME.pack(MAGIC, 500, bytes(32), 0)[:10])
    assert model_status(tiny_config, "tiny", tmp_path).done == 3
    assert "2-of-2" not in capsys.readouterr().err


@pytest.mark.parametrize(
    "figures, problem",
    [
        (
            {"decoded_tokens": 100, "generate_s": 5e-324, "drafts": 0, "draft_tokens": 0, "accepted_tokens": 0},
            r"100 tokens decoded in 5e-324 s",
        ),
        (
            {"decoded_tokens": 100, "generate_s": 10, "drafts": 10, "draft_tokens": 10, "accepted_tokens": 30},
            r"accepted_tokens 30 > draft_tokens 10",
        ),
        (
            {"decoded_tokens": 100.5, "generate_s": 10, "drafts": 0, "draft_tokens": 0, "accepted_tokens": 0},
            r"the counts whole",
        ),
        (
            {**OLD_STATS, "starts": 0, "startup_s": 600.0},
            r"start-up seconds (600.0) without a start",
        ),
        (
            {**OLD_STATS, "preemptions": 2.5},
            r"the counts whole",
        ),
        (
            {**OLD_STATS, "restarts": 1},
            r"not a shard's engine statistics",
        ),
    ],
)
def test_status_json_leaves_out_an_impossible_statistics_file_with_one_line(
    tiny_raw_config, tmp_path, capsys, figures, problem
):
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tiny_raw_config))
    store = _store(tmp_path / "results")
    _write(store, "1-of-2", [0])
    add_stats(store, "1-of-2", EngineStats(decoded_tokens=1000, generate_s=10.0))
    (store / "stats" / "2-of-2.json").write_text(json.dumps(figures))
    capsys.readouterr()
    assert main(["status", "--config", str(config), "--results", str(tmp_path / "results"), "--json"]) == 0
    out, err = capsys.readouterr()
    row = next(r for r in json.loads(out) if r["model"] == "tiny")
    assert row["tokens_per_s"] == pytest.approx(100.0) and row["spec_acceptance"] is None  # the good shard only
    (warning,) = err.splitlines()
    assert warning.startswith(f"procexec status: warning: {store / 'stats' / '2-of-2.json'}: ")
    assert problem in warning and warning.endswith("left out of the engine figures")


def test_a_shards_decode_rate_leaves_out_the_engines_start(tiny_config, tiny_datasets, tmp_path, monkeypatch):
    """The job times its requests, not the engine's load or a server's start before them."""
    from fake_backend import ScriptedBackend
    from procexec.generation import job
    from procexec.generation.engine_stats import read_stats
    from procexec.generation.job import run_job
    from procexec.generation.job_settings import JobSettings

    clock = [1000.0]
    monkeypatch.setattr(job.time, "monotonic", lambda: clock[0])

    class SlowStart(ScriptedBackend):
        def start(self):
            clock[0] += 300.0  # loading weights: five minutes, no token

        def generate(self, requests, sampling, on_finished):
            clock[0] += 10.0
            super().generate(requests, sampling, on_finished)

    backend = SlowStart()
    directory, ids = tiny_datasets
    result = run_job(
        JobSettings.from_config(tiny_config, "tiny"),
        directory,
        ids,
        1,
        1,
        tmp_path / "store",
        tmp_path / "out.jsonl.gz",
        None,
        progress_interval=None,
        backend_factory=lambda *a: backend,
    )
    stats = read_stats(tmp_path / "store" / "stats" / "1-of-1.json")
    phases = len({p.attempt for p in result.plans})
    assert stats.decoded_tokens == backend.decoded > 0
    assert stats.generate_s == pytest.approx(10.0 * phases)  # without the start: 310 s a phase


def test_a_statistics_file_from_before_preemptions_and_startup_still_reads(tiny_raw_config, tmp_path, capsys):
    """Files written before the fields existed read as no preemption, no start and no KV pool measured, and add up
    with a newer shard's; status shows the newer figures, no warning."""
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump(tiny_raw_config))
    store = _store(tmp_path / "results")
    (store / "stats").mkdir(parents=True)
    (store / "stats" / "1-of-2.json").write_text(json.dumps(OLD_STATS))
    add_stats(
        store, "2-of-2", EngineStats(1000, 10.0, preemptions=5, starts=1, startup_s=30.0, kv_capacity_tokens=3072)
    )
    add_stats(store, "1-of-2", EngineStats(500, 5.0, preemptions=1, starts=1, startup_s=20.0))  # the old shard resumed
    capsys.readouterr()
    assert main(["status", "--config", str(config), "--results", str(tmp_path / "results"), "--json"]) == 0
    out, err = capsys.readouterr()
    row = next(r for r in json.loads(out) if r["model"] == "tiny")
    assert err == ""
    assert (row["tokens_per_s"], row["preemptions"], row["starts"], row["startup_s"]) == (100.0, 6, 2, 25.0)
    assert (row["load_s"], row["warmup_s"], row["kv_capacity_tokens"], row["kv_sequences"]) == (None, None, 3072, 4.0)


def test_status_names_a_model_whose_engines_preempt_repeatedly(tiny_config, tmp_path):
    """Preemptions above 5% of the generations mean admission above the KV pool: one line names the model."""
    from procexec.cluster.status import format_table

    store = _store(tmp_path)
    _write(store, "1-of-1", list(range(8)))  # the tiny suite's 8 examples
    add_stats(store, "1-of-1", EngineStats(1000, 10.0, kv_capacity_tokens=3072))
    calm = model_status(tiny_config, "tiny", tmp_path)
    assert not calm.preempting and "PREEMPTING" not in format_table([calm])
    add_stats(store, "1-of-1", EngineStats(preemptions=1))  # 1 of 8
    row = model_status(tiny_config, "tiny", tmp_path)
    assert row.preempting
    assert (
        "PREEMPTING tiny: 1 preemption(s) in 8 generations (more than 5%): lower "
        "models.tiny.max_concurrency, or --max-num-seqs in its serve_args, towards the KV pool's 3,072 tokens per "
        "engine (4.0 sequences of max_model_len)"
    ) in format_table([row]).splitlines()


def test_startup_phases_are_read_from_the_lines_vllm_logs_on_a_gpu_and_on_the_cpu():
    """vLLM 0.32's start-up lines (the CUDA wheel's gpu_model_runner.py and v1/engine/core.py; default_loader.py,
    the CPU's only one), interleaved over two ranks: the slowest rank's figures; nothing logged: 0."""
    from procexec.generation.engine_stats import startup_phases

    gpu = "\n".join(
        [
            "(EngineCore_DP0 pid=11) INFO [default_loader.py:502] Loading weights took 512.31 seconds",
            "(EngineCore_DP1 pid=12) INFO [default_loader.py:502] Loading weights took 530.02 seconds",
            "(EngineCore_DP0 pid=11) INFO [gpu_model_runner.py:5150] Model loading took 80.1 GiB memory and "
            "540.123456 seconds",
            "(EngineCore_DP1 pid=12) INFO [gpu_model_runner.py:5150] Model loading took 80.1 GiB memory and "
            "551.500000 seconds",
            "(EngineCore_DP0 pid=11) INFO [gpu_model_runner.py:6582] Graph capturing finished in 41 secs, took 2.1 GiB",
            "(EngineCore_DP1 pid=12) INFO [core.py:403] init engine (profile, create kv cache, warmup model) took "
            "301.55 s (compilation: 120.02 s)",
            "(EngineCore_DP0 pid=11) INFO [core.py:403] init engine (profile, create kv cache, warmup model) took "
            "298.10 s (compilation: 118.40 s)",
        ]
    )
    assert startup_phases(gpu) == (551.5, 301.55)
    cpu = (
        "(EngineCore pid=9) INFO [default_loader.py:501] Loading weights took 0.84 seconds\n"
        "(EngineCore pid=9) INFO [core.py:402] init engine (profile, create kv cache, warmup model) took 0.12 s"
    )
    assert startup_phases(cpu) == (0.84, 0.12)
    assert startup_phases("(APIServer pid=1) INFO Starting vLLM server") == (0.0, 0.0)


def test_verify_without_a_recorded_vocabulary_checks_the_rest_and_says_so(tiny_config, tmp_path, capsys):
    """No check file (check-model not run for this stage): the ids go unchecked, said once; a record that fails
    ``GenerationRecord``'s checks (here: no model, dataset or text) is still named, as infer drops it."""
    store = _store(tmp_path)
    _write(store, "1-of-1", [0])
    capsys.readouterr()
    row = model_status(tiny_config, "tiny", tmp_path, verify=True)
    check, dropped = capsys.readouterr().err.splitlines()
    assert check == (
        f"procexec status: warning: {tmp_path / 'models' / 'tiny' / 'check.json'}: no vocabulary recorded (run "
        "check-model, the workflow's check_model); token ids not checked"
    )
    assert dropped.startswith(f"procexec status: warning: {store / '1-of-1'}.seg: the frame of {0:012x} at byte 0")
    assert dropped.endswith("; the next infer drops it and generates ex-0 (attempt 1) again; not counted")
    assert (row.done, row.dropped) == (0, 1)
    assert model_status(tiny_config, "tiny", tmp_path).done == 1  # the index alone counts it

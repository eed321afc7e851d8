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
    assert problem in warning and warning.endswith("left out of the decode rate and acceptance")


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

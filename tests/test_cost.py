"""procexec cost: the stated model's tokens, the bandwidth model, and a projection fitted to a measured store."""

from __future__ import annotations

import types

import numpy as np
import pytest

from procexec.cli import main
from procexec.cluster import cost
from procexec.cluster.cost import (
    Architecture,
    Hardware,
    Measured,
    bandwidth_throughput,
    expected_decode,
    output_model,
    project_model,
    project_study,
    read_measured,
)
from procexec.config import expand_suite, load, load_merged
from procexec.inference import store as store_module
from procexec.inference.store import Store
from procexec.records import GenerationRecord

HW = Hardware(hbm_bytes_per_s=4.8e12, memory_bytes=141e9, gpu_memory_utilization=0.92, efficiency=0.7,
              max_num_seqs=1024)


def test_without_measurements_the_stated_models_tokens():
    config = load("config.yaml")
    rows = project_study(config)
    n = len(expand_suite(config["suite"])) * config["suite"]["examples_per_length"]
    for row in rows:
        model = config["models"][row.model]
        max_new = int(model.get("max_new_tokens", config["inference"]["max_new_tokens"]))
        room = int(model["max_context"]) - cost.PROMPT_TOKENS
        parts = [expected_decode(L, output_model(model), max_new, room, config["inference"]["truncation_rerun"])
                 for L in config["suite"]["lengths"]]
        assert row.attempt1_tokens == pytest.approx(sum(p.attempt1 for p in parts) * n)
        assert row.rerun_tokens == pytest.approx(sum(p.attempt2 for p in parts) * n)
        assert row.constant_gpu_hours == pytest.approx(row.tokens / model["throughput_tok_s"] / 3600 * model["gpus"])
        assert row.gpu_hours_interval[0] <= row.gpu_hours <= row.gpu_hours_interval[1]
    assert sum(r.tokens for r in rows) == pytest.approx(9.78e9, rel=0.01)  # README: 9.8 G decoded tokens


def test_bandwidth_model_by_hand():
    qw4 = Architecture(kv_bytes_per_token=147456, weight_bytes=8.06e9)
    pool = 141e9 * 0.92 - 8.06e9
    batch = pool / (147456 * 10_700)
    hand = batch / ((8.06e9 + batch * 10_700 * 147456) / (0.7 * 4.8e12))
    assert bandwidth_throughput(qw4, HW, 1, 10_700) == pytest.approx(hand)
    assert 1800 < hand < 2200  # engine notes: ~2,100 tok/s for Qwen3-4B at 10.7k
    # short contexts: the batch is capped by max_num_seqs, throughput bounded by the weights
    assert bandwidth_throughput(qw4, HW, 1, 100) == pytest.approx(1024 / ((8.06e9 + 1024 * 100 * 147456) / 3.36e12))
    # MLA over 8 GPUs: each rank holds the whole latent; GQA splits it
    mla = Architecture(70272, 690e9, kv_replicated=True)
    gqa = Architecture(70272, 690e9, kv_replicated=False)
    assert bandwidth_throughput(gqa, HW, 8, 10_000) > 4 * bandwidth_throughput(mla, HW, 8, 10_000)


def _record(example_id, length, attempt, tokens, finish, continued=0):
    provenance = {"continued_tokens": continued} if continued else {}
    return GenerationRecord(
        id=example_id, model="tiny-llama", dataset="add_int_1-10_k1", length=length, index=int(example_id[-1]),
        attempt=attempt, text="x" * tokens, num_generated_tokens=tokens, finish_reason=finish,
        prompt_tokens=100, continues_attempt=1 if continued else None, provenance=provenance,
    ).to_json()  # fmt: skip


def test_measured_store_equals_a_hand_computation(tmp_path, monkeypatch):
    now = [100.0]
    monkeypatch.setattr(store_module, "time", types.SimpleNamespace(time=lambda: now[0],
                                                                    monotonic=store_module.time.monotonic))
    directory = tmp_path / "generations" / "tiny-llama" / "store"
    store = Store(directory, "shard-1")
    store.put("a" * 64, _record("add_int_1-10_k1:5:0", 5, 1, 10, "stop"))
    store.put("b" * 64, _record("add_int_1-10_k1:5:1", 5, 1, 20, "length"))
    store.flush()  # committed at t = 100
    now[0] = 110.0
    store.put("c" * 64, _record("add_int_1-10_k1:5:1", 5, 2, 50, "length", continued=20))  # 30 new tokens
    store.put("d" * 64, _record("add_int_1-10_k1:15:2", 15, 1, 40, "stop"))
    store.close()  # committed at t = 110
    measured = read_measured(directory)
    assert measured.examples == {5: [(10, 0), (20, 30)], 15: [(40, 0)]}
    assert (measured.truncated, measured.reruns, measured.generations) == (1, 1, 4)
    assert measured.tokens_per_s == pytest.approx((30 + 40) / 10)

    config = load_merged(["config.yaml", "config/test-tiny.yaml"])
    config["suite"] = {**config["suite"], "lengths": [5, 10, 15], "examples_per_length": 3}
    row = project_study(config, tmp_path, resamples=50)[0]
    per_length = 3 * len(expand_suite(config["suite"]))
    first = (10 + 20) / 2 + (15 + 40) / 2 + 40  # length 10 interpolated between 5 and 15
    rerun = (0 + 30) / 2 + (15 + 0) / 2 + 0
    assert row.basis == "measured"
    assert row.attempt1_tokens == pytest.approx(first * per_length)
    assert row.rerun_tokens == pytest.approx(rerun * per_length)
    assert row.tokens_per_s == pytest.approx(7.0)  # no architecture numbers for TINY: the measured rate as is
    assert row.gpu_hours == pytest.approx((first + rerun) * per_length / 7.0 / 3600)
    assert row.measured["truncated_share"] == pytest.approx(1 / 3)
    lo, hi = row.tokens_interval
    assert lo <= row.tokens <= hi


def test_interval_covers_the_truth_in_a_seeded_simulation():
    lengths = [5, 25, 45, 65, 85]
    config = {"suite": {"lengths": lengths, "examples_per_length": 100},
              "inference": {"truncation_rerun": "continue", "max_new_tokens": 32768},
              "models": {"m": {"abbrev": "X", "gpus": 1, "shards": 1, "max_model_len": 131072,
                               "throughput_tok_s": 1000.0}}}
    mean = {L: 2000 + 100 * L for L in lengths}
    p_trunc = {L: 0.02 + 0.28 * L / 95 for L in lengths}
    truth = sum(mean[L] * (1 - p_trunc[L]) + p_trunc[L] * (32768 + 12000) for L in lengths) * 100 * 10
    rng = np.random.default_rng(7)
    covered = 0
    for sim in range(40):
        examples = {}
        for L in lengths:  # a pilot of 2 examples per cell x 10 datasets: 20 per length
            cut = rng.random(20) < p_trunc[L]
            first = np.where(cut, 32768, rng.exponential(mean[L], 20).astype(int))
            rerun = np.where(cut, rng.exponential(12000, 20).astype(int), 0)
            examples[L] = list(zip(first.tolist(), rerun.tolist()))
        measured = Measured(examples, 0, 0, 0, 100, 1000.0, 5000.0)
        row = project_model(config, "m", 10, measured, (HW, {}), resamples=300, seed=sim)
        covered += row.tokens_interval[0] <= truth <= row.tokens_interval[1]
    assert covered >= 34  # nominal 95%: 38 of 40; a percentile bootstrap of 20 a cell runs a little short


def test_cli_cost(capsys, tmp_path):
    assert main(["cost", "--config", "config.yaml"]) == 0
    table = capsys.readouterr().out
    assert "DS-685" in table and "GPU-h const" in table
    assert main(["cost", "--config", "config.yaml", "--measured", str(tmp_path / "nope")]) == 2
    assert "--measured" in capsys.readouterr().err

"""procexec.cluster.study_stages: smoke and pilot are rewrites of the study's config that share its store."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from procexec.cluster.study_stages import checks_dirs, staged
from procexec.cluster.workflow import Study
from procexec.config import read_yaml
from procexec.errors import ProcexecError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def raw() -> dict:
    return read_yaml(REPO / "config.yaml")


def study(raw: dict, **top) -> Study:
    return Study.from_config({**copy.deepcopy(raw), **top})


def examples(s: Study) -> int:
    return len(s.datasets) * len(s.config.suite.lengths) * s.config.suite.examples_per_length


def test_the_pilot_is_two_percent_of_the_study_with_its_budgets_and_store(raw):
    full, pilot = study(raw), study(raw, stage="pilot")
    assert (full.stage, pilot.stage) == ("full", "pilot")
    assert examples(pilot) == 1100 and examples(full) == 55_000  # 2 per cell: 2% of the study
    assert pilot.datasets == full.datasets
    for model in full.run_models:
        # the same generation settings: the full run finds the pilot's generations in the store
        assert pilot.model_settings(model) == full.model_settings(model)
        assert pilot.shard_ids(model) == ["1-of-1"]
    # its own outputs, the study's shared inputs
    assert full.results == Path("results") and pilot.results == Path("results/pilot")
    assert all(f.startswith("results/pilot/") for f in pilot.score_files() + pilot.infer_benchmark_files())
    assert pilot.prompt_files() == full.prompt_files()
    # the model checks: the full study's for the pilot (the same settings), the smoke's own (its own contexts)
    smoke = study(raw, stage="smoke")
    assert checks_dirs(pilot.config) == checks_dirs(full.config) == (Path("results"), Path("logs"))
    assert checks_dirs(smoke.config) == (Path("results/smoke"), Path("logs/smoke"))
    for model in full.run_models:
        assert pilot.check_settings(model) == full.check_settings(model) != smoke.check_settings(model)
    assert pilot.config_file != full.config_file
    assert study(raw, stage="pilot", pilot_examples_per_length=5).config.suite.examples_per_length == 5


def test_the_smoke_runs_eight_examples_per_model_on_the_real_engine_with_a_rerun(raw):
    full, smoke = study(raw), study(raw, stage="smoke")
    assert examples(smoke) == 8 and smoke.datasets == full.datasets[:2]
    assert smoke.config.suite.lengths == [5, 95]
    assert smoke.config.inference.max_new_tokens == 256
    for model in full.run_models:
        entry = smoke.models[model]
        # the engine is the study's own (it proves the real settings start) ...
        assert smoke.check_settings(model).replace('"max_context":4096', "") == full.check_settings(model).replace(
            f'"max_context":{full.models[model].max_context}', ""
        )
        # ... with budgets that truncate attempt 1 and leave room for its rerun
        assert entry.max_context == 4096 < full.models[model].max_context
        assert entry.max_new_tokens is None and smoke.shard_ids(model) == ["1-of-1"]  # inference's 256
        assert smoke.model_settings(model) != full.model_settings(model)  # its own generations
    assert smoke.results == Path("results/smoke")
    custom = study(raw, stage="smoke", smoke={"datasets": 1, "lengths": [35], "examples_per_length": 3})
    assert examples(custom) == 3


@pytest.mark.parametrize("stage", ["smoke", "pilot", "full"])
def test_staging_a_staged_config_changes_nothing(raw, stage):
    """The jobs may apply the stage again to the config the workflow wrote."""
    once = staged({**copy.deepcopy(raw), "stage": stage})
    assert staged(copy.deepcopy(once)) == once


@pytest.mark.parametrize(
    "top, field",
    [
        ({"stage": "medium"}, "stage"),
        ({"pilot_examples_per_length": 0}, "pilot_examples_per_length"),
        ({"stage": "smoke", "smoke": {"examples": 3}}, "smoke"),
    ],
)
def test_a_bad_stage_setting_is_one_line_naming_the_key(raw, top, field):
    with pytest.raises(ProcexecError) as err:
        study(raw, **top)
    assert field in str(err.value) and "\n" not in str(err.value)


def test_the_full_stage_refuses_to_start_over_its_gpu_hour_budget(raw, tmp_path):
    """Only the full stage is held to the budget (smoke and pilot are how the projection is measured)."""
    over = {**copy.deepcopy(raw), "cluster": {**raw["cluster"], "gpu_hours_budget": 10}}
    refusal = Study.from_config(copy.deepcopy(over)).budget_refusal(tmp_path / "absent")
    assert refusal is not None and "exceeds cluster.gpu_hours_budget 10" in refusal and "\n" not in refusal
    assert Study.from_config({**copy.deepcopy(over), "stage": "pilot"}).budget_refusal(tmp_path) is None
    roomy = {**copy.deepcopy(raw), "cluster": {**raw["cluster"], "gpu_hours_budget": 1e6}}
    assert Study.from_config(roomy).budget_refusal(tmp_path) is None
    assert Study.from_config(copy.deepcopy(raw)).budget_refusal(tmp_path) is None  # no budget: no check


def test_a_models_budget_names_the_model_and_an_unknown_one_is_refused(raw, tmp_path):
    capped = {**copy.deepcopy(raw), "cluster": {**raw["cluster"], "model_gpu_hours_budgets": {"kk-1t": 1}}}
    refusal = Study.from_config(capped).budget_refusal(tmp_path)
    assert refusal.startswith("kk-1t: projected ") and "cluster.model_gpu_hours_budgets.kk-1t 1:" in refusal
    with pytest.raises(ProcexecError, match="cluster.model_gpu_hours_budgets.nobody: unknown model key"):
        study(raw, cluster={**raw["cluster"], "model_gpu_hours_budgets": {"nobody": 5}})


def _pilot_store(results: Path, model: str, tokens: int, writer: str = "pilot-1-of-1") -> Path:
    """A store in which ``writer`` stored one example of length 5 and one of 95, ``tokens`` generated each."""
    from procexec.generation.store import Store
    from store_records import generation_record

    store = Store(results / "generations" / model / "store", writer)
    for n, length in enumerate((5, 95)):
        store.put(f"{n}" * 64, generation_record(f"add_int_1-10_k1:{length}:{n}", length, 1, tokens, "stop"))
    store.close()
    return results


def test_the_full_stage_sizes_its_shards_from_what_the_pilot_measured(raw, tmp_path):
    """Stated output model before a pilot; the pilot's measured tokens after it (longer outputs, longer
    shards; short ones, shorter than stated); full-study segments alone are never decoded at a DAG build."""
    full, pilot = study(raw), study(raw, stage="pilot")
    shards = full.models["qw-4"].shards
    stated = full.infer_runtime("qw-4", shards, tmp_path / "absent")
    short = full.infer_runtime("qw-4", shards, _pilot_store(tmp_path / "short", "qw-4", 300))
    long = full.infer_runtime("qw-4", shards, _pilot_store(tmp_path / "long", "qw-4", 30_000))
    assert short < stated and short < long <= full.cluster.max_runtime_minutes
    assert full.projection("qw-4", tmp_path / "long").basis == "measured"
    assert full.projection("ol-7", tmp_path / "long").basis == "stated"  # no pilot of its own yet
    assert pilot.infer_runtime("qw-4", 1, tmp_path / "long") == pilot.infer_runtime("qw-4", 1, tmp_path / "absent")
    unpiloted = _pilot_store(tmp_path / "unpiloted", "qw-4", 30_000, writer="1-of-8")
    assert full.infer_runtime("qw-4", shards, unpiloted) == stated


def test_status_projects_each_models_gpu_hours_and_flags_budgets(tiny_raw_config, tmp_path):
    """5 of 8 examples done in 2 GPU-hours: 3.2 projected; over a model budget of 3, within a study's of 10."""
    from procexec.cluster.status import format_table, model_status, to_json
    from procexec.config import prepare
    from procexec.generation.store import Store
    from store_records import key, record

    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["tiny"]["gpus"] = 1
    raw["cluster"] = {"model_gpu_hours_budgets": {"tiny": 3}}
    config = prepare(raw)
    store = Store(tmp_path / "generations" / "tiny" / "store", "1-of-1")
    for n in range(5):
        store.put(key(n), record(n))
    store.close()
    bench = tmp_path / "benchmarks" / "infer" / "tiny"
    bench.mkdir(parents=True)
    (bench / "1-of-1.tsv").write_text("s\th:m:s\tmax_rss\n7200.0\t2:00:00\t100\n")
    row = model_status(config, "tiny", tmp_path)
    assert (row.done, row.total, row.gpu_hours) == (5, 8, 2.0)
    assert row.projected_gpu_hours == pytest.approx(3.2) and row.budget == 3 and row.over_budget
    assert to_json([row])[0]["over_budget"] is True
    table = format_table([row], study_budget=10).splitlines()
    assert "OVER BUDGET tiny: projected 3.2 GPU-hours exceeds cluster.model_gpu_hours_budgets.tiny 3.0" in table
    assert table[-1] == "projected 3.2 GPU-hours is within cluster.gpu_hours_budget 10.0"
    assert format_table([row], study_budget=1).splitlines()[-1].startswith("OVER BUDGET: projected 3.2 GPU-hours")


def test_engine_statistics_add_up_across_runs_and_reach_status(tiny_raw_config, tmp_path):
    """Two runs of one shard and one of another: tokens/s is tokens over seconds of generating; the
    speculative and preemption counters come from a server's Prometheus text, summed over its engines, the KV
    pool is its smallest engine's; start-up seconds are per start."""
    from procexec.cluster.status import format_table, model_status
    from procexec.config import prepare
    from procexec.generation.engine_stats import EngineStats, add_stats, kv_capacity_tokens, server_counters

    metrics = "\n".join(
        [
            "# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.",
            'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0',
            'vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 60.0',
            'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 300.0',
            'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 175.0',
            'vllm:spec_decode_num_accepted_tokens_created{engine="0",model_name="m"} 1.7e9',
            'vllm:generation_tokens_total{engine="0",model_name="m"} 999.0',
            'vllm:num_preemptions_total{engine="0",model_name="m"} 3.0',
            'vllm:num_preemptions_total{engine="1",model_name="m"} 4.0',
            'vllm:cache_config_info{block_size="128",engine="0",kv_cache_size_tokens="1408",num_gpu_blocks="11"} 1.0',
            'vllm:cache_config_info{block_size="128",engine="1",kv_cache_size_tokens="1280",num_gpu_blocks="10"} 1.0',
        ]
    )
    assert server_counters(metrics) == EngineStats(drafts=100, draft_tokens=300, accepted_tokens=175, preemptions=7)
    assert kv_capacity_tokens(metrics) == 1280
    started = EngineStats(starts=1, startup_s=100.0, load_s=60.0, warmup_s=30.0, kv_capacity_tokens=1280)
    store = tmp_path / "generations" / "tiny" / "store"
    add_stats(store, "1-of-2", EngineStats(decoded_tokens=1000, generate_s=10.0) + started + server_counters(metrics))
    resumed = EngineStats(decoded_tokens=500, generate_s=5.0, starts=1, startup_s=50.0, load_s=30.0, warmup_s=10.0)
    add_stats(store, "1-of-2", resumed)  # the shard resumed: its server's KV pool not read this time
    add_stats(store, "2-of-2", EngineStats(decoded_tokens=1500, generate_s=15.0))
    row = model_status(prepare(copy.deepcopy(tiny_raw_config)), "tiny", tmp_path)
    assert row.tokens_per_s == pytest.approx(100.0)
    assert row.spec_acceptance == pytest.approx(175 / 300) and row.spec_mean_length == pytest.approx(2.75)
    assert (row.preemptions, row.starts, row.startup_s, row.load_s, row.warmup_s) == (7, 2, 75.0, 45.0, 20.0)
    assert row.kv_capacity_tokens == 1280 and row.kv_sequences == pytest.approx(1280 / 768)  # tiny: max_model_len 768
    assert "58% x2.75" in format_table([row]).splitlines()[1]
    assert format_table([row]).splitlines()[1].split()[-4:] == ["7", "75", "(45/20)", "1.7"]
    (store / "stats" / "2-of-2.json").write_text('{"decoded_tokens": NaN}')  # left out, with one warning line
    row = model_status(prepare(copy.deepcopy(tiny_raw_config)), "tiny", tmp_path)
    assert row.tokens_per_s == pytest.approx(100.0) and row.spec_acceptance == pytest.approx(175 / 300)


def test_a_shards_runtime_holds_the_start_up_the_pilot_measured_not_a_fixed_allowance(raw, tmp_path):
    """The runtime asked of SLURM is 1.5 x (start-up + decode): a pilot whose engines took an hour to start
    (a slow filesystem) gives each shard 1.5 x that hour more than one whose engines started in a minute, and
    the stated start-up (checkpoint over the filesystem, warm-up) stands before a pilot measured one."""
    from procexec.cluster.cost.catalog import load_architecture
    from procexec.cluster.cost.runtime import startup_seconds
    from procexec.generation.engine_stats import EngineStats, add_stats

    full = study(raw)
    shards = full.models["qw-4"].shards
    runtimes = {}
    for startup in (60.0, 3600.0):
        results = _pilot_store(tmp_path / str(startup), "qw-4", 3000)
        add_stats(results / "generations" / "qw-4" / "store", "pilot-1-of-1", EngineStats(starts=1, startup_s=startup))
        assert full.projection("qw-4", results).startup_s == startup
        runtimes[startup] = full.infer_runtime("qw-4", shards, results)
    assert runtimes[3600.0] - runtimes[60.0] == pytest.approx(1.5 * 59, abs=1)
    ds685 = full.config.models["ds-685"]
    stated = startup_seconds(ds685, load_architecture())
    assert stated > 15 * 60  # its checkpoint alone reads for longer than the old fixed 15 minutes
    assert full.infer_runtime("ds-685", 10**6, tmp_path / "absent") == round(1.5 * stated / 60)  # decode ~0

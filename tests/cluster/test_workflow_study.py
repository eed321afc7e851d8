"""procexec.cluster.workflow: what the workflow derives from the config, tested without Snakemake."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from procexec.cluster.workflow import (
    ANALYSIS_ENV,
    INFERENCE_ENV,
    Study,
    merged_config_path,
    missing_environments,
    placement_line,
    write_merged_config,
)
from procexec.config import read_yaml
from procexec.errors import ProcexecError

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def raw() -> dict:
    return read_yaml(REPO / "config.yaml")


def test_the_full_study(raw):
    study = Study.from_config(copy.deepcopy(raw))
    assert len(study.datasets) == 55 and len(study.run_models) == 15
    assert study.prompt_example == f"{study.datasets[0]}:5:0"
    assert study.in_process_models and not study.endpoint_models
    shards = sum(study.models[m].shards for m in study.run_models)
    assert len(study.infer_benchmark_files()) == shards  # exactly the shards the report sums
    assert len(study.score_files()) == 55 * 15 == len(study.generation_files())
    assert study.shard_ids("qw-4") == [
        f"{i}-of-{study.models['qw-4'].shards}" for i in range(1, study.models["qw-4"].shards + 1)
    ]
    assert study.config_file == merged_config_path(raw) and not study.config_file.exists()


def test_a_models_settings_move_only_with_what_decides_its_generations(raw):
    base = Study.from_config(copy.deepcopy(raw))
    changed = copy.deepcopy(raw)
    changed["models"]["qw-4"].update(gpus=4, shards=9, checkpoint_gb=1.0, abbrev="Q")
    changed["models"]["qw-14"]["max_new_tokens"] = 7  # another model: never this one's business
    changed["models"]["new"] = {**raw["models"]["qw-4"], "abbrev": "NEW"}
    changed["run_models"] = [*raw["run_models"], "new"]
    other = Study.from_config(changed)
    assert other.model_settings("qw-4") == base.model_settings("qw-4")
    assert other.prompt_settings("qw-4") == base.prompt_settings("qw-4")
    assert other.check_settings("qw-4") == base.check_settings("qw-4")
    sampled = copy.deepcopy(raw)
    sampled["models"]["qw-4"]["max_new_tokens"] = 1000
    assert Study.from_config(sampled).model_settings("qw-4") != base.model_settings("qw-4")
    assert Study.from_config(sampled).prompt_settings("qw-4") == base.prompt_settings("qw-4")


def test_a_job_asking_more_host_memory_than_a_node_has_is_refused(raw, tmp_path):
    study = Study.from_config(copy.deepcopy(raw))
    assert study.host_memory_refusal() is None  # config.yaml's nodes hold every model's job
    asked = max(study.infer_mem_mb(m, tmp_path / "absent.json") for m in study.run_models) / 1000
    largest = [m for m in study.run_models if study.infer_mem_mb(m, tmp_path / "absent.json") / 1000 == asked]
    assert largest == ["ds-685"]
    small = {**copy.deepcopy(raw), "cluster": {**raw["cluster"], "node_mem_gb": asked - 1}}
    refusal = Study.from_config(small).host_memory_refusal()
    assert refusal.startswith(f"models.ds-685: a generation job asks {asked:,.0f} GB") and "\n" not in refusal
    assert f"cluster.node_mem_gb {asked - 1:,}" in refusal
    unset = {**copy.deepcopy(raw), "cluster": {k: v for k, v in raw["cluster"].items() if k != "node_mem_gb"}}
    assert Study.from_config(unset).host_memory_refusal() is None  # no node size: nothing to check against


def test_resources_follow_the_site_settings(raw, tmp_path):
    study = Study.from_config(copy.deepcopy(raw))
    assert study.gpus("ds-685") == 8 and study.infer_threads("ds-685") == 8 * study.cluster.cpus_per_gpu
    from procexec.preparation.prepare import MANIFEST_VERSION

    manifest = tmp_path / "manifest.json"
    staged = {
        "manifest_version": MANIFEST_VERSION,
        "model": "qw-4",
        "source": "hf",
        "hf_id": "Qwen/Qwen3-4B",
        "revision": "main",
        "commit": None,
        "model_dir": "hf",
        "procexec_version": "0",
        "transformers_version": "0",
        "files": {"a": {"size": 40_000_000_000, "sha256": "0" * 64}, "b": {"size": 20_000_000_000, "sha256": "1" * 64}},
    }
    manifest.write_text(json.dumps(staged))
    assert study.infer_mem_mb("qw-4", manifest) == int(study.cluster.mem_per_checkpoint * 60 * 1000)
    before = study.infer_mem_mb("qw-4", tmp_path / "not-staged-yet.json")  # checkpoint_gb before staging
    assert before >= study.cluster.min_mem_gb * 1000
    # a manifest that is not one (a size of 1e400 reads as infinity) sizes the job as before staging
    manifest.write_text(json.dumps(staged).replace("40000000000", "1e400"))
    assert study.infer_mem_mb("qw-4", manifest) == before
    assert 30 <= study.infer_runtime("qw-4", 4) <= study.cluster.max_runtime_minutes
    assert study.cpu_group("score") is None and "score" in study.local_cpu_rules()


def test_a_bad_config_is_one_error(raw):
    bad = copy.deepcopy(raw)
    bad["suite"]["families"] = {}
    with pytest.raises(ProcexecError, match="suite.families"):
        Study.from_config(bad)


def test_the_merged_config_is_written_once_per_content(raw, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_merged_config(raw)
    assert path == merged_config_path(raw) and yaml.safe_load(path.read_text()) == raw
    mtime = path.stat().st_mtime_ns
    assert write_merged_config(raw) == path and path.stat().st_mtime_ns == mtime
    assert merged_config_path({**raw, "run_models": ["qw-4"]}) != path
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary left


def test_a_missing_environment_is_named(tmp_path):
    assert missing_environments(REPO) == []
    (tmp_path / "rules").mkdir()
    (tmp_path / "envs").mkdir()
    (tmp_path / "envs" / "analysis.yaml").write_text("name: x\n")
    assert missing_environments(tmp_path) == [INFERENCE_ENV]
    assert ANALYSIS_ENV not in missing_environments(tmp_path)


def test_placement_line():
    line = placement_line([("infer", False), ("score", True), ("all", True)])
    assert line == "procexec workflow: submit host: all, score; cluster jobs: infer"


def test_a_new_truncation_check_reruns_the_inference_jobs(raw, monkeypatch):
    """Which attempts 1 get a rerun is decided by scoring's versioned check: a new version must reach
    every model's rerun params (the store keeps the generations, the jobs re-decide)."""
    import procexec.cluster.workflow as workflow

    study = Study.from_config(copy.deepcopy(raw))
    before = {m: (study.model_settings(m), study.prompt_settings(m)) for m in study.run_models}
    monkeypatch.setattr(workflow, "TRUNCATION_CHECK_VERSION", workflow.TRUNCATION_CHECK_VERSION + 1)
    for m, (settings, prompt) in before.items():
        assert study.model_settings(m) != settings and study.prompt_settings(m) == prompt


def test_every_shard_of_the_study_fits_the_partitions_time_limit(raw):
    """Shard counts are set so that each shard's projected runtime (with its 1.5x margin) stays under the
    limit: a capped runtime would mean every shard is stopped and resumed at least once."""
    study = Study.from_config(copy.deepcopy(raw))
    limit = study.cluster.max_runtime_minutes
    runtimes = {m: study.infer_runtime(m, study.models[m].shards) for m in study.run_models}
    assert all(minutes < limit for minutes in runtimes.values()), runtimes
    # the 8-GPU models run on several nodes at once
    assert all(study.models[m].shards > 1 for m in study.run_models if study.gpus(m) == 8)


def test_an_imported_model_gets_the_import_rule_only_and_its_scores_reach_the_report(raw, tmp_path):
    """No staging, prompt, check, shard or GPU for a model evaluated elsewhere: its logs are the import's inputs
    (a glob as matched, sorted), its generations and scores are the study's, and every stage reads them as they are."""
    logs = tmp_path / "logs"
    logs.mkdir()
    date = "2026-08-22T10-11-12.123456"  # lm-eval's names: one run's samples and its results file
    for name in (f"samples_b_{date}.jsonl", f"samples_a_{date}.jsonl", f"results_{date}.json"):
        (logs / name).write_text("{}\n")
    entry = {"backend": "imported", "abbrev": "IMP", "hf_id": "org/m", "lm_eval": [f"{logs}/samples_*.jsonl"]}
    with_imported = {**copy.deepcopy(raw), "run_models": ["qw-4", "imported"]}
    with_imported["models"]["imported"] = entry
    study = Study.from_config(copy.deepcopy(with_imported))
    assert study.imported_models == ["imported"] and study.generated_models == ["qw-4"]
    assert "imported" not in study.in_process_models + study.endpoint_models
    assert study.harness_logs("imported") == [f"{logs}/samples_a_{date}.jsonl", f"{logs}/samples_b_{date}.jsonl"]
    assert study.harness_run_files("imported") == []  # read with model_dir only
    assert study.import_options("imported") == "--lm-eval"
    assert not [f for f in study.prompt_files() + study.infer_benchmark_files() if "imported" in f]
    assert len([f for f in study.score_files() if "/imported/" in f]) == 55
    assert "imported" not in study.lock_generations  # never staged, never locked
    checked = copy.deepcopy(with_imported)
    checked["models"]["imported"]["model_dir"] = str(tmp_path / "a model")
    (tmp_path / "a model").mkdir()
    assert Study.from_config(checked).import_options("imported") == f"--model-dir '{tmp_path}/a model' --lm-eval"
    assert Study.from_config(checked).harness_run_files("imported") == [f"{logs}/results_{date}.json"]
    for stage in ("smoke", "pilot"):  # the stage's rewrite leaves the imported entry as written
        staged = Study.from_config({**copy.deepcopy(with_imported), "stage": stage})
        assert staged.raw["models"]["imported"] == entry and staged.imported_models == ["imported"]


def test_a_layout_over_several_nodes_is_one_job_over_them(raw, tmp_path):
    """On H100s DS-685 and KK-1T span nodes (procexec.cluster.layouts): one job asks its nodes, one task and the
    GPUs per node (the plugin's --gres; no --gpus, which counts the whole job), CPUs and host memory per node, and
    its shell runs the head in a step of its own on the first node; a one-node model's job is as on H200."""
    on_h100 = copy.deepcopy(raw)
    on_h100["cluster"]["hardware"] = "h100"
    study, h200 = Study.from_config(on_h100), Study.from_config(copy.deepcopy(raw))
    absent = tmp_path / "absent.json"
    for model in ("ds-685", "kk-1t"):
        nodes, per_node = study.nodes(model), study.node_gpus(model)
        assert nodes >= 2 and per_node == 8 and study.gpus(model) == nodes * per_node
        assert study.job_gpus(model) == 0 and study.gpu_type(model) == ""  # no --gpus=TYPE:N for the whole job
        assert study.gres(model) == "gpu:h100:8" and study.tasks(model) == nodes and study.tasks_per_gpu(model) == 0
        assert study.mpi(model) == "srun"
        assert study.head_step(model).startswith("srun --nodes=1 --ntasks=1 --relative=0 --gres=gpu:8 --mem=0")
        assert study.infer_threads(model) == 8 * study.cluster.cpus_per_gpu  # per node, as on one node
        checkpoint = study.models[model].checkpoint_gb * study.cluster.mem_per_checkpoint
        assert study.infer_mem_mb(model, absent) == int(max(study.cluster.min_mem_gb, checkpoint / nodes) * 1000)
    for model in study.run_models:
        if study.nodes(model) == 1:
            assert study.gres(model) is None and study.tasks(model) is None and study.mpi(model) is None
            assert study.head_step(model) == "" and study.job_gpus(model) == study.gpus(model)
            assert study.gpu_type(model) == "h100"
    for model in h200.run_models:  # on H200 every job is one node, as before
        assert h200.nodes(model) == 1 and h200.mpi(model) is None and h200.gpu_type(model) == "h200"

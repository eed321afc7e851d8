"""workflow_scripts/gpu_lease.py and the local profiles (local-gpus, cpu-demo).

No GPU and no SLURM needed: the lease only hands out ids, so fake ids work.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import yaml

from workflow_runs import dry_run_jobs

REPO = Path(__file__).resolve().parents[2]
LEASE = REPO / "workflow_scripts" / "gpu_lease.py"
MINI = REPO / "tests" / "data" / "slurm_mini"

PRINT_CVD = [sys.executable, "-c", "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))"]


def _env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PROCEXEC_GPU_POOL", "PROCEXEC_GPU_IDS", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID")
    }
    env.update(extra)
    return env


def _lease(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(LEASE), *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_lease_sets_cuda_visible_devices(tmp_path):
    env = _env(PROCEXEC_GPU_POOL=str(tmp_path / "pool"), PROCEXEC_GPU_IDS="0,1,2,3")
    res = _lease("--gpus", "2", "--", *PRINT_CVD, env=env)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "'0,1'"
    res = _lease("--gpus", "0", "--", *PRINT_CVD, env=env)
    assert res.stdout.strip() == "''"


def test_lease_pass_through_without_pool_or_inside_slurm(tmp_path):
    res = _lease("--gpus", "8", "--", *PRINT_CVD, env=_env())
    assert res.returncode == 0 and res.stdout.strip() == "None", res.stderr
    env = _env(PROCEXEC_GPU_POOL=str(tmp_path / "pool"), SLURM_JOB_ID="42", CUDA_VISIBLE_DEVICES="5")
    res = _lease("--gpus", "1", "--", *PRINT_CVD, env=env)
    assert res.stdout.strip() == "'5'"


def test_lease_errors_and_exit_status(tmp_path):
    env = _env(PROCEXEC_GPU_POOL=str(tmp_path / "pool"), PROCEXEC_GPU_IDS="0,1")
    res = _lease("--gpus", "3", "--", "true", env=env)
    assert res.returncode == 2 and "pool has 2" in res.stderr
    res = _lease("--gpus", "1", "--", sys.executable, "-c", "raise SystemExit(7)", env=env)
    assert res.returncode == 7


def test_lease_waits_and_times_out(tmp_path):
    env = _env(PROCEXEC_GPU_POOL=str(tmp_path / "pool"), PROCEXEC_GPU_IDS="0")
    holder = subprocess.Popen([sys.executable, str(LEASE), "--gpus", "1", "--", "sleep", "3"], env=env)
    try:
        time.sleep(0.5)
        status = _lease("--status", env=env)
        assert status.stdout.startswith("0\tleased"), status.stdout
        res = _lease("--gpus", "1", "--timeout", "0.5", "--poll", "0.1", "--", "true", env=env)
        assert res.returncode == 3 and "timed out" in res.stderr
        res = _lease("--gpus", "1", "--poll", "0.1", "--", *PRINT_CVD, env=env)  # waits for holder
        assert res.returncode == 0 and res.stdout.strip() == "'0'"
    finally:
        holder.wait(timeout=10)


def test_concurrent_leases_never_share_a_gpu(tmp_path):
    pool_ids = ["0", "1", "2"]
    env = _env(PROCEXEC_GPU_POOL=str(tmp_path / "pool"), PROCEXEC_GPU_IDS=",".join(pool_ids))
    script = (
        "import os, sys, time; t0 = time.time(); time.sleep(0.4); "
        "print(os.environ['CUDA_VISIBLE_DEVICES'], t0, time.time())"
    )
    needs = [2, 1, 2, 1, 3, 1]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(LEASE),
                "--gpus",
                str(n),
                "--poll",
                "0.05",
                "--quiet",
                "--",
                sys.executable,
                "-c",
                script,
            ],
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in needs
    ]
    spans = []
    for n, p in zip(needs, procs):
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        ids, t0, t1 = out.split()
        ids = ids.split(",")
        assert len(ids) == n and set(ids) <= set(pool_ids)
        spans.append((set(ids), float(t0), float(t1)))
    for i, (ids_a, a0, a1) in enumerate(spans):
        for ids_b, b0, b1 in spans[i + 1 :]:
            if ids_a & ids_b:
                assert a1 <= b0 or b1 <= a0, "two jobs held the same GPU at once"


def _run_profile(profile: str, workdir: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--profile",
            profile,
            "--snakefile",
            str(MINI / "Snakefile"),
            "--directory",
            str(workdir),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _dump(path: Path) -> dict[str, str]:
    return dict(re.findall(r"(\w[\w:]*)=(\S*)", path.read_text().strip()))


@pytest.mark.workflow
def test_local_gpus_profile_gives_each_job_its_gpus(tmp_path):
    models = yaml.safe_load((MINI / "config.yaml").read_text())["models"]
    pool_ids = {"0", "1", "2"}
    env = _env(PROCEXEC_GPU_POOL=str(tmp_path / "pool"), PROCEXEC_GPU_IDS=",".join(sorted(pool_ids)))
    res = _run_profile("local-gpus", tmp_path / "run", env)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    for key, spec in models.items():
        got = _dump(tmp_path / "run" / "infer" / f"{key}.txt")
        devices = [d for d in got["CUDA_VISIBLE_DEVICES"].split(",") if d]
        assert len(devices) == spec["gpus"] and set(devices) <= pool_ids, (key, got)


@pytest.mark.workflow
def test_cpu_demo_profile_plans_the_demo_on_the_real_workflow(tmp_path):
    """`make demo`'s command, dry: the real Snakefile under the cpu-demo profile with config/demo.yaml.

    Every stage from the datasets to the report is planned for the demo's datasets and model, and no job asks
    for a GPU (the demo runs on vLLM's CPU engine).
    """
    from procexec.config import load_merged

    demo = load_merged([REPO / "config.yaml", REPO / "config" / "demo.yaml"])
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--profile",
            "cpu-demo",
            "--configfile",
            str(REPO / "config" / "demo.yaml"),
            "--dry-run",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp_path),
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    jobs = dry_run_jobs(out)
    planned = Counter(job["rule"] for job in jobs)
    datasets, models = len(demo.suite.datasets), len(demo.run_models)
    shards = sum(demo.models[m].shards for m in demo.run_models)
    assert planned == Counter(
        generate=datasets,
        execute=datasets,
        card=1,
        table4=1,
        prepare_model=models,
        check_model=models,
        show_prompt=models,
        infer=shards,
        collect=models,
        score=datasets * models,
        aggregate=1,
        figures=1,
        tables=1,
        report=1,
        all=1,
    ), out[-3000:]
    assert all(int(job["resources"].get("gpu", 0)) == 0 for job in jobs), out[-3000:]


@pytest.mark.workflow
def test_h200_profile_on_real_workflow_submits_only_inference_shards(tmp_path):
    """Dry run of the real workflow (config.yaml, the paper's 15 models) through the h200 profile.

    Exactly the 130 shards (`infer` jobs) are cluster jobs (everything else runs on the
    submit host); each asks for its model's GPUs of type h200 on one node, CPUs
    per GPU, host memory by checkpoint size and a runtime within the partition's
    limit; no other job carries a GPU request.
    """
    from procexec.cluster.layouts import load_planned

    config = load_planned([REPO / "config.yaml"])
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--profile",
            "h200",
            "--dry-run",
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp_path),
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-3000:]
    placement = re.search(r"procexec workflow: submit host: (.*); cluster jobs: (.*)", out)
    # the pilot's speculative half (pilot_speculative) holds GPUs too; the full stage plans none of its jobs
    assert placement and placement.group(2).split(", ") == ["infer", "infer_speculative"], out[:2000]
    jobs = dry_run_jobs(out)
    cluster = [j for j in jobs if j["rule"] == "infer"]
    assert len(cluster) == 130 == sum(config.models[m].shards for m in config.run_models)
    cluster_ = config.cluster
    for job in jobs:
        res_ = job["resources"]
        model = job["wildcards"].get("model")
        if job["rule"] != "infer":
            assert "gpu" not in res_ or int(res_["gpu"]) == 0, job
            assert not res_.get("gpu_model"), job
            continue
        spec = config.models[model]
        assert res_["slurm_partition"] == "gpu" and int(res_["nodes"]) == 1, job
        assert int(res_["gpu"]) == spec.gpus and res_["gpu_model"] == "h200", job
        assert res_["slurm_extra"] == "--signal=TERM@120", job
        assert 30 <= int(res_["runtime"]) <= cluster_.max_runtime_minutes, job
        expected_mem = max(cluster_.min_mem_gb, cluster_.mem_per_checkpoint * spec.checkpoint_gb) * 1000
        assert int(res_["mem_mb"]) == int(expected_mem), job
    # the GPU type is optional: none named, the plugin asks --gpus=N
    (tmp_path / "untyped.yaml").write_text("cluster: {gpu_type: null}\n")
    untyped = subprocess.run(
        [
            sys.executable,
            "-m",
            "snakemake",
            "--profile",
            "h200",
            "--dry-run",
            "--configfile",
            str(tmp_path / "untyped.yaml"),
            "--snakefile",
            str(REPO / "Snakefile"),
            "--directory",
            str(tmp_path),
        ],
        cwd=REPO,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert untyped.returncode == 0, untyped.stderr[-2000:]
    assert all(not j["resources"].get("gpu_model") for j in dry_run_jobs(untyped.stdout + untyped.stderr))

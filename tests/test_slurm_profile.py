"""The `h200` profile end to end on a real (single-node) SLURM with fake GPUs.

Runs tests/data/slurm_mini (a stand-in whose inference rule derives its GPU
count from config exactly like the real one) through `snakemake --profile
h200`, with only the site specifics overridden (partition, memory, no
account), and checks that every SLURM job asked for, and got, the GPUs the
config says: the sbatch command lines (`--gpus=h200:N`), SLURM's own record
(`scontrol show job`: TresPerJob=gres:gpu:h200:N) and the CUDA_VISIBLE_DEVICES
each job saw.  CPU jobs must get no GPU.

Needs root (it installs/starts SLURM via .ci/slurm-setup.sh, idempotent and
~0.1 s when the cluster already runs).  Skipped when not root or when
PROCEXEC_SKIP_SLURM=1.  Takes ~1-1.5 min.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
STEADY_POLLING = Path(__file__).with_name("snakemake_steady_polling.py")  # the plugin's back-off off
MINI = REPO / "tests" / "data" / "slurm_mini"
SETUP = REPO / ".ci" / "slurm-setup.sh"
PARTITION = os.environ.get("PROCEXEC_SLURM_PARTITION", "gpu")
GPU_TYPE = os.environ.get("PROCEXEC_SLURM_GPU_TYPE", "h200")

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.skipif(
        not hasattr(os, "geteuid") or os.geteuid() != 0,
        reason="needs root to start a SLURM cluster",
    ),
    pytest.mark.skipif(os.environ.get("PROCEXEC_SKIP_SLURM") == "1", reason="PROCEXEC_SKIP_SLURM=1"),
]


@pytest.fixture(scope="module")
def slurm_cluster():
    """Make sure the CI cluster runs (installs packages on first use)."""
    res = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=600)
    print(res.stdout, res.stderr, sep="\n")
    assert res.returncode == 0, f"slurm-setup.sh failed:\n{res.stdout}\n{res.stderr}"
    return res.stdout


def _snakemake(*args: str, cwd: Path, timeout: int) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(STEADY_POLLING), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _parse_dump(path: Path) -> dict[str, str]:
    fields = dict(re.findall(r"(\w[\w:]*)=(\S*)", path.read_text().strip()))
    return fields


def _cancel(log: str) -> None:
    ids = re.findall(r"with SLURM jobid (\d+)", log)
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True)


def test_h200_profile_requests_config_gpu_counts(slurm_cluster, tmp_path):
    models = yaml.safe_load((MINI / "config.yaml").read_text())["models"]
    workdir = tmp_path / "run"
    workdir.mkdir()
    args = [
        # literally the repository's profile, looked up as ./h200 from the repo root
        "--profile",
        "h200",
        "--snakefile",
        str(MINI / "Snakefile"),
        "--directory",
        str(workdir),
        # site specifics: a CLI option replaces the profile's whole key
        "--default-resources",
        f"slurm_partition={PARTITION}",
        "runtime=10",
        "mem_mb=500",
        "--set-resources",
        "infer:runtime=10",
        "infer:mem_mb=500",  # the profile's are sized for H200 nodes
        "--config",
        f"gpu_model={GPU_TYPE}",
        "--slurm-no-account",  # no slurmdbd here
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--seconds-between-status-checks",
        "2",  # CI speed
        "--verbose",  # logs each sbatch command line
    ]
    log = ""
    try:
        res = _snakemake(*args, cwd=REPO, timeout=300)
        log = res.stdout + res.stderr
        (tmp_path / "snakemake.log").write_text(log)
    except subprocess.TimeoutExpired as exc:
        out = exc.stdout or ""
        log = out.decode() if isinstance(out, bytes) else out
        _cancel(log)
        raise AssertionError(f"snakemake timed out; log tail:\n{log[-4000:]}") from None
    if res.returncode != 0:
        _cancel(log)
    assert res.returncode == 0, f"snakemake failed; log tail:\n{log[-6000:]}"

    # The status of jobs was polled with squeue (sacct would hang: no slurmdbd).
    assert "command=squeue" in log

    # 1. What Snakemake asked SLURM for: one sbatch line per job.
    calls = re.findall(r"sbatch call: (sbatch .*)", log)
    by_comment = {}
    for call in calls:
        m = re.search(r"--comment (\S+)", call)
        assert m, call
        by_comment[m.group(1)] = call
    assert set(by_comment) == {"rule_prep"} | {f"rule_infer_wildcards_{m}" for m in models}, sorted(by_comment)
    for call in by_comment.values():
        assert f"-p {PARTITION}" in call, call
    assert "--gpus" not in by_comment["rule_prep"]
    for key, spec in models.items():
        call = by_comment[f"rule_infer_wildcards_{key}"]
        gpus = re.findall(r"--gpus=(\S+)", call)
        if spec["gpus"] > 0:
            assert gpus == [f"{GPU_TYPE}:{spec['gpus']}"], call
        else:
            assert gpus == [], call

    # 2. What each job got: its own dump of the environment.
    for key, spec in models.items():
        env = _parse_dump(workdir / "infer" / f"{key}.txt")
        assert env["job"] == f"infer:{key}"
        assert env["SLURM_JOB_ID"], env
        devices = [d for d in env["CUDA_VISIBLE_DEVICES"].split(",") if d]
        assert len(devices) == spec["gpus"], (key, env)
        assert env["tp"] == str(spec["tensor_parallel_size"])
        # 3. SLURM's record of the job (kept MinJobAge=600 s after it ends).
        show = subprocess.run(
            ["scontrol", "show", "job", env["SLURM_JOB_ID"]],
            capture_output=True,
            text=True,
        ).stdout
        if show:
            assert f"Partition={PARTITION}" in show
            tres = re.search(r"TresPerJob=(\S+)", show)
            if spec["gpus"] > 0:
                assert tres and tres.group(1) == f"gres:gpu:{GPU_TYPE}:{spec['gpus']}", show
            else:
                assert tres is None or "gpu" not in tres.group(1), show
    prep = _parse_dump(workdir / "prep.txt")
    assert prep["SLURM_JOB_ID"] and prep["CUDA_VISIBLE_DEVICES"] == "", prep

    # The SLURM logs are kept (profile: slurm-keep-successful-logs).
    assert list((workdir / ".snakemake" / "slurm_logs").rglob("*.log"))

    # Rerunning through the profile finds nothing to do (no spurious GPU work).
    dry = _snakemake(*args[:-1], "--dry-run", cwd=REPO, timeout=120)
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "Nothing to be done" in dry.stdout + dry.stderr, dry.stdout + dry.stderr

"""The real workflow through `--profile h200` on the real single-node SLURM that CI starts.

config/test-tiny.yaml (the tiny Llama on vLLM's CPU engine) with only the test
cluster's site settings overridden (memory, no account), and the model read from
the session's tiny Llama folder (source: path).  One run of each
kind, as they cost minutes: `scancel` mid-run with cluster.cpu_jobs: grouped
(the shard plus two group jobs submitted), then a rerun with the CPU jobs on
the submit host (exactly the shards submitted, progress lines in
each `infer` log, each example once, earlier records untouched, no
temporary files), every result file following the umask 002.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from store_view import stored_keys, stored_records
from workflow_runs import ONE_ENGINE_THREAD, check_modes

REPO = Path(__file__).resolve().parents[2]
STEADY_POLLING = Path(__file__).parents[1] / "snakemake_steady_polling.py"  # the plugin's back-off off
TINY = REPO / "config" / "test-tiny.yaml"
SETUP = REPO / ".ci" / "slurm-setup.sh"

pytestmark = [
    pytest.mark.slurm,
    pytest.mark.vllm,
    pytest.mark.workflow,
    pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to start a SLURM cluster"),
    pytest.mark.skipif(os.environ.get("PROCEXEC_SKIP_SLURM") == "1", reason="PROCEXEC_SKIP_SLURM=1"),
]


@pytest.fixture(scope="module")
def slurm_cluster():
    res = subprocess.run(["bash", str(SETUP)], capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, f"slurm-setup.sh failed:\n{res.stdout}\n{res.stderr}"


def snakemake(workdir: Path, overlays: list[Path], *extra: str, umask: int = 0o022, wait: bool = True):
    """`snakemake --profile h200` on the tiny config, with the test cluster's site settings."""
    cmd = [
        sys.executable,
        str(STEADY_POLLING),
        "--profile",
        "h200",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(workdir),
        "--configfile",
        str(TINY),
        *map(str, overlays),
        # the CI node has ~23 GB: the rule's 32 GB floor for a generation job does not fit it
        "--set-resources",
        "infer:mem_mb=3000",
        "infer:slurm_partition=gpu",
        "--default-resources",
        "slurm_partition=gpu",
        "runtime=20",
        "mem_mb=2000",
        "--slurm-no-account",
        "--slurm-init-seconds-before-status-checks",
        "2",
        "--seconds-between-status-checks",
        "2",
        *ONE_ENGINE_THREAD,  # one OpenMP thread per engine (tests/workflow_runs.py)
        "--verbose",
        *extra,
    ]  # CI speed: poll squeue every 2 s
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: os.umask(umask),
    )
    if not wait:
        return proc
    out, _ = proc.communicate(timeout=1500)
    return proc.returncode, out


def sbatch_rules(log: str) -> list[str]:
    """The rule (or group) of every sbatch call, from the plugin's --comment."""
    calls = re.findall(r"sbatch call: (sbatch .*)", log)
    return sorted(re.search(r"--comment '?(\S+?)'?(?: |$)", c).group(1) for c in calls)


def overlay(tmp_path: Path, name: str, data: dict) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return path


def test_scancel_mid_run_then_the_workflow_again_resumes_exactly(slurm_cluster, tiny_manifest, tmp_path):
    """Run 1 (CPU jobs grouped, one shard) is cancelled mid-generation; run 2 (CPU jobs on the submit host,
    two shards) submits exactly its shards and finishes from the store: each
    example once, the records from before the cancel untouched.  Everything under the group-writable
    umask 002 (the default 022 is checked on the local run in test_workflow.py)."""
    workdir = tmp_path / "run"
    workdir.mkdir()
    # slow enough to be cancelled mid-run; these settings are the store's key, so both runs keep them.  On an idle
    # CI box the tiny Llama decodes ~260 tokens/s (22 under load): 160 tokens a generation left the job's last six
    # to 1.5 s, less than squeue + scancel + SLURM's signal took, and the job finished before its cancel
    # The session's tiny Llama as a model folder (source path): staged, not built again (the build: test_workflow.py)
    slow = {
        "inference": {"max_new_tokens": 240, "store_commit_records": 1},
        "models": {
            "tiny-llama": {
                "engine_kwargs": {"max_num_seqs": 1},
                "source": "path",
                "path": str(tiny_manifest.parent / "hf"),
            }
        },
    }
    grouped = overlay(
        tmp_path,
        "grouped.yaml",
        {
            **slow,
            "models": {"tiny-llama": {**slow["models"]["tiny-llama"], "shards": 1}},
            "cluster": {"cpu_jobs": "grouped"},
        },
    )
    # as far as the generations: the resume is what is under test (the analysis after them is another test's)
    generations = [f"results/generations/tiny-llama/{ds}.jsonl.gz" for ds in ("add_int_1-10_k1", "mixed_float_0-1_k2")]
    proc = snakemake(workdir, [grouped], *generations, umask=0o002, wait=False)
    store = workdir / "results" / "generations" / "tiny-llama" / "store"
    deadline, job_id = time.monotonic() + 900, None
    while time.monotonic() < deadline and proc.poll() is None:
        if job_id is None:  # found while the engine starts, so the cancel waits for no squeue
            # this run's own generation job (another test module may have jobs on the cluster too)
            queue = subprocess.run(["squeue", "-h", "-o", "%i|%k|%Z"], capture_output=True, text=True).stdout
            job_id = next(
                (
                    line.split("|")[0]
                    for line in queue.splitlines()
                    if "infer" in line and line.split("|")[-1].rstrip("/") == str(workdir)
                ),
                None,
            )
        if job_id and store.exists() and len(stored_keys(store)) >= 2:
            break
        time.sleep(0.05 if job_id else 0.2)
    assert job_id, "the generation job never ran long enough to be cancelled"
    subprocess.run(["scancel", job_id], check=True)
    out, _ = proc.communicate(timeout=900)
    assert proc.returncode != 0, out[-4000:]
    assert sbatch_rules(out) == ["rule_infer_wildcards_tiny-llama_1_1", "rule_suite_generate", "rule_suite_generate"], (
        sbatch_rules(out)
    )  # the CPU jobs as groups, beside the shard
    assert "localrule prepare_model:" in out  # the submit host's own
    before = stored_records(store)
    examples = 2 * 2 * 2  # datasets x lengths x examples per length (config/test-tiny.yaml)
    assert 2 <= len(before) < examples
    infer_log = (workdir / "logs" / "infer" / "tiny-llama" / "1-of-1.log").read_text()
    assert "interrupted" in infer_log, infer_log[-2000:]  # SIGTERM handled: it stopped, kept what finished
    leftovers = [p for p in workdir.rglob("*") if p.name.endswith(".tmp") or ".tmp." in p.name]
    assert not leftovers, leftovers

    sharded = {**slow, "models": {"tiny-llama": {**slow["models"]["tiny-llama"], "shards": 2}}}
    code, log = snakemake(workdir, [overlay(tmp_path, "sharded.yaml", sharded)], *generations, umask=0o002)
    assert code == 0, log[-6000:]
    after = stored_records(store)
    assert {k: after[k] for k in before} == before  # the records from before the cancel, byte for byte
    keys = stored_keys(store)
    assert len(keys) == len(set(keys)) == examples  # each example exactly once
    from procexec.io.jsonl import read_jsonl

    ids = [o["id"] for path in generations for _, o in read_jsonl(workdir / path)]
    assert len(ids) == len(set(ids)) == examples
    shards = 2
    assert sbatch_rules(log) == [f"rule_infer_wildcards_tiny-llama_{i}_{shards}" for i in range(1, shards + 1)], (
        sbatch_rules(log)
    )
    assert "localrule collect:" in log
    generated = 0
    for i in range(1, shards + 1):
        lines = (workdir / "logs" / "infer" / "tiny-llama" / f"{i}-of-{shards}.log").read_text()
        count = int(re.search(rf"tiny-llama shard {i}-of-{shards}: \d+ records, (\d+) generated", lines).group(1))
        progress = re.findall(
            rf"^\[procexec infer tiny-llama {i}-of-{shards}\] attempt 1: (\d+)/(\d+) done", lines, re.M
        )
        # a start and an end line (and one a minute between) for a shard with anything left to generate
        assert not count or len(progress) >= 2 and progress[-1] == (str(count), str(count)), lines[-2000:]
        generated += count
    assert generated == examples - len(before)  # exactly what the cancel left
    assert not [p for p in workdir.rglob("*") if p.name.endswith(".tmp")]
    check_modes(workdir / "results", 0o002)

"""The `h200` profile end to end on a real (single-node) SLURM with fake GPUs.

Runs tests/data/slurm_mini (a stand-in whose `infer` rule derives its GPU
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

import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import yaml

from workflow_runs import dry_run_jobs

REPO = Path(__file__).resolve().parents[2]
STEADY_POLLING = Path(__file__).parents[1] / "snakemake_steady_polling.py"  # the plugin's back-off off
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


MULTINODE = os.environ.get("PROCEXEC_SLURM_MULTINODE_PARTITION", "multinode")
NODES_ENV_NAME = "PROCEXEC_JOB_NODES"  # procexec.engine.multinode.NODES_ENV: a job under SLURM reads SLURM's


class _Resources(dict):
    """A job's resources as the plugin reads them: ``.get`` and attributes."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def test_jobs_over_several_nodes_are_planned_and_slurm_accepts_their_job_scripts(slurm_cluster, tmp_path):
    """`snakemake --profile slurm --config 'cluster={hardware: h100, ...}' -n` on the real workflow: DS-685 and
    KK-1T are jobs over several nodes (their node counts, one task and the GPUs per node, the head's step); the
    sbatch line of each, built by the SLURM plugin's own code from the dry run's resources, is accepted by the
    CI's SLURM (sbatch --test-only on its multi-node partition), and the one-node jobs are as on H200."""
    from snakemake_executor_plugin_slurm.submit_string import get_submit_command
    from snakemake_executor_plugin_slurm.utils import set_gres_string

    from procexec.cluster.layouts import planned
    from procexec.config import prepare, read_yaml

    raw = read_yaml(REPO / "config.yaml")
    raw["cluster"].update(hardware="h100", gpu_type=GPU_TYPE)  # the CI's nodes name their fake GPUs GPU_TYPE
    config = planned(prepare(raw))
    dry = _snakemake(
        "--profile",
        "slurm",
        "--dry-run",
        "--snakefile",
        str(REPO / "Snakefile"),
        "--directory",
        str(tmp_path),
        "--config",
        f"cluster={{hardware: h100, gpu_type: {GPU_TYPE}}}",
        "--set-resources",
        f"infer:slurm_partition={MULTINODE}",
        "infer:mem_mb=500",  # the CI's nodes are small; SLURM checks the rest of the request
        cwd=REPO,
        timeout=300,
    )
    out = dry.stdout + dry.stderr
    assert dry.returncode == 0, out[-3000:]
    jobs = [job for job in dry_run_jobs(out) if job["rule"] == "infer"]
    assert len(jobs) == sum(config.models[m].shards for m in config.run_models)
    spanning = {}
    for job in jobs:
        res, model = job["resources"], job["wildcards"]["model"]
        plan = config.plans[model]
        assert int(res["nodes"]) == plan.layout.nodes
        if plan.layout.nodes == 1:
            assert int(res["gpu"]) == config.models[model].gpus and res["gpu_model"] == GPU_TYPE, job
            assert not {"gres", "tasks", "mpi"} & res.keys(), job
            continue
        assert res["gres"] == f"gpu:{GPU_TYPE}:8" and int(res["tasks"]) == plan.layout.nodes, job
        assert res["mpi"] == "srun" and int(res["gpu"]) == 0 and int(res["tasks_per_gpu"]) == 0, job
        spanning.setdefault(model, job)
    assert sorted(spanning) == ["ds-685", "kk-1t"] and {config.plans[m].layout.nodes for m in spanning} == {3, 4}
    shell = re.findall(r"^Shell command: (.*)$", out, re.M)
    assert any("head='srun --nodes=1 --ntasks=1 --relative=0 --gres=gpu:8" in line for line in shell)
    for model, job in spanning.items():
        resources = _Resources({k: int(v) if v.lstrip("-").isdigit() else v for k, v in job["resources"].items()})
        submitted = types.SimpleNamespace(resources=resources, threads=1, name="infer", is_group=lambda: False)
        params = {
            "run_uuid": "procexec-test",
            "slurm_logfile": tmp_path / "%j.log",
            "comment_str": f"rule_infer_wildcards_{model}",
            "account": "",
            "partition": f"-p {MULTINODE}",
            "workdir": str(tmp_path),
        }
        call = get_submit_command(submitted, params) + set_gres_string(submitted)
        assert f"--nodes={resources['nodes']}" in call and f"--ntasks={resources['nodes']}" in call, call
        assert "--gpus" not in call and "--ntasks-per-gpu" not in call, call
        test = subprocess.run(
            [*shlex.split(call.replace("--parsable ", "")), "--test-only", "--wrap", "true"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert test.returncode == 0 and " to start at " in test.stderr, (call, test.stderr)
        assert f"on nodes {socket.gethostname().split('.')[0]}" in test.stderr, test.stderr


#: The head's side of a job over two nodes, with stand-ins for vLLM's processes: the launch read from the job's
#: SLURM environment, a listening "head", a follower started as a step on the second node and then stopped.
HEAD_STEP = """
import json, os, subprocess, sys, time
from pathlib import Path
from procexec.engine.multinode import plan_launch, start_followers

out = Path(sys.argv[1])
launch = plan_launch("standin", 2, 1, None)
head = subprocess.Popen(
    [sys.executable, "-c", "import socket, sys, time; s = socket.create_server((sys.argv[1], int(sys.argv[2]))); "
     "time.sleep(120)", launch.address, str(launch.rpc_port)],
    start_new_session=True,
)
follower = [sys.executable, "-c", "import os, time; print('follower on', os.environ['SLURMD_NODENAME'], 'step', "
            "os.environ['SLURM_STEP_ID'], flush=True); time.sleep(120)"]
followers, problem = start_followers(launch, follower, dict(os.environ), out / "x.server.log", head, 60)
for _ in range(100):
    if "follower on" in followers.log(1).read_text():
        break
    time.sleep(0.2)
followers.stop(grace_s=10)
head.kill()
result = {
    "hosts": launch.hosts, "under_slurm": launch.under_slurm, "problem": problem,
    "log": followers.log(1).read_text(), "code": followers.procs[0][1].returncode,
    "head_node": os.environ["SLURMD_NODENAME"], "head_step": os.environ.get("SLURM_STEP_ID"),
}
(out / "result.json").write_text(json.dumps(result))
"""


def test_a_job_over_two_nodes_starts_its_follower_as_a_step_on_the_second(slurm_cluster, tmp_path):
    """The launch's SLURM side on the CI's real SLURM (stand-ins for vLLM's processes): the head's step on the
    first node reads the job's nodes, its follower runs as a step of its own on the second node (a nested srun
    without the head step's variables), and stopping the follower ends that step."""
    (tmp_path / "head_step.py").write_text(HEAD_STEP)
    env = {**os.environ, "PYTHONPATH": f"{REPO / 'src'}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    env.pop(NODES_ENV_NAME, None)
    submitted = subprocess.run(
        [
            "sbatch",
            "--parsable",
            "-p",
            MULTINODE,
            "--nodes=2",
            "--ntasks=2",
            f"--gres=gpu:{GPU_TYPE}:8",
            "--mem=500",
            "-t",
            "5",
            "-o",
            str(tmp_path / "slurm.log"),
            "--wrap",
            f"srun --nodes=1 --ntasks=1 --relative=0 --gres=gpu:8 --mem=0 --kill-on-bad-exit=1 "
            f"{sys.executable} {tmp_path / 'head_step.py'} {tmp_path}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        for _ in range(600):
            if (tmp_path / "result.json").exists() or not subprocess.run(
                ["squeue", "-h", "-j", job], capture_output=True, text=True
            ).stdout.strip():
                break
            time.sleep(0.2)
        log = (tmp_path / "slurm.log").read_text() if (tmp_path / "slurm.log").exists() else ""
        assert (tmp_path / "result.json").exists(), log
    finally:
        subprocess.run(["scancel", job], capture_output=True)
    result = json.loads((tmp_path / "result.json").read_text())
    host = socket.gethostname().split(".")[0]
    assert result["hosts"] == [host, f"{host}-x1"] and result["under_slurm"] and result["problem"] is None
    assert result["head_node"] == host and result["head_step"] == "0"
    follower = re.search(r"follower on (\S+) step (\d+)", result["log"])
    assert follower and follower.group(1) == f"{host}-x1" and follower.group(2) != "0", result["log"]
    assert result["code"] is not None  # stopped with the job's server

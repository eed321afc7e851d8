"""Snakemake run from a test: the checkout's workflow in a scratch folder, its environment, its dry run read.

Shared by the workflow's own tests (tests/workflow/) and the tests of a stage that ends in a workflow run.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
SNAKEFILE = REPO / "Snakefile"
TINY = REPO / "config" / "test-tiny.yaml"
BIN = Path(sys.executable).parent
#: A real local run of the workflow in a test: two cores, and one thread per vLLM CPU engine.  Snakemake sets a job's
#: OMP_NUM_THREADS to its threads (2 for a CPU model's generation job, ``Study.infer_threads``); beside the other
#: test worker on a two-core machine, the engine's second OpenMP thread spins for a core it does not get (the smoke
#: stage's job: 45 CPU s, 20 with one thread, the same tokens: tests/conftest.py pins one thread for that reason).
ONE_ENGINE_THREAD = ("--set-threads", "infer=1", "infer_speculative=1")  # a list option: not right before targets
LOCAL_RUN = (*ONE_ENGINE_THREAD, "--cores", "2", "--scheduler", "greedy")


def workflow_env(**extra: str) -> dict[str, str]:
    """The environment a workflow run gets: this venv's commands first, no GPU lease or SLURM job inherited."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    for name in ("PROCEXEC_GPU_POOL", "PROCEXEC_GPU_IDS", "CUDA_VISIBLE_DEVICES", "SLURM_JOB_ID"):
        env.pop(name, None)
    env.update(extra)
    return env


def venv_tool(name: str) -> str:
    """A command of this venv (snakemake, procexec, snakefmt), else the one on PATH."""
    path = BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def snakemake(workdir: Path, *args: str, configfiles: list[Path] = (), timeout: int = 900, env=None):
    """``snakemake`` on the checkout's Snakefile in ``workdir`` (``--directory``: nothing written to the checkout).

    A dry run (``-n``) goes to the worker's dry-run process (``dry_run``); anything else is a process of its own."""
    cmd = [venv_tool("snakemake"), "-s", str(SNAKEFILE), "--directory", str(workdir), "--nocolor"]
    if configfiles:
        cmd += ["--configfile", *map(str, configfiles)]
    cmd += list(args)
    if "-n" in args:
        return dry_run(cmd, workdir, env or workflow_env())
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=env or workflow_env(),
        timeout=timeout,
        cwd=workdir,
        preexec_fn=lambda: os.umask(0o022),
    )  # the usual default, whatever the caller's


_dry_runs: list[subprocess.Popen] = []  # this worker's dry-run process, started by its first dry run


def dry_run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    """``cmd`` (a ``snakemake -n`` command line) run by one process per test worker that keeps Snakemake
    imported (tests/snakemake_dry_runs.py ``--serve``): a dry run of the tiny study there takes about 0.2 CPU s,
    a process of its own 1.2-1.5 (the import).  The same arguments, folder, environment and umask; the exit
    code, stdout and stderr as ``subprocess.run`` gives them."""
    if not _dry_runs or _dry_runs[0].poll() is not None:
        server = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "snakemake_dry_runs.py"), "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        atexit.register(server.kill)
        _dry_runs[:] = [server]
    server = _dry_runs[0]
    request = {"argv": cmd[1:], "cwd": str(cwd), "env": env, "umask": 0o022}
    server.stdin.write(json.dumps(request) + "\n")
    server.stdin.flush()
    line = server.stdout.readline()
    assert line, f"the dry-run process ended (exit code {server.wait()}) on: {' '.join(cmd)}"
    answer = json.loads(line)
    return subprocess.CompletedProcess(cmd, answer["code"], answer["stdout"], answer["stderr"])


def write_yaml(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def check_modes(results: Path, umask: int) -> None:
    """Every file and folder the workflow wrote follows the umask (group can read; write as the umask says):
    the datasets, the staged model, the store and the generations at least (more than 40 paths)."""
    checked = 0
    for path in [results, *results.rglob("*")]:
        mode = stat.S_IMODE(path.lstat().st_mode)
        if path.is_symlink():
            continue
        full = 0o777 if path.is_dir() else 0o666
        assert mode == full & ~umask, f"{path}: mode {oct(mode)}, expected {oct(full & ~umask)}"
        checked += 1
    assert checked > 40


def dry_run_jobs(text: str) -> list[dict[str, str]]:
    """Split `snakemake -n` output into jobs: rule, wildcards and resources."""
    jobs = []
    for block in re.split(r"\n(?=(?:local)?rule \w+:)", text):
        m = re.match(r"(?:local)?rule (\w+):", block)
        if not m:
            continue
        job = {"rule": m.group(1)}
        for key in ("wildcards", "resources"):
            line = re.search(rf"^\s+{key}: (.*)$", block, re.M)
            job[key] = dict(kv.split("=", 1) for kv in line.group(1).split(", ")) if line else {}
        jobs.append(job)
    return jobs

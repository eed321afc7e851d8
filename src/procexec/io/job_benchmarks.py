"""Snakemake's per-job benchmark files: a shard's wall seconds and a model's GPU-hours.

Each `infer` job (one shard) writes ``.../benchmarks/infer/{model}/{shard}.tsv``
(header ``s h:m:s max_rss ...``); ``procexec status`` (cluster) and the report
(analysis) both account GPU-hours from them, so the reading lives below both.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Sequence
from pathlib import Path

from procexec.errors import ProcexecError, reading


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
            seconds = float(value)  # type: ignore[arg-type]  # a short row's None: the TypeError below
        except (TypeError, ValueError):
            seconds = math.nan
        if not math.isfinite(seconds) or seconds < 0:
            raise ProcexecError(
                f"{path}:{number}: column 's' is {value!r:.40}, not a number of seconds (finite, at least 0)"
            )
        total += seconds
    return total


def gpu_hours_of(files: Sequence[Path], gpus: int) -> float:
    """GPU-hours of one model's finished generation jobs (its shards' benchmark files)."""
    return sum(shard_seconds(f) for f in files) / 3600 * gpus

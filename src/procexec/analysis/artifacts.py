"""Readers of the analysis stages' own outputs (the aggregate's metrics, the figure manifest).

The report reads these files, never the code that wrote them (it needs neither
matplotlib nor the figures' drawing code to list the figures).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from procexec.analysis.aggregate import METRIC_TYPES
from procexec.errors import ProcexecError
from procexec.io.files import settle
from procexec.io.jsonl import read_json
from procexec.io.parquet import read_columns


def read_metrics(aggregate_dir: str | Path) -> pd.DataFrame:
    """``metrics.parquet`` of an aggregate folder (which must exist), checked against its columns."""
    directory = Path(aggregate_dir)
    if not directory.is_dir():
        raise ProcexecError(f"{directory}: aggregate directory not found (run `procexec aggregate` first)")
    settle(directory)
    return read_columns(directory / "metrics.parquet", METRIC_TYPES)


MANIFEST_KEYS = ("id", "number", "section", "title", "caption", "model", "files")


def read_figure_manifest(figures_dir: str | Path) -> list[dict[str, Any]]:
    """The figures listed in ``{figures_dir}/manifest.json``; every listed file must be there."""
    directory = Path(figures_dir)
    if not directory.is_dir():
        raise ProcexecError(f"{directory}: figures directory not found (run `procexec figures` first)")
    path = directory / "manifest.json"
    if not path.exists():
        raise ProcexecError(f"{path}: figure manifest not found (run `procexec figures` first)")
    entries = read_json(path, what="figure manifest").get("figures")
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and all(k in e for k in MANIFEST_KEYS) for e in entries
    ):
        raise ProcexecError(f"{path}: not a figure manifest (a 'figures' list of {', '.join(MANIFEST_KEYS)})")
    for figure in entries:
        if figure["files"] is not None and not isinstance(figure["files"], list):
            raise ProcexecError(f"{path}: figure {figure['id']!r}: 'files' must be a list or null")
        for name in figure["files"] or []:
            if not isinstance(name, str) or Path(name).name != name or not (directory / name).is_file():
                raise ProcexecError(f"{path}: figure {figure['id']!r} lists {name!r}, which is not in {directory}")
    return entries

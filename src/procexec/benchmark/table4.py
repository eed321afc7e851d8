"""The paper's Table 4: statistics of the expected output per operator over the base suite.

The one place Table 4 is computed: ``procexec table4`` (beside the paper's
values) and ``procexec tables`` (CSV + LaTeX for the report) both call
``table4(base_suite_finals(reference_files(directory)))``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from procexec.benchmark.executor import parse_value, to_float
from procexec.benchmark.suite import DatasetSpec
from procexec.errors import ProcexecError
from procexec.io.jsonl import read_jsonl
from procexec.records import DATASET_ID, OPERATORS, Reference

# As printed in the paper (Appendix H, Table 4).
PAPER_TABLE4 = pd.DataFrame(
    {
        "median": [3.45e2, -2.89e-1, 6.25e31, 8.75e-1, 9.97e-1],
        "std": [1.91e3, 2.48e2, math.inf, 2.71e33, 7.80e29],
        "min": [1.02e-1, -1.82e3, 0.0, 1.82e-44, -3.61e29],
        "max": [9.56e3, 1.36e3, 1.43e190, 1.40e35, 3.98e31],
    },
    index=pd.Index(OPERATORS, name="operator"),
)


def reference_files(references_dir: str | Path, datasets: list[str] | None = None) -> list[Path]:
    """The reference files to summarise: ``<id>.jsonl`` of each of ``datasets`` (each must exist), or,
    without a list, every ``<dataset id>.jsonl`` of the folder (other files, e.g. table4.csv, are not)."""
    directory = Path(references_dir)
    if not directory.is_dir():
        raise ProcexecError(f"{directory}: references directory not found")
    if datasets:
        files = [directory / f"{DatasetSpec.from_id(name).id}.jsonl" for name in datasets]
        missing = [str(f) for f in files if not f.is_file()]
        if missing:
            raise ProcexecError(f"reference files not found: {', '.join(missing)}")
        return files
    return [p for p in sorted(directory.glob("*.jsonl")) if DATASET_ID.fullmatch(p.name.removesuffix(".jsonl"))]


#: The one semantics of the study's Table 4 (the `table4` and `tables` outputs and the reproduction verdict):
#: what the paper's Appendix A executor returned, which is what the paper's table summarises (docs/decisions.md).
TABLE4_SEMANTICS = "appendix-a"


def base_suite_finals(files: Iterable[Path], semantics: str = TABLE4_SEMANTICS) -> dict[str, list[float]]:
    """Final values (float64, overflow -> inf) of the look-back-1 datasets, per operator.

    ``appendix-a`` reads each reference's ``appendix_a_final``: what the paper's
    executor returned, hence what the paper's Table 4 summarises.
    """
    finals: dict[str, list[float]] = {op: [] for op in OPERATORS}
    for path in files:
        spec = DatasetSpec.from_id(Path(path).name.removesuffix(".jsonl"))
        if spec.lookback != 1:
            continue
        for line, obj in read_jsonl(path):
            ref = Reference.from_json(obj, f"{path}:{line}")
            if ref.dataset != spec.id:
                raise ProcexecError(f"{path}:{line}: reference of dataset {ref.dataset!r} in the file of {spec.id!r}")
            value = ref.final if semantics == "default" else ref.appendix_a_final
            if value is None:
                raise ProcexecError(f"{path}:{line}: no appendix_a_final (needed for --semantics appendix-a)")
            finals[spec.operator].append(to_float(parse_value(value)))
    return finals


def table4(finals: dict[str, list[float]]) -> pd.DataFrame:
    """Median, sample std (ddof=1, as pandas), min and max; NaN outputs are left out and counted."""
    rows = {}
    for op in OPERATORS:
        values = np.asarray(finals.get(op, []), dtype=np.float64)
        values_nonan = values[~np.isnan(values)]
        if values_nonan.size == 0:
            continue
        with np.errstate(over="ignore", invalid="ignore"):
            std = float(np.std(values_nonan, ddof=1)) if values_nonan.size > 1 else math.nan
        if math.isnan(std) and np.isinf(values_nonan).any():
            std = math.inf
        rows[op] = {
            "median": float(np.median(values_nonan)),
            "std": std,
            "min": float(values_nonan.min()),
            "max": float(values_nonan.max()),
            "n": int(values.size),
            "n_nan": int(values.size - values_nonan.size),
        }
    columns = ["median", "std", "min", "max", "n", "n_nan"]  # also when no base-suite dataset is there
    return pd.DataFrame.from_dict(rows, orient="index", columns=columns).rename_axis("operator")


def side_by_side(ours: pd.DataFrame) -> pd.DataFrame:
    """Ours next to the paper's, with the order-of-magnitude gap per statistic."""
    out = pd.DataFrame(index=ours.index)
    for stat in ("median", "std", "min", "max"):
        out[f"{stat}_ours"] = ours[stat]
        out[f"{stat}_paper"] = PAPER_TABLE4.loc[ours.index, stat]
        out[f"{stat}_log10_gap"] = [_log10_gap(a, b) for a, b in zip(ours[stat], out[f"{stat}_paper"])]
    return out


def _log10_gap(ours: float, paper: float) -> float:
    """|log10|ours| - log10|paper||, 0 when both are the same infinity or zero; NaN if signs differ."""
    if ours == paper:
        return 0.0
    if math.isinf(ours) or math.isinf(paper) or ours == 0 or paper == 0 or (ours > 0) != (paper > 0):
        return math.nan
    return abs(math.log10(abs(ours)) - math.log10(abs(paper)))

"""The paper's Tables 1-4 as CSV and booktabs LaTeX, from config, metrics and references.

Tables are computed as plain DataFrames first (the report renders the CSVs), and
LaTeX is written by one small hand-rolled helper so no LaTeX engine or extra
dependency is needed to build them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from procexec.analysis import paper_numbers, reproduction
from procexec.analysis.artifacts import read_metrics
from procexec.analysis.latex import LatexColumn, latex_escape, latex_sci, to_latex
from procexec.analysis.study import GROUP_TITLES, models_frame
from procexec.benchmark import table4 as table4_core
from procexec.config.model import Config
from procexec.io.files import FileSet
from procexec.io.formats import format_fixed
from procexec.io.parquet import read_columns
from procexec.records import OPERATOR_LABELS
from procexec.scoring.score import SCORE_COLUMNS

# --------------------------------------------------------------------------- tables


@dataclass(frozen=True)
class TableSpec:
    id: str
    number: int
    caption: str


TABLES = (
    TableSpec("table1_models", 1, "Language models evaluated in our experiments."),
    TableSpec(
        "table2_par_step_following",
        2,
        "Difference (percentage points) between the shortest and the longest procedures. "
        "PAR denotes Parseable Answer Rate degradation; Exact, Under and Over report changes "
        "in step-following behaviour (value at the shortest length minus value at the longest).",
    ),
    TableSpec(
        "table3_accuracy",
        3,
        "Model accuracy (FAA) with 95% bootstrap confidence intervals: mean accuracy (%) "
        "plus/minus the confidence-interval half-width.",
    ),
    TableSpec(
        "table4_expected_output",
        4,
        "Expected-output statistics across task variants over the base suite (look-back 1).",
    ),
)


def _pct(value: float) -> str:
    return latex_escape(format_fixed(value, 1))


def table1(models: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    frame = models[["abbrev", "name", "params", "group"]].copy()
    latex = to_latex(
        frame,
        [LatexColumn("Abbrev.", "abbrev"), LatexColumn("Model", "name"), LatexColumn("Params", "params", align="r")],
        TABLES[0].caption,
        "tab:models",
        group_by="group",
        group_titles=GROUP_TITLES,
    )
    return frame, latex


def _by_length(metrics: pd.DataFrame, names: list[str]) -> pd.DataFrame:
    rows = metrics[(metrics["grouping"] == "length") & metrics["metric"].isin(names)]
    return rows.pivot_table(index=["model", "length"], columns="metric", values="value").reset_index()


def table2(metrics: pd.DataFrame, models: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Shortest minus longest length, in percentage points, sorted by PAR change like the paper."""
    names = ["par", "sfb_exact", "sfb_under", "sfb_over"]
    wide = _by_length(metrics, names)
    rows = []
    for key, abbrev in zip(models["model"], models["abbrev"]):
        own = wide[wide["model"] == key].sort_values("length")
        if own.empty:
            continue
        short, long_ = own.iloc[0], own.iloc[-1]
        row = {
            "model": key,
            "abbrev": abbrev,
            "length_short": int(short["length"]),
            "length_long": int(long_["length"]),
        }
        for name, column in zip(names, ["par", "exact", "under", "over"]):
            row[column] = 100 * (short.get(name, np.nan) - long_.get(name, np.nan))
        rows.append(row)
    frame = pd.DataFrame(
        rows, columns=["model", "abbrev", "length_short", "length_long", "par", "exact", "under", "over"]
    )
    frame = frame.sort_values("par", kind="stable").reset_index(drop=True)
    latex = to_latex(
        frame,
        [LatexColumn("Model", "abbrev")]
        + [
            LatexColumn(h, k, _pct, "r")
            for h, k in [("PAR", "par"), ("Exact", "exact"), ("Under", "under"), ("Over", "over")]
        ],
        TABLES[1].caption,
        "tab:par-step-following",
    )
    return frame, latex


def table3(metrics: pd.DataFrame, models: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """Overall FAA with its bootstrap CI, ascending like the paper."""
    rows = metrics[(metrics["grouping"] == "overall") & (metrics["metric"] == "faa")]
    frame = models[["model", "abbrev", "name"]].merge(
        rows[["model", "value", "ci_low", "ci_high", "n"]], on="model", how="inner"
    )
    frame["accuracy"] = 100 * frame["value"]
    frame["ci_low"] = 100 * frame["ci_low"]
    frame["ci_high"] = 100 * frame["ci_high"]
    frame["half_width"] = (frame["ci_high"] - frame["ci_low"]) / 2
    frame = frame.drop(columns="value").sort_values("accuracy", kind="stable").reset_index(drop=True)
    frame = frame[["model", "abbrev", "name", "accuracy", "half_width", "ci_low", "ci_high", "n"]]

    def cell(row_key: str) -> str:
        row = frame.loc[frame["model"] == row_key].iloc[0]
        return rf"${format_fixed(row['accuracy'], 2)}\pm {format_fixed(row['half_width'], 2)}$"

    latex = to_latex(
        frame,
        [LatexColumn("Model", "name"), LatexColumn("Accuracy (%)", "model", cell, "r")],
        TABLES[2].caption,
        "tab:bootstrap",
    )
    return frame, latex


def table4_expected_output(references_dir: str | Path, datasets: list[str] | None = None) -> tuple[pd.DataFrame, str]:
    """Table 4 as computed by ``procexec.benchmark.table4`` (its one implementation), with task labels and LaTeX."""
    stats = table4_core.table4(
        table4_core.base_suite_finals(
            table4_core.reference_files(references_dir, datasets), table4_core.TABLE4_SEMANTICS
        )
    ).reset_index()
    stats.insert(1, "task", stats["operator"].map(OPERATOR_LABELS))
    latex = to_latex(
        stats,
        [LatexColumn("Task", "task")]
        + [
            LatexColumn(h, k, latex_sci, "r")
            for h, k in [("Median", "median"), ("Std. Dev.", "std"), ("Min", "min"), ("Max", "max")]
        ],
        TABLES[3].caption,
        "tab:expected-output",
    )
    return stats, latex


def write_tables(
    config: Config,
    aggregate_dir: str | Path,
    references_dir: str | Path,
    out_dir: str | Path,
    datasets: list[str] | None = None,
    resamples: int = 1000,
    seed: int = 0,
) -> list[Path]:
    """Write every table as ``{id}.csv`` and ``{id}.tex`` (one ``FileSet``); returns the files written.

    Beside the paper's four, ``reproduction`` sets the paper's published numbers beside
    ours (procexec.analysis.reproduction; ``resamples``/``seed`` as for ``procexec aggregate``).
    """
    metrics = read_metrics(aggregate_dir)
    models = models_frame(config, present=metrics["model"].unique())
    built = {
        "table1_models": table1(models),
        "table2_par_step_following": table2(metrics, models),
        "table3_accuracy": table3(metrics, models),
        "table4_expected_output": table4_expected_output(references_dir, datasets),
    }
    built.update(
        reproduction_from_files(
            aggregate_dir, table4_core.reference_files(references_dir, datasets), models, resamples, seed
        )
    )
    with FileSet(out_dir) as files:
        for table_id, (frame, latex) in built.items():
            with files.open(f"{table_id}.csv") as handle:
                frame.to_csv(handle, index=False)
            with files.open(f"{table_id}.tex") as handle:
                handle.write(latex)
    return [Path(out_dir) / f"{table_id}.{ext}" for table_id in built for ext in ("csv", "tex")]


def reproduction_from_files(
    aggregate_dir: str | Path, references: list[Path], models: pd.DataFrame, resamples: int, seed: int
) -> dict[str, tuple[pd.DataFrame, str]]:
    """The paper's published numbers beside ours, from the score rows and the references."""
    columns = {name: SCORE_COLUMNS[name] for name in reproduction.SCORE_INPUT_COLUMNS}
    scores = read_columns(Path(aggregate_dir) / "scores.parquet", columns)  # the aggregate is settled by read_metrics
    frame = reproduction.reproduction_table(
        paper_numbers.load_paper_numbers(), scores, models, references, resamples, seed
    )
    return {reproduction.TABLE_ID: (frame, reproduction.reproduction_latex(frame))}

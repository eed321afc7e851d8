"""What the figures read: the aggregated metrics, the score columns they plot and the study's models, once."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd

from procexec.analysis.artifacts import read_metrics
from procexec.analysis.study import models_frame
from procexec.config.model import Config
from procexec.io.parquet import read_columns
from procexec.scoring.score import SCORE_COLUMNS

# Score column of each wrong-step count -> its label in the error-mix figure.
ERROR_CLASS_LABELS = {
    "n_arithmetic_slip": "arithmetic slip",
    "n_wrong_operand": "wrong operand",
    "n_skipped": "skipped step",
    "n_propagation": "error propagation",
}
# The score columns the figures read (of procexec.scoring.score.SCORE_COLUMNS), with their types.
FIGURE_SCORE_COLUMNS = {
    name: SCORE_COLUMNS[name]
    for name in [
        "model",
        "length",
        "input_type",
        "input_range",
        "operator",
        "lookback",
        "faa",
        "expected_log10_abs",
        "answer_position",
        "first_divergent_step",
        *ERROR_CLASS_LABELS,
    ]
}


@dataclass
class Inputs:
    """Everything the builders read, loaded once; derived per-example aggregates are cached."""

    metrics: pd.DataFrame
    scores: pd.DataFrame
    models: pd.DataFrame  # study.models_frame order: key, abbrev, group, ...

    @property
    def abbrev(self) -> dict[str, str]:
        return dict(zip(self.models["model"], self.models["abbrev"]))

    @property
    def model_order(self) -> list[str]:
        return list(self.models["abbrev"])

    def metric(self, grouping: str, names: list[str], model: str | None = None) -> pd.DataFrame:
        """Rows of one grouping with a ``label`` column (the model's abbreviation), in model order."""
        rows = self.metrics[(self.metrics["grouping"] == grouping) & self.metrics["metric"].isin(names)]
        if model is not None:
            rows = rows[rows["model"] == model]
        rows = rows[rows["model"].isin(self.abbrev)].copy()
        rows["label"] = pd.Categorical(rows["model"].map(self.abbrev), categories=self.model_order)
        return rows.sort_values("label")

    @cached_property
    def labelled_scores(self) -> pd.DataFrame:
        frame = self.scores[self.scores["model"].isin(self.abbrev)].copy()
        frame["label"] = pd.Categorical(frame["model"].map(self.abbrev), categories=self.model_order)
        frame["correctness"] = np.where(frame["faa"], "correct", "incorrect")
        return frame


def load_inputs(config: Config, aggregate_dir: str | Path) -> Inputs:
    metrics = read_metrics(aggregate_dir)
    scores = read_columns(Path(aggregate_dir) / "scores.parquet", FIGURE_SCORE_COLUMNS)
    present = list(dict.fromkeys([*metrics["model"].unique(), *scores["model"].unique()]))
    return Inputs(metrics, scores, models_frame(config, present=present))

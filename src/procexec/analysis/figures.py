"""The paper's figures (2-5, 8-19, G.1-G.7 = 20-124) and the beyond-the-paper diagnostics.

Each figure is a ``FigureSpec``: a builder turns the aggregated metrics / per-example
scores into a small tidy frame in the parent process, and one of four plotting
helpers (lines, heatmap, boxes, stacked bars) draws it in a worker process.  Only
small tidy frames cross the process boundary, so the ~825k score rows are read
once and the drawing (the slow part) runs in parallel.  A ``manifest.json`` in the
output folder lists every figure, its files and caption; the report reads it.
The figures and the manifest are written as one ``FileSet`` (workers draw into
its temporary files): a failure or a kill leaves the previous figures and
manifest as they were.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from procexec.analysis.artifacts import read_metrics  # noqa: E402
from procexec.analysis.study import models_frame  # noqa: E402
from procexec.config.model import Config  # noqa: E402
from procexec.io.files import FileSet
from procexec.io.jsonl import dumps  # noqa: E402
from procexec.io.parquet import read_columns  # noqa: E402
from procexec.records import INPUT_TYPES, OPERATORS  # noqa: E402
from procexec.scoring.score import SCORE_COLUMNS  # noqa: E402

RANGE_ORDER = ["0-1", "1-10", "10-100"]
TYPE_ORDER = list(INPUT_TYPES)
CORRECTNESS_ORDER = ["correct", "incorrect"]
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
# Paper's Figures 11-13 split the models by scale.
MODEL_GROUP_FIGURES = (("11", ("small", "mid")), ("12", ("large", "very-large")), ("13", ("frontier", "others")))
# Appendix G: one figure per model per series, numbered 20 + 15 * series + model index in the paper.
G_SERIES = ("G.1", "G.2", "G.3", "G.4", "G.5", "G.6", "G.7")
DPI = 90


# --------------------------------------------------------------------------- inputs


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


# --------------------------------------------------------------------------- plotting helpers
#
# Every helper takes a tidy frame with fixed column names -- x, y, hue, style, panel,
# lo, hi (lines); row, col, value (heatmap); x, q05..q95 (boxes); panel, x, part,
# share (stacked bars) -- plus keyword options, and returns the Figure.


def _canvas(
    n: int,
    panel: tuple[float, float],
    legend: float = 0.0,
    margins: tuple[float, float] = (0.75, 0.6),
    share: bool = True,
) -> tuple[plt.Figure, list[plt.Axes]]:
    """Figure with ``n`` panels (5 per row) laid out in fixed inches.

    Fixed margins instead of tight_layout / bbox_inches="tight": those re-measure every
    tick label and made multi-panel figures ~3x slower to save.
    """
    ncols = min(max(n, 1), 5)
    nrows = -(-max(n, 1) // ncols)
    (pw, ph), (left, bottom), top, gap_w, gap_h = panel, margins, 0.5, 0.3, 0.45
    width = left + ncols * pw + (ncols - 1) * gap_w + legend + 0.15
    height = bottom + nrows * ph + (nrows - 1) * gap_h + top
    fig, axes = plt.subplots(
        nrows,
        ncols,
        figsize=(width, height),
        squeeze=False,
        sharex=share,
        sharey=share,
        gridspec_kw={
            "left": left / width,
            "right": (width - legend - 0.15) / width,
            "bottom": bottom / height,
            "top": 1 - top / height,
            "wspace": gap_w / pw,
            "hspace": gap_h / ph,
        },
    )
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[: max(n, 1)]


def _finish(
    fig: plt.Figure, axes: list[plt.Axes], title: str, xlabel: str, ylabel: str, legend: bool = True
) -> plt.Figure:
    fig.suptitle(title, y=1 - 0.12 / fig.get_figheight())
    fig.supxlabel(xlabel, y=0.05 / fig.get_figheight() * 2)
    fig.supylabel(ylabel, x=0.1 / fig.get_figwidth())
    handles, labels = axes[0].get_legend_handles_labels()
    if legend and handles:
        right = axes[0].get_position().x1 if len(axes) == 1 else max(ax.get_position().x1 for ax in axes)
        fig.legend(handles, labels, loc="center left", bbox_to_anchor=(right + 0.01, 0.5), frameon=False, fontsize=8)
    return fig


def plot_lines(
    data: pd.DataFrame,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    hue_order: list[str],
    logy: bool = False,
    ylim: tuple[float, float] | None = None,
    dashed: tuple[str, ...] = (),
    inset: pd.DataFrame | None = None,
    inset_order: list[str] | None = None,
) -> plt.Figure:
    """Lines of y over x per hue, one panel per ``panel`` value; ``lo``/``hi`` give a band."""
    panels = list(dict.fromkeys(data["panel"])) if "panel" in data else [None]
    size = (2.6, 2.0) if len(panels) > 1 else (5.5, 3.6)
    legend = 1.9 if "style" in data or len(hue_order) > 10 else 1.3
    fig, axes = _canvas(len(panels), size, legend=legend)
    palette = dict(zip(hue_order, sns.color_palette("tab20" if len(hue_order) > 10 else "tab10", len(hue_order))))
    for ax, name in zip(axes, panels):
        part = data if name is None else data[data["panel"] == name]
        _draw_lines(ax, part, hue_order, palette, dashed)
        if name is not None:
            ax.set_title(str(name), fontsize=9)
        ax.xaxis.set_major_locator(MaxNLocator(5, integer=True))
        if logy:
            ax.set_yscale("symlog" if (part["y"] <= 0).any() else "log")
        else:
            ax.yaxis.set_major_locator(MaxNLocator(5))
        if ylim:
            ax.set_ylim(*ylim)
    if inset is not None:
        sub = axes[0].inset_axes([0.64, 0.58, 0.34, 0.38])
        order = inset_order or []
        _draw_lines(sub, inset, order, dict(zip(order, sns.color_palette("Dark2", len(order)))), ())
        sub.tick_params(labelsize=6)
        if ylim:
            sub.set_ylim(*ylim)
        sub.legend(fontsize=6, frameon=False)
    return _finish(fig, axes, title, xlabel, ylabel, legend=len(hue_order) > 1 or inset is not None)


def _draw_lines(
    ax: plt.Axes, part: pd.DataFrame, hue_order: list[str], palette: dict[str, Any], dashed: tuple[str, ...]
) -> None:
    for hue in hue_order:
        rows = part[part["hue"] == hue]
        styles = list(dict.fromkeys(rows["style"])) if "style" in rows else [None]
        for style in styles:
            line = rows if style is None else rows[rows["style"] == style]
            line = line.sort_values("x")
            if line.empty:
                continue
            label = hue if style is None else f"{hue} ({style})"
            dash = "--" if hue in dashed or style in dashed else "-"
            ax.plot(line["x"], line["y"], dash, marker="o", markersize=2.5, lw=1.2, color=palette[hue], label=label)
            if "lo" in line and line["lo"].notna().any():
                ax.fill_between(line["x"], line["lo"], line["hi"], color=palette[hue], alpha=0.15, lw=0)


def plot_heatmap(
    data: pd.DataFrame,
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    row_order: list[str],
    col_order: list[Any],
    fmt: str = ".1f",
    cmap: str = "viridis",
) -> plt.Figure:
    """Annotated heatmap of ``value`` over (row, col)."""
    grid = data.pivot_table(index="row", columns="col", values="value", observed=False)
    grid = grid.reindex(
        index=[r for r in row_order if r in grid.index], columns=[c for c in col_order if c in grid.columns]
    )
    fig, axes = _canvas(1, (0.75 * len(grid.columns) + 1.2, 0.3 * len(grid.index) + 0.2), margins=(0.9, 0.6))
    sns.heatmap(grid, annot=True, fmt=fmt, cmap=cmap, ax=axes[0], annot_kws={"fontsize": 7})
    axes[0].set_xlabel("")
    axes[0].set_ylabel("")
    return _finish(fig, axes, title, xlabel, ylabel, legend=False)


def plot_boxes(data: pd.DataFrame, *, title: str, xlabel: str, ylabel: str) -> plt.Figure:
    """Box plots from precomputed quantiles (whiskers at the 5th/95th percentile)."""
    stats = [
        {"label": r.x, "med": r.q50, "q1": r.q25, "q3": r.q75, "whislo": r.q05, "whishi": r.q95, "fliers": []}
        for r in data.itertuples()
    ]
    fig, axes = _canvas(1, (0.45 * len(stats) + 1.0, 3.2), margins=(0.75, 1.0))
    axes[0].bxp(
        stats, showfliers=False, patch_artist=True, boxprops={"facecolor": sns.color_palette("tab10")[0], "alpha": 0.6}
    )
    axes[0].tick_params(axis="x", rotation=60, labelsize=8)
    return _finish(fig, axes, title, xlabel, ylabel, legend=False)


def plot_stacked(data: pd.DataFrame, *, title: str, xlabel: str, ylabel: str, part_order: list[str]) -> plt.Figure:
    """Stacked shares of ``part`` per x, one panel per ``panel`` value."""
    panels = list(dict.fromkeys(data["panel"]))
    fig, axes = _canvas(len(panels), (2.6, 2.0), legend=1.4, share=False)
    colors = dict(zip(part_order, sns.color_palette("Set2", len(part_order))))
    for ax, name in zip(axes, panels):
        grid = data[data["panel"] == name].pivot_table(index="x", columns="part", values="share", fill_value=0)
        bottom = np.zeros(len(grid))
        for part in part_order:
            if part in grid:
                ax.bar(grid.index.astype(str), grid[part], bottom=bottom, color=colors[part], label=part)
                bottom += grid[part].to_numpy()
        ax.set_title(str(name), fontsize=9)
        ax.set_ylim(0, 1)
        ax.tick_params(axis="x", rotation=90, labelsize=6)
    return _finish(fig, axes, title, xlabel, ylabel)


PLOTTERS: dict[str, Callable[..., plt.Figure]] = {
    "lines": plot_lines,
    "heatmap": plot_heatmap,
    "boxes": plot_boxes,
    "stacked": plot_stacked,
}


# --------------------------------------------------------------------------- builders
#
# A builder returns (tidy frame, plotting options); an empty frame means "no data
# for this figure" and is recorded as missing in the manifest.

Built = tuple[pd.DataFrame, dict[str, Any]]


def _lines(frame: pd.DataFrame, **opts: Any) -> Built:
    return frame, {"xlabel": "Procedure length (steps)", **opts}


def faa_by_model(inp: Inputs, metric: str, ylabel: str, logy: bool = False) -> Built:
    """One line per model over length (Figures 2, 18 and the truncation / token curves)."""
    rows = inp.metric("length", [metric])
    scale = 1 if metric == "mean_generated_tokens" else 100
    frame = pd.DataFrame({"x": rows["length"], "y": scale * rows["value"], "hue": rows["label"].astype(str)})
    return _lines(frame, ylabel=ylabel, hue_order=inp.model_order, logy=logy, ylim=None if scale == 1 else (0, 100))


def metrics_per_model_panel(inp: Inputs, names: dict[str, str], dashed: tuple[str, ...] = ()) -> Built:
    """A panel per model, one line per metric over length (Figures 14, FAA vs tolerance)."""
    rows = inp.metric("length", list(names))
    frame = pd.DataFrame(
        {
            "x": rows["length"],
            "y": 100 * rows["value"],
            "hue": rows["metric"].map(names),
            "panel": rows["label"].astype(str),
        }
    )
    return _lines(frame, ylabel="Rate (%)", hue_order=list(names.values()), ylim=(0, 100), dashed=dashed)


STEP_METRICS = {"faa": "FAA", "sfb_exact": "% Exact", "sfb_under": "% Under", "sfb_over": "% Over"}


def step_following(inp: Inputs, model: str | None = None) -> Built:
    """FAA (dashed) with exact/under/over execution over length: Figure 17 (mean of models), G.7."""
    rows = inp.metric("length", list(STEP_METRICS), model)
    mean = rows.groupby(["metric", "length"], as_index=False)["value"].mean()
    frame = pd.DataFrame({"x": mean["length"], "y": 100 * mean["value"], "hue": mean["metric"].map(STEP_METRICS)})
    return _lines(frame, ylabel="Rate (%)", hue_order=list(STEP_METRICS.values()), ylim=(0, 100), dashed=("FAA",))


def faa_by_dimension(
    inp: Inputs, dim: str, order: list[str], model: str | None = None, inset_dim: str | None = None
) -> Built:
    """FAA over length per value of ``dim``, averaged over models (Figure 4) or for one model (G.1-G.3)."""

    def curves(column: str) -> pd.DataFrame:
        rows = inp.metric(f"{column}+length", ["faa"], model)
        mean = rows.groupby([column, "length"], as_index=False)["value"].mean()
        return pd.DataFrame({"x": mean["length"], "y": 100 * mean["value"], "hue": mean[column].astype(str)})

    opts: dict[str, Any] = {"ylabel": "FAA (%)", "hue_order": order, "ylim": (0, 100)}
    if inset_dim is not None:
        opts.update(inset=curves(inset_dim), inset_order=TYPE_ORDER)
    return _lines(curves(dim), **opts)


def median_expected(
    inp: Inputs, dim: str | None, order: list[str], model: str | None = None, panel_groups: tuple[str, ...] = ()
) -> Built:
    """Median |expected output| (log10) over length, correct vs incorrect (Figures 8-13, G.4-G.6).

    The median of log10|v| is used because exact outputs reach 1e190 and beyond (and
    subtraction outputs are signed); it equals log10 of the median magnitude.  Operator
    curves use the base suite (look-back 1) so ``mixed`` is comparable to the others.
    """
    scores = inp.labelled_scores
    if dim == "operator":
        scores = scores[scores["lookback"] == 1]
    if model is not None:
        scores = scores[scores["model"] == model]
    if panel_groups:
        keep = inp.models.loc[inp.models["group"].isin(panel_groups), "model"]
        scores = scores[scores["model"].isin(keep)]
    keys = ["length", "correctness"] + ([dim] if dim else []) + (["label"] if panel_groups else [])
    finite = scores[np.isfinite(scores["expected_log10_abs"])]
    med = finite.groupby(keys, observed=True, as_index=False)["expected_log10_abs"].median()
    frame = pd.DataFrame({"x": med["length"], "y": med["expected_log10_abs"]})
    if dim:
        frame["hue"], frame["style"] = med[dim].astype(str), med["correctness"]
        hue_order = order
    else:
        frame["hue"] = med["correctness"]
        hue_order = CORRECTNESS_ORDER
    if panel_groups:
        frame["panel"] = med["label"].astype(str)
        frame = frame.assign(_o=med["label"].cat.codes).sort_values("_o").drop(columns="_o")
    return _lines(frame, ylabel="Median log10 |expected output|", hue_order=hue_order, dashed=("incorrect",))


def heatmap(inp: Inputs, grouping: str, order: list[Any], xlabel: str) -> Built:
    """Model x group FAA (Figures 5, 15, 16)."""
    rows = inp.metric(grouping, ["faa"])
    col = rows[grouping].astype(int) if grouping == "lookback" else rows[grouping]
    frame = pd.DataFrame({"row": rows["label"].astype(str), "col": col, "value": 100 * rows["value"]})
    return frame, {
        "xlabel": xlabel,
        "ylabel": "Model",
        "row_order": inp.model_order,
        "col_order": order,
        "fmt": ".1f",
        "cmap": "viridis",
    }


def lookback_degradation(inp: Inputs) -> Built:
    """Figure 3: percent FAA drop at look-back k relative to the model's k=1 FAA."""
    rows = inp.metric("lookback", ["faa"])
    base = rows[rows["lookback"] == 1].set_index("model")["value"]
    rows = rows[(rows["lookback"] != 1) & rows["model"].isin(base[base > 0].index)]
    drop = (
        100
        * (base.reindex(rows["model"]).to_numpy() - rows["value"].to_numpy())
        / base.reindex(rows["model"]).to_numpy()
    )
    frame = pd.DataFrame(
        {"row": rows["label"].astype(str).to_numpy(), "col": rows["lookback"].astype(int).to_numpy(), "value": drop}
    )
    order = sorted(frame["col"].unique())
    return frame, {
        "xlabel": "Look-back k",
        "ylabel": "Model",
        "row_order": inp.model_order,
        "col_order": order,
        "fmt": ".1f",
        "cmap": "rocket_r",
    }


_QUANTILES = {"q05": 0.05, "q25": 0.25, "q50": 0.5, "q75": 0.75, "q95": 0.95}


def _quantiles(frame: pd.DataFrame, keys: list[str], column: str) -> pd.DataFrame:
    """Quantiles of ``column`` per group; no rows (e.g. no parseable answer at all) gives an empty frame."""
    present = frame.dropna(subset=[column])
    if present.empty:
        return pd.DataFrame(columns=[*keys, *_QUANTILES])
    q = present.groupby(keys, observed=True)[column].quantile(list(_QUANTILES.values())).unstack()
    q.columns = list(_QUANTILES)
    return q.reset_index()


def answer_position(inp: Inputs) -> Built:
    """Figure 19: distribution of the normalized first-answer position per model."""
    q = _quantiles(inp.labelled_scores, ["label"], "answer_position")
    return q.rename(columns={"label": "x"}).assign(x=lambda f: f["x"].astype(str)), {
        "xlabel": "Model",
        "ylabel": "First-answer position (% of generated tokens)",
    }


def first_divergence(inp: Inputs) -> Built:
    """Median first divergent step (band: inter-quartile range) over length, a panel per model."""
    q = _quantiles(inp.labelled_scores, ["label", "length"], "first_divergent_step")
    frame = pd.DataFrame(
        {
            "x": q["length"],
            "y": q["q50"],
            "lo": q["q25"],
            "hi": q["q75"],
            "hue": "first divergent step",
            "panel": q["label"].astype(str),
        }
    )
    return _lines(frame, ylabel="First divergent step", hue_order=["first divergent step"])


def error_mix(inp: Inputs) -> Built:
    """Share of each wrong-step class among all wrong steps, per model and length."""
    sums = inp.labelled_scores.groupby(["label", "length"], observed=True)[list(ERROR_CLASS_LABELS)].sum()
    total = sums.sum(axis=1).replace(0, np.nan)
    shares = sums.div(total, axis=0).dropna().rename(columns=ERROR_CLASS_LABELS).stack().reset_index()
    shares.columns = ["panel", "x", "part", "share"]
    shares["panel"] = shares["panel"].astype(str)
    return shares, {
        "xlabel": "Procedure length (steps)",
        "ylabel": "Share of wrong steps",
        "part_order": list(ERROR_CLASS_LABELS.values()),
    }


# --------------------------------------------------------------------------- registry


@dataclass(frozen=True)
class FigureSpec:
    id: str
    number: str  # the paper's figure number, or "X<n>" beyond the paper
    section: str  # report section: main, C, D, E, F, G, X
    title: str
    caption: str
    kind: str  # key of PLOTTERS
    build: Callable[[Inputs], Built] = field(compare=False, repr=False)
    model: str | None = None


def figure_specs(models: pd.DataFrame) -> list[FigureSpec]:
    """Every figure of the report, in report order."""
    rng, typ, op = RANGE_ORDER, TYPE_ORDER, list(OPERATORS)
    specs = [
        FigureSpec(
            "fig02_faa_vs_steps",
            "2",
            "main",
            "FAA vs procedure length",
            "FAA of each model as a function of procedure length.",
            "lines",
            lambda i: faa_by_model(i, "faa", "FAA (%)"),
        ),
        FigureSpec(
            "fig03_lookback_degradation",
            "3",
            "main",
            "Relative FAA degradation vs look-back",
            "Relative FAA degradation (%) at look-back k, measured against each model's look-back-1 "
            "FAA (averaged over procedure lengths).",
            "heatmap",
            lookback_degradation,
        ),
        FigureSpec(
            "fig04_faa_by_range",
            "4",
            "main",
            "FAA by input range vs procedure length",
            "FAA across input ranges as a function of procedure length, averaged over models; the inset "
            "compares integer and floating-point inputs.",
            "lines",
            lambda i: faa_by_dimension(i, "input_range", rng, inset_dim="input_type"),
        ),
        FigureSpec(
            "fig05_operator_heatmap",
            "5",
            "main",
            "FAA by model and task variant",
            "FAA heatmap across models and arithmetic task variants.",
            "heatmap",
            lambda i: heatmap(i, "operator", op, "Task variant"),
        ),
        FigureSpec(
            "fig08_expected_by_range",
            "8",
            "C",
            "Median expected output by input range",
            "Median expected output (log10 magnitude) across steps per input range, correct vs incorrect "
            "(dashed) predictions, all models pooled.",
            "lines",
            lambda i: median_expected(i, "input_range", rng),
        ),
        FigureSpec(
            "fig09_expected_by_type",
            "9",
            "C",
            "Median expected output by data type",
            "Median expected output across steps for integer and floating-point inputs, correct vs incorrect (dashed).",
            "lines",
            lambda i: median_expected(i, "input_type", typ),
        ),
        FigureSpec(
            "fig10_expected_by_operator",
            "10",
            "C",
            "Median expected output by task variant",
            "Median expected output across steps per task variant (base suite, look-back 1), correct vs "
            "incorrect (dashed).",
            "lines",
            lambda i: median_expected(i, "operator", op),
        ),
    ]
    for number, groups in MODEL_GROUP_FIGURES:
        specs.append(
            FigureSpec(
                f"fig{number}_expected_{'_'.join(groups)}",
                number,
                "C",
                f"Median expected output, {' and '.join(groups)} models",
                f"Median expected output across steps for the {' and '.join(groups)} models, correct vs incorrect "
                "(dashed), one panel per model.",
                "lines",
                lambda i, g=groups: median_expected(i, None, CORRECTNESS_ORDER, panel_groups=g),
            )
        )
    specs += [
        FigureSpec(
            "fig14_faa_vs_caa",
            "14",
            "D",
            "FAA vs CAA",
            "First-answer accuracy (FAA) and any-answer accuracy (CAA, dashed) per model over length.",
            "lines",
            lambda i: metrics_per_model_panel(i, {"faa": "FAA", "caa": "CAA"}, dashed=("CAA",)),
        ),
        FigureSpec(
            "fig15_range_heatmap",
            "15",
            "E",
            "FAA by model and input range",
            "FAA heatmap across models and input ranges.",
            "heatmap",
            lambda i: heatmap(i, "input_range", rng, "Input range"),
        ),
        FigureSpec(
            "fig16_lookback_heatmap",
            "16",
            "E",
            "FAA by model and look-back",
            "FAA heatmap across models and look-back dependency.",
            "heatmap",
            lambda i: heatmap(i, "lookback", list(range(1, 8)), "Look-back k"),
        ),
        FigureSpec(
            "fig17_step_following",
            "17",
            "F",
            "FAA and execution behaviour vs length",
            "FAA (dashed) and the share of exact, under- and over-executed generations, averaged over models.",
            "lines",
            step_following,
        ),
        FigureSpec(
            "fig18_par_vs_steps",
            "18",
            "F",
            "Parseable answer rate vs length",
            "Parseable answer rate (PAR) across increasing step counts.",
            "lines",
            lambda i: faa_by_model(i, "par", "PAR (%)"),
        ),
        FigureSpec(
            "fig19_answer_position",
            "19",
            "F",
            "First-answer position",
            "Distribution of the normalized position of the first parseable answer per model (box: "
            "quartiles, whiskers: 5th-95th percentile).",
            "boxes",
            answer_position,
        ),
        FigureSpec(
            "x1_first_divergent_step",
            "X1",
            "X",
            "First divergent step vs length",
            "Beyond the paper: median first divergent step of the model's claimed trace (band: "
            "inter-quartile range), per model.",
            "lines",
            first_divergence,
        ),
        FigureSpec(
            "x2_error_class_mix",
            "X2",
            "X",
            "Error-class mix vs length",
            "Beyond the paper: share of wrong steps that are arithmetic slips, wrong operands, skipped "
            "steps or propagated errors, per model and length.",
            "stacked",
            error_mix,
        ),
        FigureSpec(
            "x3_truncation_vs_length",
            "X3",
            "X",
            "Truncation rate vs length",
            "Beyond the paper: share of generations stopped by the token limit.",
            "lines",
            lambda i: faa_by_model(i, "truncation_rate", "Truncated (%)"),
        ),
        FigureSpec(
            "x4_tokens_vs_length",
            "X4",
            "X",
            "Generated tokens vs length",
            "Beyond the paper: mean number of generated tokens (log scale).",
            "lines",
            lambda i: faa_by_model(i, "mean_generated_tokens", "Generated tokens", logy=True),
        ),
        FigureSpec(
            "x5_faa_vs_tolerance",
            "X5",
            "X",
            "FAA vs tolerance accuracy",
            "Beyond the paper: exact (3-decimal) FAA against relative-tolerance accuracy (dashed).",
            "lines",
            lambda i: metrics_per_model_panel(
                i, {"faa": "FAA", "tolerance_accuracy": "tolerance"}, dashed=("tolerance",)
            ),
        ),
    ]
    series: list[tuple[str, str, Callable[[Inputs, str], Built]]] = [
        ("faa_by_type", "FAA by data type", lambda i, m: faa_by_dimension(i, "input_type", typ, m)),
        ("faa_by_range", "FAA by input range", lambda i, m: faa_by_dimension(i, "input_range", rng, m)),
        ("faa_by_operator", "FAA by task variant", lambda i, m: faa_by_dimension(i, "operator", op, m)),
        (
            "expected_by_type",
            "Median expected output by data type",
            lambda i, m: median_expected(i, "input_type", typ, m),
        ),
        (
            "expected_by_range",
            "Median expected output by input range",
            lambda i, m: median_expected(i, "input_range", rng, m),
        ),
        (
            "expected_by_operator",
            "Median expected output by task variant",
            lambda i, m: median_expected(i, "operator", op, m),
        ),
        ("step_analysis", "Step analysis", lambda i, m: step_following(i, m)),
    ]
    for s, (slug, title, build) in enumerate(series):
        for position, (key, abbrev) in enumerate(zip(models["model"], models["abbrev"])):
            specs.append(
                FigureSpec(
                    f"g{s + 1}_{slug}_{key}",
                    f"{G_SERIES[s]}/{20 + 15 * s + position}",
                    "G",
                    f"{abbrev}: {title}",
                    f"{title} as a function of procedure length for {abbrev}"
                    + (" (incorrect dashed)." if slug.startswith("expected") else "."),
                    "lines",
                    lambda i, b=build, k=key: b(i, k),
                    model=key,
                )
            )
    return specs


# --------------------------------------------------------------------------- rendering


def _render(task: tuple[str, str, pd.DataFrame, dict[str, Any], dict[str, str], int]) -> None:
    """Draw one figure into its files (``{extension: path}``, PNG and SVG); runs in a worker process."""
    kind, title, data, opts, paths, dpi = task
    sns.set_theme(style="whitegrid", context="paper")
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, faster SVG
    fig = PLOTTERS[kind](data, title=title, **opts)
    for ext, path in paths.items():
        fig.savefig(path, format=ext, dpi=dpi)
    plt.close(fig)


def write_figures(
    config: Config,
    aggregate_dir: str | Path,
    out_dir: str | Path,
    workers: int | None = None,
    dpi: int = DPI,
    only: set[str] | None = None,
) -> list[dict[str, Any]]:
    """Build every figure, draw them in a process pool, write ``manifest.json``; returns the manifest."""
    inputs = load_inputs(config, aggregate_dir)
    manifest, tasks = [], []
    with FileSet(out_dir) as files:
        for spec in figure_specs(inputs.models):
            if only is not None and spec.id not in only:
                continue
            figure = {
                "id": spec.id,
                "number": spec.number,
                "section": spec.section,
                "title": spec.title,
                "caption": spec.caption,
                "model": spec.model,
                "files": None,
            }
            data, opts = spec.build(inputs)
            if data.empty:
                figure["missing"] = "no data"
            else:
                figure["files"] = [f"{spec.id}.{ext}" for ext in ("png", "svg")]
                paths = {ext: str(files.path(f"{spec.id}.{ext}")) for ext in ("png", "svg")}
                tasks.append((spec.kind, spec.title, data, opts, paths, dpi))
            manifest.append(figure)
        workers = workers or min(len(os.sched_getaffinity(0)), 8)
        if workers <= 1:
            for task in tasks:
                _render(task)
        else:
            # forkserver: workers never inherit the parent's pyarrow/BLAS threads (fork-safety).
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(["procexec.analysis.figures"])
            pool = ProcessPoolExecutor(workers, mp_context=context)
            try:
                list(pool.map(_render, tasks, chunksize=4))
            finally:  # an error or an interrupt: queued figures are not drawn
                pool.shutdown(wait=True, cancel_futures=True)
        with files.open("manifest.json") as handle:
            handle.write(dumps({"figures": manifest}) + "\n")
    return manifest

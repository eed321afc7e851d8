"""The figures' quantities: each builder turns the inputs into a small tidy frame and the plotting options.

A builder returns (tidy frame, plotting options); an empty frame means "no data
for this figure" and is recorded as missing in the manifest.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from procexec.analysis.figures.inputs import ERROR_CLASS_LABELS, Inputs
from procexec.records import INPUT_TYPES

RANGE_ORDER = ["0-1", "1-10", "10-100"]
TYPE_ORDER = list(INPUT_TYPES)
CORRECTNESS_ORDER = ["correct", "incorrect"]

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

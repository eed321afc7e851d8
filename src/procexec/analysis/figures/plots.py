"""The four ways a figure is drawn (lines, heatmap, boxes, stacked bars), and drawing one into its files.

Every helper takes a tidy frame with fixed column names -- x, y, hue, style, panel,
lo, hi (lines); row, col, value (heatmap); x, q05..q95 (boxes); panel, x, part,
share (stacked bars) -- plus keyword options, and returns the Figure.  The only
module of the package that imports matplotlib and seaborn.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402


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
        sub = axes[0].inset_axes((0.64, 0.58, 0.34, 0.38))
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
    stats: list[dict[str, Any]] = [
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


def render(task: tuple[str, str, pd.DataFrame, dict[str, Any], dict[str, str], int]) -> None:
    """Draw one figure into its files (``{extension: path}``, PNG and SVG); runs in a worker process."""
    kind, title, data, opts, paths, dpi = task
    sns.set_theme(style="whitegrid", context="paper")
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, faster SVG
    fig = PLOTTERS[kind](data, title=title, **opts)
    for ext, path in paths.items():
        fig.savefig(path, format=ext, dpi=dpi)
    plt.close(fig)

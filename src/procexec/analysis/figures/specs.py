"""Every figure of the report, in report order: id, the paper's number, section, title, caption, plot, builder."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import pandas as pd

from procexec.analysis.figures.builders import (
    CORRECTNESS_ORDER,
    RANGE_ORDER,
    TYPE_ORDER,
    Built,
    answer_position,
    error_mix,
    faa_by_dimension,
    faa_by_model,
    first_divergence,
    heatmap,
    lookback_degradation,
    median_expected,
    metrics_per_model_panel,
    step_following,
)
from procexec.analysis.figures.inputs import Inputs
from procexec.records import OPERATORS

# Paper's Figures 11-13 split the models by scale.
MODEL_GROUP_FIGURES = (("11", ("small", "mid")), ("12", ("large", "very-large")), ("13", ("frontier", "others")))
# Appendix G: one figure per model per series, numbered 20 + 15 * series + model index in the paper.
G_SERIES = ("G.1", "G.2", "G.3", "G.4", "G.5", "G.6", "G.7")


@dataclass(frozen=True)
class FigureSpec:
    id: str
    number: str  # the paper's figure number, or "X<n>" beyond the paper
    section: str  # report section: main, C, D, E, F, G, X
    title: str
    caption: str
    kind: str  # key of procexec.analysis.figures.plots.PLOTTERS
    build: Callable[[Inputs], Built] = field(compare=False, repr=False)
    model: str | None = None


def _for_model(build: Callable[[Inputs, str], Built], model: str) -> Callable[[Inputs], Built]:
    """``build`` of one model's figure (bound here: the loop's variables move on)."""
    return lambda inputs: build(inputs, model)


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
                functools.partial(median_expected, dim=None, order=CORRECTNESS_ORDER, panel_groups=groups),
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
                    _for_model(build, key),
                    model=key,
                )
            )
    return specs

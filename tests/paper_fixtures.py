"""Score rows and references built to match the paper's published numbers (tests/analysis/test_reproduction.py).

Each published number that comes from score rows is a linear equation in the rates
of FAA, CAA, PAR and the step-following shares per (model, dataset, length) group
(a relative difference too, once its value is fixed; a bound is aimed just past
it).  Alternating projections find rates that satisfy every equation and stay
valid rates (FAA <= CAA <= PAR, shares summing to one); cumulative rounding then
turns them into 0/1 example rows with every group's sum right to one example.
The equations are read from the data file, not written here: a number added to
it is matched as well.  The rows are ``report_fixtures.synthetic_scores`` with
their faa, caa, parseable and step_following columns replaced.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from procexec.analysis.paper_numbers import PaperNumbers, PublishedNumber
from procexec.benchmark.executor import format_value
from procexec.records import Reference
from report_fixtures import synthetic_scores

RATES = ("faa", "caa", "par", "sfb_exact", "sfb_under")  # sfb_over = 1 - exact - under
BOUND_MARGIN = 1.0  # a bound ("more than 55") is aimed this far past, in the number's unit


def targets(paper: PaperNumbers, shift: tuple[str, float] | None = None) -> dict[str, float]:
    """The value each score-based number is built to have: the paper's, or one model's moved by ``shift``.

    A shifted model's step-following changes keep summing to zero: exact and over move
    up by the shift, under down by twice it; a bound is missed by the shift.
    """
    out = {}
    for number in paper.numbers:
        if number.from_references:
            continue
        value = number.value + (BOUND_MARGIN if number.rule == "bound" else 0.0)
        if shift is not None and number.model == shift[0]:
            metric = number.terms[0][0]
            sign = -1.0 if number.rule == "bound" else -2.0 if metric == "sfb_under" else 1.0
            value += sign * shift[1]
        out[number.id] = value
    return out


class _Layout:
    """Index of each rate variable: (rate, model, dataset, length) -> position in one flat vector."""

    def __init__(self, paper: PaperNumbers) -> None:
        self.models = paper.models
        self.cells = [(spec.id, length) for spec in paper.datasets for length in paper.lengths]
        self.size = len(RATES) * len(self.models) * len(self.cells)

    def block(self, rate: str, model: str) -> slice:
        start = (RATES.index(rate) * len(self.models) + self.models.index(model)) * len(self.cells)
        return slice(start, start + len(self.cells))

    def mean_form(self, paper: PaperNumbers, number: PublishedNumber, term: int) -> tuple[np.ndarray, float]:
        """(coefficients, constant) of a term: the selection's mean rate, averaged over the number's models."""
        metric, selection = number.terms[term]
        chosen = paper.cells(selection)
        weights = np.array([cell in chosen for cell in self.cells], dtype=float) / len(chosen) / len(number.models)
        row, constant = np.zeros(self.size), 0.0
        for model in number.models:
            if metric == "sfb_over":
                row[self.block("sfb_exact", model)] -= weights
                row[self.block("sfb_under", model)] -= weights
                constant += weights.sum()
            else:
                row[self.block(metric, model)] += weights
        return row, constant


def _equations(
    paper: PaperNumbers, layout: _Layout, wanted: dict[str, float]
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows, right-hand sides and allowed residuals (the number's rounding, as a rate)."""
    rows, rhs, slack = [], [], []
    for number in paper.numbers:
        if number.id not in wanted:
            continue
        scale = 1.0 if number.unit == "fraction" else 100.0
        target = wanted[number.id] / scale
        slack.append(number.rounding / scale + 1e-9)
        forms = [layout.mean_form(paper, number, i) for i in range(len(number.terms))]
        if number.statistic == "value":
            ((a, c),) = forms
            rows.append(a)
            rhs.append(target - c)
        elif number.statistic == "difference":
            (a0, c0), (a1, c1) = forms
            rows.append(a0 - a1)
            rhs.append(target - c0 + c1)
        else:  # relative: (t0 - t1) / t0 = r  <=>  (1 - r) t0 - t1 = 0
            (a0, c0), (a1, c1) = forms
            rows.append((1 - target) * a0 - a1)
            rhs.append(c1 - (1 - target) * c0)
    return np.array(rows), np.array(rhs), np.array(slack)


def _valid_rates(v: np.ndarray) -> None:
    """One round of projections onto: 0 <= faa <= caa <= par <= 1, exact, under >= 0, exact + under <= 1."""
    np.clip(v, 0.0, 1.0, out=v)
    for low, high in ((0, 1), (1, 2), (0, 1)):
        crossed = v[low] > v[high]
        middle = (v[low] + v[high]) / 2
        v[low] = np.where(crossed, middle, v[low])
        v[high] = np.where(crossed, middle, v[high])
    excess = np.maximum(v[3] + v[4] - 1.0, 0.0) / 2
    v[3] -= excess
    v[4] -= excess
    np.clip(v, 0.0, 1.0, out=v)


def matching_rates(paper: PaperNumbers, wanted: dict[str, float], iterations: int = 500) -> np.ndarray:
    """Rates (RATES x models x cells) whose published statistics take the ``wanted`` values.

    The paper's rounded step-following changes do not always sum to zero (NM-30:
    1.1 - 38.9 + 37.9); such equations are met in least squares, within the rounding.
    The (model, cell) pairs whose rates have the same coefficients in every equation
    start equal and stay equal: the projections run on one pair of each kind.
    """
    layout = _Layout(paper)
    a, b, slack = _equations(paper, layout, wanted)
    pairs = a.reshape(len(a), len(RATES), -1)  # equation x rate x (model, cell)
    seen: dict[bytes, int] = {}
    kind = np.array([seen.setdefault(column.tobytes(), len(seen)) for column in pairs.reshape(-1, pairs.shape[-1]).T])
    first = np.unique(kind, return_index=True)[1]
    kinds = pairs[:, :, first].reshape(len(a), -1)  # one pair of each kind
    forward = kinds * np.tile(np.bincount(kind), len(RATES))  # a kind's coefficients, summed over its pairs
    back = kinds.T @ np.linalg.pinv(a @ a.T)
    start = {"faa": 0.3, "caa": 0.3, "par": 0.8, "sfb_exact": 0.6, "sfb_under": 0.3}
    v = np.array([np.full(len(first), start[r]) for r in RATES])
    for _ in range(iterations):
        v -= (back @ (forward @ v.ravel() - b)).reshape(v.shape)
        _valid_rates(v)
    x = v[:, kind]
    residual = np.abs(a @ x.ravel() - b)
    assert (residual <= slack).all(), f"the published numbers could not all be matched ({residual.max():.2e})"
    return x.reshape(len(RATES), len(layout.models), len(layout.cells))


def _cumulative_counts(rates: np.ndarray, per_cell: int) -> np.ndarray:
    """Whole examples per group whose running total, in a shuffled group order, stays within one example.

    The shuffle keeps the rounding of any structured subset (every length-5 group, say)
    from leaning one way, as it would in the groups' periodic natural order.
    """
    order = np.random.default_rng(0).permutation(rates.size)
    totals = np.round(np.cumsum(rates.ravel()[order] * per_cell))
    counts = np.empty(rates.size, dtype=int)
    counts[order] = np.diff(totals, prepend=0.0).astype(int)
    return counts.reshape(rates.shape)


def matching_scores(
    paper: PaperNumbers, models: pd.DataFrame, wanted: dict[str, float], per_cell: int = 100
) -> pd.DataFrame:
    """Score rows of every paper model (config keys of ``models``) on the paper's whole suite."""
    rates = matching_rates(paper, wanted)
    layout = _Layout(paper)
    faa = _cumulative_counts(rates[0], per_cell)
    caa = faa + _cumulative_counts(np.maximum(rates[1] - rates[0], 0), per_cell)
    par = np.minimum(caa + _cumulative_counts(np.maximum(rates[2] - rates[1], 0), per_cell), per_cell)
    over = _cumulative_counts(np.maximum(1 - rates[3] - rates[4], 0), per_cell)  # mostly exactly 0
    exact = np.minimum(_cumulative_counts(rates[3], per_cell), per_cell - over)
    under = per_cell - exact - over
    keys = dict(zip(models["abbrev"], models["model"]))
    frame = synthetic_scores(
        [keys[m] for m in layout.models], [spec.id for spec in paper.datasets], list(paper.lengths), per_cell
    )
    # synthetic_scores orders rows by model, dataset, length, index: the layout's order.
    cell = np.repeat(np.arange(len(layout.models) * len(layout.cells)), per_cell)
    index = frame["index"].to_numpy()
    frame["faa"] = index < faa.ravel()[cell]
    frame["caa"] = index < caa.ravel()[cell]
    frame["parseable"] = index < par.ravel()[cell]
    frame["step_following"] = np.select(
        [index < exact.ravel()[cell], index < (exact + under).ravel()[cell]], ["exact", "under"], "over"
    )
    return frame


def write_matching_references(
    paper: PaperNumbers, directory: Path, per_cell: int = 20, moved: dict[tuple[str, str], float] | None = None
) -> list[Path]:
    """Base-suite references whose Appendix A finals have the paper's Table 4 statistics (nearly).

    Per operator: the paper's min and max once, copies of the largest magnitude so the
    standard deviation comes out near the paper's, the median everywhere else;
    ``moved`` multiplies some (operator, statistic) targets.
    """
    wanted = {(dict(n.terms[0][1])["operator"][0], n.statistic): n.value for n in paper.numbers if n.from_references}
    for key, factor in (moved or {}).items():
        wanted[key] *= factor
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for operator in sorted({op for op, _ in wanted}):
        specs = [s for s in paper.datasets if s.operator == operator and s.lookback == 1]
        n = len(specs) * len(paper.lengths) * per_cell
        low, high, median, std = (wanted[operator, s] for s in ("min", "max", "median", "std"))
        largest = high if abs(high) >= abs(low) else low
        copies = 1 if not np.isfinite(std) else max(1, round(n * (std / largest) ** 2))
        values = np.full(n, median)
        values[:2] = low, high
        values[2 : 1 + copies] = largest
        finals = iter(values)
        for spec in specs:
            path = directory / f"{spec.id}.jsonl"
            with open(path, "w") as handle:
                for length in paper.lengths:
                    for index in range(per_cell):
                        value = float(next(finals))
                        final = format_value(value)
                        reference = Reference(
                            id=f"{spec.id}:{length}:{index}",
                            dataset=spec.id,
                            length=length,
                            index=index,
                            semantics="default",
                            final=final,
                            final_float=value if math.isfinite(value) else None,
                            final_type="float",
                            trace=["1.0", "2.0", *[final] * length],
                            edge_cases=[],
                            appendix_a_final=final,
                            appendix_a_disagrees=False,
                        )
                        handle.write(json.dumps(reference.to_json()) + "\n")
            paths.append(path)
    return paths

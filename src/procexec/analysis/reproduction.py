"""Did it reproduce? The paper's published numbers beside ours, each with a verdict.

The numbers come from ``procexec.analysis.paper_numbers`` (every cell of Tables 2-4
and each quantitative claim of the text, with what it measures).  Ours come from
the per-example score rows (Table 4: from the references), with 95% bootstrap
intervals from ``procexec.analysis.aggregate``'s machinery.  Each selection of examples
draws its own stream, so the two groups of a difference are resampled
independently; the models of a cross-model number answered the same examples and
are resampled together.  The whole-suite selection draws aggregate's own stream,
so Table 3's intervals equal ``metrics.parquet``'s.  Rules: docs/decisions.md.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from procexec.analysis.aggregate import METRICS, example_columns, metric_ratios, resample_counts, resample_sums
from procexec.analysis.latex import LatexColumn, to_latex
from procexec.analysis.paper_numbers import (
    REFERENCE_STATISTICS,
    PaperNumbers,
    PublishedNumber,
    Selection,
    selection_text,
)
from procexec.benchmark import table4 as table4_core
from procexec.errors import ProcexecError
from procexec.io.formats import MISSING, format_interval, format_number, is_missing
from procexec.io.jsonl import read_jsonl

TABLE_ID = "reproduction"
VERDICTS = ("agrees", "differs", "not run")
MAGNITUDE_TOLERANCE = 1.0  # Table 4: one order of magnitude at least (see _magnitude_row)
SCORE_INPUT_COLUMNS = [
    "model",
    "dataset",
    "length",
    "input_type",
    "input_range",
    "operator",
    "lookback",
    "faa",
    "caa",
    "parseable",
    "answer_position",
    "step_following",
    "tolerance_match",
    "truncated",
    "num_generated_tokens",
]
COLUMNS = [
    "id",
    "source",
    "model",
    "model_key",
    "averaged_over",
    "metric",
    "statistic",
    "formula",
    "unit",
    "measures",
    "paper_value",
    "paper_half_width",
    "paper_decimals",
    "ours",
    "ours_ci_low",
    "ours_ci_high",
    "ours_half_width",
    "difference",
    "tolerance",
    "rule",
    "verdict",
    "note",
    "explained_by",
]


class _Estimates:
    """Point estimates and bootstrap replicates of every metric, per (selection, model), computed once."""

    def __init__(self, scores: pd.DataFrame, keys: Iterable[str], resamples: int, seed: int) -> None:
        self.resamples, self.seed = resamples, seed
        self.rows = {
            key: frame.reset_index(drop=True) for key, frame in scores.groupby("model", sort=False) if key in set(keys)
        }
        self.values = {key: example_columns(frame) for key, frame in self.rows.items()}
        self.cells = {key: _cells(frame) for key, frame in self.rows.items()}
        self.factorized: dict[tuple[str, str], tuple[np.ndarray, pd.Index]] = {}
        self.cache: dict[Selection, dict[str, tuple[np.ndarray, np.ndarray]]] = {}

    def _isin(self, key: str, column: str, allowed: tuple[Any, ...]) -> np.ndarray:
        """``rows[key][column].isin(allowed)``, asked of each distinct value once: most selections share columns."""
        if (key, column) not in self.factorized:
            self.factorized[key, column] = pd.factorize(self.rows[key][column], use_na_sentinel=False)
        codes, uniques = self.factorized[key, column]
        return uniques.isin(allowed)[codes]

    def get(self, selection: Selection) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """model -> (metrics, replicates x metrics); models with the same group size share their draws."""
        if selection not in self.cache:
            by_size: dict[int, list[tuple[str, np.ndarray]]] = defaultdict(list)
            for key, frame in self.rows.items():
                mask = np.ones(len(frame), dtype=bool)
                for column, allowed in selection:
                    mask &= self._isin(key, column, allowed)
                by_size[int(mask.sum())].append((key, self.values[key][mask]))
            found = {}
            for size, group in by_size.items():
                if size == 0:
                    continue
                stacked = np.hstack([values for _, values in group])  # examples x (models x columns)
                point = metric_ratios(stacked.sum(axis=0).reshape(len(group), -1))
                sums = resample_sums(stacked, self.resamples, self.seed, _stream(selection))
                boot = metric_ratios(sums.reshape(len(sums), len(group), -1))
                for i, (key, _) in enumerate(group):
                    found[key] = (point[i], boot[:, i])
            self.cache[selection] = found
        return self.cache[selection]


def _cells(frame: pd.DataFrame) -> set[tuple[str, int]]:
    """The (dataset, length) groups a model's rows cover."""
    unique = frame[["dataset", "length"]].drop_duplicates()
    return set(zip(unique["dataset"].tolist(), unique["length"].tolist()))


def _stream(selection: Selection) -> tuple[int, ...]:
    """The selection's own random stream; the whole suite keeps aggregate's (seed, n) stream."""
    if not selection:
        return ()
    digest = hashlib.sha256(json.dumps(selection).encode()).digest()
    return tuple(int.from_bytes(digest[i : i + 4], "big") for i in range(0, 16, 4))


def _combine(statistic: str, terms: list[np.ndarray]) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        if statistic == "difference":
            return terms[0] - terms[1]
        if statistic == "relative_difference":
            return (terms[0] - terms[1]) / terms[0]
        return terms[0]


def _missing_note(
    number: PublishedNumber, study: dict[str, str], estimates: _Estimates, paper: PaperNumbers
) -> str | None:
    """Why a score-based number cannot be compared, or None when every model covers every group it needs."""
    absent = [m for m in number.models if m not in study]
    unscored = [m for m in number.models if m in study and study[m] not in estimates.rows]
    reasons = []
    if absent:
        reasons.append(
            f"none of its {len(absent)} models is in this study"
            if len(absent) == len(number.models) > 1
            else f"not in this study: {', '.join(absent)}"
        )
    if unscored:
        reasons.append(f"no scores: {', '.join(unscored)}")
    for _, selection in number.terms:
        needed = paper.cells(selection)
        for abbrev in number.models:
            if abbrev in study and study[abbrev] in estimates.rows:
                lacking = len(needed - estimates.cells[study[abbrev]])
                if lacking:
                    scope = selection_text(selection) if selection else "the suite"
                    reasons.append(f"{abbrev} lacks {lacking} of the {len(needed)} (dataset, length) groups of {scope}")
    return "; ".join(dict.fromkeys(reasons)) or None


def _score_row(
    number: PublishedNumber, study: dict[str, str], estimates: _Estimates, paper: PaperNumbers
) -> dict[str, Any]:
    note = _missing_note(number, study, estimates, paper)
    if note is not None:
        return {"verdict": "not run", "note": note}
    terms_point, terms_boot = [], []
    for metric, selection in number.terms:
        found = estimates.get(selection)
        column = METRICS.index(metric)
        keys = [study[m] for m in number.models]
        terms_point.append(np.mean([found[k][0][column] for k in keys]))
        terms_boot.append(np.mean([found[k][1][:, column] for k in keys], axis=0))
    scale = 1.0 if number.unit == "fraction" else 100.0
    ours = float(_combine(number.statistic, terms_point)) * scale
    replicates = _combine(number.statistic, terms_boot) * scale
    low, high = np.nanpercentile(replicates, [2.5, 97.5]) if np.isfinite(replicates).any() else (math.nan, math.nan)
    half_width = (high - low) / 2
    # The paper's own sampling error, where it prints none, is taken to be ours: same design, same sizes.
    paper_half_width = number.half_width if number.half_width is not None else half_width
    tolerance = math.hypot(half_width, paper_half_width) + number.rounding
    difference = ours - number.value
    agrees = difference > -tolerance if number.rule == "bound" else abs(difference) <= tolerance
    return {
        "ours": ours,
        "ours_ci_low": float(low),
        "ours_ci_high": float(high),
        "ours_half_width": half_width,
        "difference": difference,
        "tolerance": tolerance,
        "verdict": "agrees" if agrees else "differs",
        "note": number.note,
    }


def _reference_cells(paths: Iterable[Path]) -> set[tuple[str, int]]:
    return {(obj["dataset"], obj["length"]) for path in paths for _, obj in read_jsonl(path)}


def statistic_replicates(
    values: Iterable[float], resamples: int, seed: int, stream: tuple[int, ...] = ()
) -> dict[str, np.ndarray]:
    """Table 4's statistics (NaN left out, as procexec.benchmark.table4) on each bootstrap resample of the values.

    The resamples are aggregate's count matrices over the sorted values, so every
    statistic is read off the running count: the median where it passes the middle,
    the minimum where it leaves 0, the maximum where it reaches n.
    """
    array = np.asarray(list(values), dtype=np.float64)
    ordered = np.sort(array[~np.isnan(array)])
    n = len(ordered)
    out: dict[str, list[np.ndarray]] = {stat: [] for stat in REFERENCE_STATISTICS}
    if n == 0:
        return {stat: np.empty(0) for stat in REFERENCE_STATISTICS}
    for counts in resample_counts(n, resamples, seed, stream):
        running = np.cumsum(counts, axis=1)
        out["median"].append(
            (ordered[(running > (n - 1) // 2).argmax(axis=1)] + ordered[(running > n // 2).argmax(axis=1)]) / 2
        )
        out["min"].append(ordered[(running > 0).argmax(axis=1)])
        out["max"].append(ordered[(running >= n).argmax(axis=1)])
        with np.errstate(over="ignore", invalid="ignore"):  # 1e190 squared overflows: std inf, as the paper's
            mean = counts @ ordered / n
            out["std"].append(np.sqrt((counts * (ordered - mean[:, None]) ** 2).sum(axis=1) / (n - 1)))
    return {stat: np.concatenate(parts) for stat, parts in out.items()}


def _magnitude_row(number: PublishedNumber, ours: float, replicates: np.ndarray) -> dict[str, Any]:
    """Orders of magnitude apart, against one order or the two suites' sampling spread if wider.

    The spread is the 95% bootstrap half-width of log10|statistic|, ours standing in
    for the paper's: the heavy-tailed extremes (div, mixed) move by many orders with
    the seed alone (benchmarks/table4_seed_spread.py), the medians by little.
    """
    usable = replicates[np.isfinite(replicates)]
    low, high = np.percentile(usable, [2.5, 97.5]) if usable.size else (math.nan, math.nan)
    same_sign = usable[(usable != 0) & (np.sign(usable) == np.sign(ours))]
    logs = np.log10(np.abs(same_sign))
    spread = (np.percentile(logs, 97.5) - np.percentile(logs, 2.5)) / 2 if logs.size else 0.0
    tolerance = max(MAGNITUDE_TOLERANCE, math.sqrt(2) * spread)
    gap = table4_core._log10_gap(ours, number.value)  # 0 when equal (0, inf); NaN when not comparable
    return {
        "ours": ours,
        "ours_ci_low": float(low),
        "ours_ci_high": float(high),
        "difference": gap,
        "tolerance": tolerance,
        "verdict": "agrees" if gap <= tolerance else "differs",
        "note": number.note,
    }


def _reference_rows(
    numbers: list[PublishedNumber], reference_files: Iterable[Path], paper: PaperNumbers, resamples: int, seed: int
) -> dict[str, dict[str, Any]]:
    """Table 4 rows, over what the paper's (Appendix A) executor returned, as the paper's table is."""
    if not numbers:
        return {}
    base = {spec.id for spec in paper.datasets if spec.lookback == 1}
    paths = sorted(p for p in map(Path, reference_files) if p.name.removesuffix(".jsonl") in base)
    present = _reference_cells(paths)
    finals = table4_core.base_suite_finals(paths, table4_core.TABLE4_SEMANTICS)
    stats = table4_core.table4(finals)
    replicates: dict[Selection, dict[str, np.ndarray]] = {}
    rows = {}
    for number in numbers:
        selection = number.terms[0][1]
        needed = paper.cells(selection)
        lacking = len(needed - present)
        if lacking:
            rows[number.id] = {
                "verdict": "not run",
                "note": f"the references lack {lacking} of the {len(needed)} (dataset, length) groups",
            }
            continue
        (operator,) = dict(selection)["operator"]
        if selection not in replicates:
            replicates[selection] = statistic_replicates(finals[operator], resamples, seed, _stream(selection))
        ours = float(stats.loc[operator, number.statistic]) if operator in stats.index else math.nan  # all NaN
        rows[number.id] = _magnitude_row(number, ours, replicates[selection][number.statistic])
    return rows


def study_abbrevs(models: pd.DataFrame, paper: PaperNumbers) -> dict[str, str]:
    """Paper abbreviation -> the study's model key (matched on config.yaml's ``abbrev``)."""
    study: dict[str, str] = {}
    for key, abbrev in zip(models["model"], models["abbrev"]):
        if abbrev in paper.models:
            if abbrev in study:
                raise ProcexecError(f"models {study[abbrev]!r} and {key!r} both have the paper's abbrev {abbrev!r}")
            study[abbrev] = key
    return study


def outside_comparison(models: pd.DataFrame, paper: PaperNumbers) -> pd.DataFrame:
    """The study's models that are not the paper's: listed, never compared."""
    return models[~models["abbrev"].isin(paper.models)].reset_index(drop=True)


def reproduction_table(
    paper: PaperNumbers,
    scores: pd.DataFrame,
    models: pd.DataFrame,
    reference_files: Iterable[Path],
    resamples: int = 1000,
    seed: int = 0,
) -> pd.DataFrame:
    """One row per published number (data file order): paper, ours with its 95% interval, verdict."""
    if resamples < 1:
        raise ProcexecError("the reproduction table needs bootstrap intervals: resamples must be at least 1")
    study = study_abbrevs(models, paper)
    in_suite = scores["dataset"].isin({spec.id for spec in paper.datasets}) & scores["length"].isin(paper.lengths)
    estimates = _Estimates(scores[in_suite], study.values(), resamples, seed)
    from_references = _reference_rows(
        [n for n in paper.numbers if n.from_references], reference_files, paper, resamples, seed
    )
    rows = []
    for number in paper.numbers:
        computed = from_references[number.id] if number.from_references else _score_row(number, study, estimates, paper)
        rows.append(
            {
                "id": number.id,
                "source": number.source,
                "model": number.model,
                "model_key": study.get(number.model) if number.model else None,
                "averaged_over": None if number.model or number.from_references else ";".join(number.models),
                "metric": ";".join(dict.fromkeys(m for m, _ in number.terms)),
                "statistic": number.statistic,
                "formula": number.formula,
                "unit": number.unit,
                "rule": number.rule,
                "measures": number.measures,
                "paper_value": number.value,
                "paper_half_width": number.half_width,
                "paper_decimals": number.decimals,
                "explained_by": ";".join(number.explained_by) or None,
                **computed,
            }
        )
    frame = pd.DataFrame(rows).reindex(columns=COLUMNS)
    frame["paper_decimals"] = frame["paper_decimals"].astype("Int64")
    return frame


def summary(frame: pd.DataFrame) -> dict[str, int]:
    counts = frame["verdict"].value_counts()
    return {"total": len(frame), **{verdict: int(counts.get(verdict, 0)) for verdict in VERDICTS}}


def summary_line(frame: pd.DataFrame) -> str:
    s = summary(frame)
    return f"{s['agrees']} of {s['total']} published numbers reproduced; {s['differs']} differ; {s['not run']} not run"


def model_text(row: pd.Series) -> str:
    """The model column: its abbreviation, the models a cross-model number averages, or the suite (Table 4)."""
    if isinstance(row["model"], str):
        return row["model"]
    if isinstance(row["averaged_over"], str):
        return f"mean of {len(row['averaged_over'].split(';'))} models"
    return "suite"


def paper_text(row: pd.Series) -> str:
    text = format_number(row["paper_value"], row["paper_decimals"])
    if not is_missing(row["paper_half_width"]):
        text += f" ± {format_number(row['paper_half_width'], row['paper_decimals'])}"
    return f"> {text}" if row["rule"] == "bound" else text


def _our_decimals(row: pd.Series) -> int | None:
    """Ours keep at least two decimals: the paper's "43" must not hide a 42.6."""
    return None if pd.isna(row["paper_decimals"]) else max(int(row["paper_decimals"]), 2)


def ours_text(row: pd.Series) -> str:
    if row["verdict"] == "not run":
        return MISSING
    return format_interval(row["ours"], row["ours_ci_low"], row["ours_ci_high"], _our_decimals(row))


def difference_text(row: pd.Series) -> str:
    """Ours minus the paper's and what it is held against (Table 4: orders of magnitude apart)."""
    if row["verdict"] == "not run":
        return MISSING
    if row["rule"] == "magnitude":
        if is_missing(row["difference"]):
            return "not comparable: sign, zero or infinity differ"
        return (
            f"{format_number(row['difference'], 2)} orders of magnitude (at most {format_number(row['tolerance'], 2)})"
        )
    decimals = _our_decimals(row)
    tolerance = format_number(row["tolerance"], decimals)
    held = f"above -{tolerance}" if row["rule"] == "bound" else f"within ±{tolerance}"
    return f"{format_number(row['difference'], decimals)} ({held})"


def reproduction_latex(frame: pd.DataFrame) -> str:
    view = pd.DataFrame(
        {
            "source": frame["source"],
            "model": frame.apply(model_text, axis=1),
            "paper": frame.apply(paper_text, axis=1),
            "ours": frame.apply(ours_text, axis=1),
            "verdict": frame["verdict"],
        }
    )
    return to_latex(
        view,
        [
            LatexColumn("Number", "source"),
            LatexColumn("Model", "model"),
            LatexColumn("Paper", "paper", align="r"),
            LatexColumn("Ours [95% CI]", "ours", align="r"),
            LatexColumn("Verdict", "verdict"),
        ],
        f"The paper's published numbers beside ours: {summary_line(frame)}.",
        "tab:reproduction",
    )

"""Aggregation: per-example score rows -> tidy metric tables with 95% bootstrap intervals.

The bootstrap resamples examples within each group (the paper's Table 3) with a
fixed seed.  Resample draws depend only on (seed, group size) and, for callers
that need groups resampled independently of each other (procexec.analysis.reproduction),
a stream key; they are turned into count matrices once per size, and every
metric of a group is one matrix product ``counts @ values``: no Python loop per
resample.  Definitions: docs/scoring.md.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Iterable, Iterator

import numpy as np
import pandas as pd

METRICS = (
    "faa",
    "caa",
    "par",
    "ap",
    "sfb_exact",
    "sfb_under",
    "sfb_over",
    "tolerance_accuracy",
    "truncation_rate",
    "mean_generated_tokens",
)
GROUP_COLUMNS = ("dataset", "length", "input_range", "input_type", "operator", "lookback")
GROUPINGS: tuple[tuple[str, ...], ...] = (
    (),
    ("dataset",),
    ("length",),
    ("dataset", "length"),
    ("input_range", "length"),
    ("input_type", "length"),
    ("operator", "length"),
    ("lookback", "length"),
    ("input_range",),
    ("input_type",),
    ("operator",),
    ("lookback",),
)
# Column name -> Arrow type name of metrics.parquet, in order (docs/interfaces.md).
METRIC_TYPES: dict[str, str] = {
    "model": "string", "grouping": "string", "dataset": "string", "length": "int64", "input_range": "string",
    "input_type": "string", "operator": "string", "lookback": "int64", "metric": "string", "value": "float64",
    "ci_low": "float64", "ci_high": "float64", "n": "int64",
}  # fmt: skip
METRIC_COLUMNS = list(METRIC_TYPES)
_CHUNK_CELLS = 4_000_000  # resample-count cells built at once (memory bound)
_COUNT_CELLS = 65_536  # counters of one bincount (512 KiB: the cache)
_CACHE_CELLS = 2_000_000  # count matrices up to this size are reused across groups


def grouping_name(keys: tuple[str, ...]) -> str:
    return "+".join(keys) if keys else "overall"


def example_columns(scores: pd.DataFrame) -> np.ndarray:
    """Per-example numerators and denominators: metric = sum(num) / sum(den) over a resample."""
    ones = np.ones(len(scores))
    has_ap = scores["answer_position"].notna().to_numpy(dtype=float)
    sfb = scores["step_following"].to_numpy()
    return np.column_stack(
        [
            scores["faa"].to_numpy(dtype=float),
            scores["caa"].to_numpy(dtype=float),
            scores["parseable"].to_numpy(dtype=float),
            scores["answer_position"].fillna(0.0).to_numpy(dtype=float),
            (sfb == "exact").astype(float),
            (sfb == "under").astype(float),
            (sfb == "over").astype(float),
            scores["tolerance_match"].to_numpy(dtype=float),
            scores["truncated"].to_numpy(dtype=float),
            scores["num_generated_tokens"].to_numpy(dtype=float),
            ones,
            has_ap,
        ]
    )


def _denominators(sums: np.ndarray) -> np.ndarray:
    """Column sums -> per-metric denominators (AP is averaged over examples that have one)."""
    den = np.repeat(sums[..., 10:11], len(METRICS), axis=-1)
    den[..., 3] = sums[..., 11]
    return den


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def resample_counts(n: int, resamples: int, seed: int, stream: tuple[int, ...] = ()) -> Iterator[np.ndarray]:
    """Bootstrap count matrices (rows = resamples), in chunks; a function of (seed, n, stream) only.

    A chunk's draws are counted a block of rows at a time: one bincount over the whole
    chunk scatters into chunk-many counters, far outside the cache.
    """
    rng = np.random.default_rng([seed, n, *stream])
    rows = max(1, _CHUNK_CELLS // n)
    per_count = max(1, _COUNT_CELLS // n)
    for start in range(0, resamples, rows):
        drawn = rng.integers(0, n, size=(min(rows, resamples - start), n))
        counts = np.empty(drawn.shape)
        for first in range(0, len(drawn), per_count):
            block = drawn[first : first + per_count]
            block += (np.arange(len(block)) * n)[:, None]
            counts[first : first + len(block)] = np.bincount(block.ravel(), minlength=block.size).reshape(block.shape)
        yield counts


@functools.lru_cache(maxsize=8)
def _cached_counts(n: int, resamples: int, seed: int, stream: tuple[int, ...]) -> np.ndarray:
    return np.vstack(list(resample_counts(n, resamples, seed, stream)))


def resample_sums(values: np.ndarray, resamples: int, seed: int, stream: tuple[int, ...] = ()) -> np.ndarray:
    """Column sums of ``values`` over each bootstrap resample of its rows (resamples x columns).

    ``values`` may hold the columns of several models side by side: with the same
    rows (the same examples) they are resampled together, which pairs the models.
    """
    n = len(values)
    chunks: Iterable[np.ndarray]
    if n * resamples <= _CACHE_CELLS:
        chunks = [_cached_counts(n, resamples, seed, stream)]
    else:
        chunks = resample_counts(n, resamples, seed, stream)
    return np.vstack([c @ values for c in chunks])


def metric_ratios(sums: np.ndarray) -> np.ndarray:
    """Sums of the per-example columns (last axis, as ``example_columns``) -> the METRICS values."""
    return _ratio(sums[..., :10], _denominators(sums))


def bootstrap(values: np.ndarray, resamples: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Point estimates and 95% percentile intervals of every metric for one group of examples."""
    point = metric_ratios(values.sum(axis=0))
    if resamples <= 0:
        return point, np.full_like(point, np.nan), np.full_like(point, np.nan)
    boot = metric_ratios(resample_sums(values, resamples, seed))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a metric with no defined resample (AP without answers)
        low, high = np.nanpercentile(boot, [2.5, 97.5], axis=0)
    return point, low, high


def aggregate(scores: pd.DataFrame, resamples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Tidy metrics: one row per (model, grouping, group values, metric)."""
    rows: list[dict] = []
    for model, model_scores in scores.groupby("model", sort=True):
        values = example_columns(model_scores)
        has_ap = model_scores["answer_position"].notna().to_numpy()
        for keys in GROUPINGS:
            groups = (
                [((), np.arange(len(model_scores)))]
                if not keys
                else model_scores.groupby(list(keys), sort=True).indices.items()
            )
            for group_values, positions in groups:
                group_values = group_values if isinstance(group_values, tuple) else (group_values,)
                point, low, high = bootstrap(values[positions], resamples, seed)
                filled = dict(zip(keys, group_values))
                n_all, n_ap = len(positions), int(has_ap[positions].sum())
                for i, metric in enumerate(METRICS):
                    rows.append(
                        {
                            "model": model,
                            "grouping": grouping_name(keys),
                            **{c: filled.get(c) for c in GROUP_COLUMNS},
                            "metric": metric,
                            "value": point[i],
                            "ci_low": low[i],
                            "ci_high": high[i],
                            "n": n_ap if metric == "ap" else n_all,
                        }
                    )
    table = pd.DataFrame(rows, columns=METRIC_COLUMNS)
    for column in ("length", "lookback", "n"):
        table[column] = table[column].astype("Int64")
    return table

"""Tidy metrics with bootstrap intervals, and the aggregate command."""

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import procexec.analysis.aggregate as agg
from procexec.analysis.aggregate import GROUPINGS, METRIC_COLUMNS, METRICS, aggregate, bootstrap, grouping_name
from procexec.cli import main
from procexec.io.parquet import write_parquet
from procexec.scoring.files import SCORE_SCHEMA
from procexec.scoring.score import SCORE_COLUMNS


def scores(n=200, model="m", seed=0):
    rng = np.random.default_rng(seed)
    lengths = np.array([5, 15])[np.arange(n) % 2]
    faa = rng.random(n) < np.where(lengths == 5, 0.8, 0.3)
    ap = np.where(rng.random(n) < 0.9, rng.random(n) * 100, np.nan)
    frame = pd.DataFrame({c: pd.Series([None] * n, dtype="object") for c in SCORE_COLUMNS})
    frame = frame.assign(
        id=[f"add_int_1-10_k1:{length}:{i}" for i, length in enumerate(lengths)], model=model, dataset="add_int_1-10_k1",
        length=lengths, index=np.arange(n), input_type="int", input_range="1-10", operator="add", lookback=1,
        faa=faa, caa=faa | (rng.random(n) < 0.1), parseable=~np.isnan(ap), answer_position=ap,
        step_following=rng.choice(["under", "exact", "over"], n), tolerance_match=faa,
        truncated=rng.random(n) < 0.05, num_generated_tokens=rng.integers(100, 1000, n),
    )  # fmt: skip
    return frame


def test_point_values_and_intervals():
    frame = scores()
    table = aggregate(frame, resamples=500, seed=1)
    assert list(table.columns) == METRIC_COLUMNS
    overall = table[table.grouping == "overall"].set_index("metric")
    assert list(overall.index) == list(METRICS)
    assert overall.loc["faa", "value"] == pytest.approx(frame.faa.mean())
    assert overall.loc["ap", "value"] == pytest.approx(frame.answer_position.mean())  # NaN skipped
    assert overall.loc["ap", "n"] == frame.answer_position.notna().sum() and overall.loc["faa", "n"] == 200
    assert overall.loc["sfb_exact", "value"] == pytest.approx((frame.step_following == "exact").mean())
    assert overall.loc["mean_generated_tokens", "value"] == pytest.approx(frame.num_generated_tokens.mean())
    assert (overall.ci_low <= overall.value).all() and (overall.value <= overall.ci_high).all()
    se = np.sqrt(frame.faa.mean() * (1 - frame.faa.mean()) / 200)  # percentile CI ~ +-1.96 SE
    assert overall.loc["faa", "ci_high"] - overall.loc["faa", "ci_low"] == pytest.approx(2 * 1.96 * se, rel=0.2)
    by_length = table[(table.grouping == "length") & (table.metric == "faa")].set_index("length")
    assert by_length.loc[5, "value"] == pytest.approx(frame[frame.length == 5].faa.mean())
    assert by_length.loc[5, "dataset"] is None or pd.isna(by_length.loc[5, "dataset"])
    assert set(table.grouping) == {grouping_name(g) for g in GROUPINGS}


def test_fixed_seed_is_reproducible_and_seed_matters():
    frame = scores()
    a, b, c = (aggregate(frame, resamples=200, seed=s) for s in (3, 3, 4))
    pd.testing.assert_frame_equal(a, b)
    assert not np.allclose(a.ci_low, c.ci_low, equal_nan=True)


def test_bootstrap_chunking_matches_whole(monkeypatch):
    values = np.column_stack([np.random.default_rng(0).random((50, 10)), np.ones(50), np.ones(50)])
    whole = bootstrap(values, 100, 7)
    monkeypatch.setattr(agg, "_CACHE_CELLS", 0)
    monkeypatch.setattr(agg, "_CHUNK_CELLS", 500)  # 10 resamples per chunk, same draws
    for x, y in zip(whole, bootstrap(values, 100, 7)):
        np.testing.assert_allclose(x, y)


def test_group_without_answers_has_nan_ap():
    frame = scores(20)
    frame["answer_position"] = np.nan
    ap = aggregate(frame, resamples=50).query("metric == 'ap' and grouping == 'overall'").iloc[0]
    assert np.isnan(ap.value) and np.isnan(ap.ci_low) and ap.n == 0


def test_aggregate_command(tmp_path, capsys):
    paths = []
    for model in ("a", "b"):
        path = tmp_path / f"{model}.parquet"
        write_parquet(pa.Table.from_pandas(scores(40, model), schema=SCORE_SCHEMA, preserve_index=False), path)
        paths.append(str(path))
    out = tmp_path / "agg"
    assert main(["aggregate", "--scores", *paths, "--out-dir", str(out), "--resamples", "100", "--seed", "2"]) == 0
    metrics = pd.read_parquet(out / "metrics.parquet")
    assert set(metrics.model) == {"a", "b"} and list(metrics.columns) == METRIC_COLUMNS
    assert len(pd.read_csv(out / "metrics.csv")) == len(metrics)
    assert pq.read_table(out / "scores.parquet").num_rows == 80
    assert main(["aggregate", "--scores", paths[0], paths[0], "--out-dir", str(tmp_path / "dup")]) == 2
    assert "more than one score file" in capsys.readouterr().err and not (tmp_path / "dup").exists()

"""The reproduction table: verdicts on scores built to match the paper, shifted, or partly missing."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from paper_fixtures import matching_scores, targets, write_matching_references
from procexec.analysis.aggregate import aggregate, resample_counts
from procexec.analysis.paper_numbers import load_paper_numbers
from procexec.analysis.report import render
from procexec.analysis.reproduction import (
    TABLE_ID,
    reproduction_latex,
    reproduction_table,
    statistic_replicates,
    summary,
)
from procexec.analysis.study import models_frame
from procexec.analysis.tables import write_tables
from procexec.cluster.layouts import load_planned
from procexec.errors import ProcexecError
from report_fixtures import dataset_ids, synthetic_scores, write_aggregate, write_generations, write_references

REPO = Path(__file__).resolve().parents[2]
RESAMPLES = 200
SHIFTED = "DS-14"  # a model with Table 2 and 3 rows, a bound and a place in a model-subset claim


@pytest.fixture(scope="module")
def paper():
    return load_paper_numbers()


@pytest.fixture(scope="module")
def models() -> pd.DataFrame:
    return models_frame(load_planned([REPO / "config.yaml"]))


@pytest.fixture(scope="module")
def references(paper, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_matching_references(paper, tmp_path_factory.mktemp("references"))


@pytest.fixture(scope="module")
def matching(paper, models) -> pd.DataFrame:
    return matching_scores(paper, models, targets(paper))


def _table(paper, scores, models, references) -> pd.DataFrame:
    return reproduction_table(paper, scores, models, references, resamples=RESAMPLES, seed=0)


def _unexpected(frame: pd.DataFrame, mask: pd.Series, verdict: str) -> pd.DataFrame:
    """The rows under ``mask`` whose verdict is not ``verdict`` (shown when an assertion fails)."""
    wrong = frame[mask & (frame["verdict"] != verdict)]
    return wrong[["id", "paper_value", "ours", "difference", "tolerance", "verdict", "note"]]


def test_scores_built_to_match_the_paper_agree_everywhere(paper, models, references, matching) -> None:
    frame = _table(paper, matching, models, references)
    assert list(frame["id"]) == [n.id for n in paper.numbers]  # one row per published number, in order
    everything = pd.Series(True, index=frame.index)
    assert _unexpected(frame, everything, "agrees").empty, _unexpected(frame, everything, "agrees").to_string()
    table3 = frame[frame["source"].str.startswith("Table 3")]
    assert (table3["ours_half_width"] > 0).all() and table3["paper_half_width"].notna().all()
    assert summary(frame) == {"total": len(paper.numbers), "agrees": len(paper.numbers), "differs": 0, "not run": 0}


def test_one_model_moved_by_5_points_differs_in_exactly_its_rows(paper, models, references, tmp_path: Path) -> None:
    shifted = matching_scores(paper, models, targets(paper, shift=(SHIFTED, 5.0)))
    frame = _table(paper, shifted, models, references)
    own = frame["model"] == SHIFTED
    assert own.sum() >= 6  # Table 3, Table 2 (4 columns), the "more than 55 points" bound
    assert _unexpected(frame, own, "differs").empty, _unexpected(frame, own, "differs").to_string()
    assert _unexpected(frame, ~own, "agrees").empty, _unexpected(frame, ~own, "agrees").to_string()

    # In the report, each differing number links to its model's Appendix G section.  The other
    # tables come from a small study; the reproduction table is the shifted one.
    small = synthetic_scores(["ds-1.5"], dataset_ids(full=False), [5, 95], 4)
    write_aggregate(small, tmp_path / "aggregate")
    write_references(small, tmp_path / "references")
    write_generations(small, tmp_path / "generations")
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "manifest.json").write_text('{"figures": []}')  # no figure drawn: not under test
    tables = tmp_path / "tables"
    config = load_planned([REPO / "config.yaml"])
    write_tables(config, tmp_path / "aggregate", tmp_path / "references", tables, resamples=20)
    frame.to_csv(tables / f"{TABLE_ID}.csv", index=False)
    page = render(
        [REPO / "config.yaml"],
        config,
        tmp_path / "aggregate",
        tmp_path / "figures",
        tables,
        tmp_path / "generations",
        tmp_path / "references",
        [],
        tmp_path / "report" / "index.html",
    )
    html = page.read_text()
    key = models.set_index("abbrev").loc[SHIFTED, "model"]
    assert f"{int(own.sum())} differ" in html and f'id="model-{key}"' in html
    for number_id in frame.loc[own, "id"]:
        row = html[html.index(f'id="reproduction-{number_id}"') :]
        row = row[: row.index("</tr>")]
        assert 'class="verdict-differs"' in row and f'href="#model-{key}"' in row, number_id


def test_models_not_run_are_listed_as_not_run(paper, models, references, matching) -> None:
    absent = {"KK-1T", "DS-685"}
    keys = set(models.set_index("abbrev").loc[sorted(absent), "model"])
    frame = _table(paper, matching[~matching["model"].isin(keys)], models, references)
    involves = pd.Series([bool(absent & set(n.models)) for n in paper.numbers], index=frame.index)
    assert involves.sum() > 2 * 5  # their own rows and every cross-model claim over all models
    assert _unexpected(frame, involves, "not run").empty
    assert frame.loc[involves, "note"].str.contains("no scores: ").all()
    assert frame.loc[involves, "ours"].isna().all()
    assert _unexpected(frame, ~involves, "agrees").empty, _unexpected(frame, ~involves, "agrees").to_string()
    latex = reproduction_latex(frame)
    assert latex.count(r"\\") == len(frame) + 1 and r"\bottomrule" in latex and "not run" in latex


def test_incomplete_groups_are_not_run(paper, models, references, matching) -> None:
    """A model without length 95 cannot be held to a 5-vs-95 number, but still to others."""
    key = models.set_index("abbrev").loc["OA-120", "model"]
    frame = _table(paper, matching[(matching["model"] != key) | (matching["length"] != 95)], models, references)
    by_id = frame.set_index("id")
    assert by_id.loc["table2-oa-120-par", "verdict"] == "not run"
    assert "OA-120 lacks 55 of the 55 (dataset, length) groups of length=95" in by_id.loc["table2-oa-120-par", "note"]
    assert by_id.loc["table3-oa-120", "verdict"] == "not run"  # Table 3 covers every length
    assert by_id.loc["s5.2.2-int-gain-4-models", "verdict"] == "agrees"  # OA-120 is not one of the four


def test_table4_rows_from_references(paper, models, references, matching, tmp_path: Path) -> None:
    frame = _table(paper, matching, models, references[:-1]).set_index("id")  # one base dataset missing
    missing_operator = Path(references[-1]).name.split("_")[0]
    rows = frame[frame["source"].str.startswith("Table 4")]
    assert (rows["rule"] == "magnitude").all()
    mine = rows.index.str.startswith(f"table4-{missing_operator}-")
    assert (rows.loc[mine, "verdict"] == "not run").all() and (rows.loc[~mine, "verdict"] == "agrees").all()

    # A median two orders of magnitude off differs: medians hardly move between resamples.
    moved = write_matching_references(paper, tmp_path / "moved", moved={("sub", "median"): 100.0})
    frame = _table(paper, matching, models, moved).set_index("id")
    rows = frame[frame["source"].str.startswith("Table 4")]
    assert set(rows.index[rows["verdict"] == "differs"]) == {"table4-sub-median"}
    assert rows.loc["table4-sub-median", ["difference", "tolerance"]].tolist() == pytest.approx([2.0, 1.0])


@pytest.mark.parametrize("size", [100, 101])
def test_statistic_replicates_are_each_resamples_statistics(size: int) -> None:
    rng = np.random.default_rng(size)
    values = rng.lognormal(0, 4, size) * rng.choice([-1, 1], size)
    values[[3, 7]] = np.nan, 0.0  # NaN is left out, as procexec.benchmark.table4 does
    replicates = statistic_replicates(values, 25, seed=4, stream=(9,))
    kept = np.sort(values[~np.isnan(values)])
    counts = np.vstack(list(resample_counts(len(kept), 25, 4, (9,))))
    for b, row in enumerate(counts):
        resample = np.repeat(kept, row.astype(int))
        assert replicates["median"][b] == np.median(resample)
        assert (replicates["min"][b], replicates["max"][b]) == (resample.min(), resample.max())
        assert replicates["std"][b] == pytest.approx(np.std(resample, ddof=1), rel=1e-9)


# --------------------------------------------------------------------------- intervals, on a tiny suite


def _tiny_paper(tmp_path: Path, numbers: list[dict]) -> object:
    """The packaged data's models with a one-dataset suite (add_int_1-10_k1, lengths 5 and 95) and ``numbers``."""
    raw = yaml.safe_load((REPO / "src" / "procexec" / "data" / "paper_numbers.yaml").read_text())
    raw["suite"] = {
        "lengths": [5, 95],
        "examples_per_length": 40,
        "inputs": [{"type": "int", "low": 1, "high": 10}],
        "families": {"base": {"operators": ["add"], "lookbacks": [1]}},
    }
    raw["numbers"] = numbers
    path = tmp_path / "numbers.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_paper_numbers(path)


def _number(id: str, model: str, statistic: str, grouping: list[dict], value: float = 50.0) -> dict:
    return {
        "id": id,
        "source": "Table 3, row x",
        "model": model,
        "metric": "faa",
        "statistic": statistic,
        "grouping": grouping,
        "unit": "percent" if statistic == "value" else "points",
        "paper": {"value": value, "decimals": 1},
        "measures": "test",
    }


def test_whole_suite_interval_is_aggregates(tmp_path: Path, models: pd.DataFrame) -> None:
    """Table 3's rows carry the very interval of metrics.parquet (and so of table3_accuracy.csv)."""
    paper = _tiny_paper(tmp_path, [_number("all", "DS-1.5", "value", [{}])])
    scores = synthetic_scores(["ds-1.5"], ["add_int_1-10_k1"], [5, 95], 40, seed=2)
    ours = reproduction_table(paper, scores, models, [], resamples=60, seed=3).iloc[0]
    metrics = aggregate(scores, resamples=60, seed=3).query("grouping == 'overall' and metric == 'faa'").iloc[0]
    assert ours["verdict"] != "not run"
    assert (ours["ours"], ours["ours_ci_low"], ours["ours_ci_high"]) == pytest.approx(
        (100 * metrics["value"], 100 * metrics["ci_low"], 100 * metrics["ci_high"])
    )


def test_the_groups_of_a_difference_are_resampled_independently(tmp_path: Path, models: pd.DataFrame) -> None:
    """Identical answers at 5 and 95 steps: drawing both groups alike would give a zero-width interval."""
    paper = _tiny_paper(tmp_path, [_number("drop", "DS-1.5", "difference", [{"length": [5]}, {"length": [95]}], 0.0)])
    scores = synthetic_scores(["ds-1.5"], ["add_int_1-10_k1"], [5, 95], 40, seed=2)
    scores["faa"] = scores["index"] % 3 == 0  # the same at both lengths
    row = reproduction_table(paper, scores, models, [], resamples=200, seed=0).iloc[0]
    assert row["ours"] == 0 and row["ours_half_width"] > 5  # ~ 1.96 * sqrt(2 * p(1-p) / 40) = 20 points
    assert row["verdict"] == "agrees"


def test_loader_names_the_bad_entry(tmp_path: Path) -> None:
    bad = _number("broken", "DS-1.5", "difference", [{"length": [5]}])
    with pytest.raises(ProcexecError, match="numbers.broken: difference takes 2 selection"):
        _tiny_paper(tmp_path, [bad])
    with pytest.raises(ProcexecError, match="numbers.unknown: unknown model XX-9"):
        _tiny_paper(tmp_path, [_number("unknown", "XX-9", "value", [{}])])
    with pytest.raises(ProcexecError, match=r"numbers\.typo\.paper: 'value' is a required property"):
        _tiny_paper(tmp_path, [{**_number("typo", "DS-1.5", "value", [{}]), "paper": {"decimals": 1}}])
    with pytest.raises(ProcexecError, match="matches nothing in the suite"):
        _tiny_paper(tmp_path, [_number("empty", "DS-1.5", "value", [{"operator": ["mul"]}])])


def test_resamples_are_required(paper, models) -> None:
    with pytest.raises(ProcexecError, match="resamples"):
        reproduction_table(paper, pd.DataFrame(columns=["model", "dataset", "length"]), models, [], resamples=0)


def test_explained_by_names_figures_and_tables_of_the_report(paper, models) -> None:
    from procexec.analysis.figures.specs import figure_specs
    from procexec.analysis.tables import TABLES

    known = {spec.id for spec in figure_specs(models)} | {spec.id for spec in TABLES}
    named = {ref for number in paper.numbers for ref in number.explained_by}
    assert named and named <= known, named - known

"""Tables 1-4: ordering, values recomputed from the score rows, LaTeX shape."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from procexec import config as config_mod
from procexec.analysis.aggregate import aggregate
from procexec.analysis.latex import latex_sci
from procexec.analysis.study import models_frame
from procexec.analysis.tables import table1, table2, table3, table4_expected_output, write_tables
from procexec.benchmark.executor import execute
from procexec.benchmark.suite import DatasetSpec, generate_dataset
from procexec.errors import ProcexecError
from procexec.io.jsonl import write_jsonl
from report_fixtures import dataset_ids, synthetic_scores

REPO = Path(__file__).resolve().parents[2]
MODELS = ["mi-7", "ds-1.5", "oa-120"]


@pytest.fixture(scope="module")
def config() -> dict:
    raw = yaml.safe_load((REPO / "config.yaml").read_text())
    raw["run_models"] = ["oa-120", "smollm2-135m-instruct", "mi-7", "ds-1.5"]
    return config_mod.prepare(raw)


@pytest.fixture(scope="module")
def scores() -> pd.DataFrame:
    return synthetic_scores(MODELS, dataset_ids(full=False), [5, 45, 95], 6, seed=3)


@pytest.fixture(scope="module")
def metrics(scores: pd.DataFrame) -> pd.DataFrame:
    return aggregate(scores, resamples=30, seed=0)


def test_table1_follows_paper_group_order(config: dict) -> None:
    frame, latex = table1(models_frame(config))
    assert list(frame["abbrev"]) == ["DS-1.5", "MI-7", "OA-120", "SM-135M"]  # small, mid, frontier, others
    assert list(frame["group"]) == ["small", "mid", "frontier", "others"]
    assert "Small models (<4B)" in latex and "Other models" in latex
    assert latex.count(r"\midrule") == 4 and r"\bottomrule" in latex


def test_table2_is_shortest_minus_longest_in_points(config: dict, scores: pd.DataFrame, metrics: pd.DataFrame) -> None:
    frame, latex = table2(metrics, models_frame(config))
    assert list(frame["par"]) == sorted(frame["par"])
    row = frame.set_index("model").loc["ds-1.5"]
    own = scores[scores["model"] == "ds-1.5"]
    short, long_ = own[own["length"] == 5], own[own["length"] == 95]
    assert row["par"] == pytest.approx(100 * (short["parseable"].mean() - long_["parseable"].mean()))
    assert row["under"] == pytest.approx(
        100 * ((short["step_following"] == "under").mean() - (long_["step_following"] == "under").mean())
    )
    assert (row["length_short"], row["length_long"]) == (5, 95)
    assert "PAR & Exact & Under & Over" in latex


def test_table3_ascending_with_ci(config: dict, scores: pd.DataFrame, metrics: pd.DataFrame) -> None:
    frame, latex = table3(metrics, models_frame(config))
    assert list(frame["accuracy"]) == sorted(frame["accuracy"])
    assert set(frame["model"]) == set(MODELS)  # smollm2 has no scores: left out, not an error
    row = frame.set_index("model").loc["oa-120"]
    assert row["accuracy"] == pytest.approx(100 * scores.loc[scores["model"] == "oa-120", "faa"].mean())
    assert row["ci_low"] <= row["accuracy"] <= row["ci_high"]
    assert row["half_width"] == pytest.approx((row["ci_high"] - row["ci_low"]) / 2)
    assert r"\pm" in latex


def test_table4_from_references(tmp_path: Path) -> None:
    for dataset in ["mul_int_1-10_k1", "add_float_0-1_k1", "mixed_int_1-10_k3"]:
        examples = generate_dataset(DatasetSpec.from_id(dataset), [5, 95], 5, seed=1)
        write_jsonl(tmp_path / f"{dataset}.jsonl", (execute(e).to_json() for e in examples))
    (tmp_path / "table4.csv").write_text("not a dataset\n")
    frame, latex = table4_expected_output(tmp_path)
    assert list(frame["operator"]) == ["add", "mul"]  # look-back 3 is not the base suite
    mul = frame.set_index("operator").loc["mul"]
    assert mul["n"] == 10 and mul["max"] > 1e20
    assert "Multiply" in latex and r"\times 10^{" in latex


def test_latex_sci_formats_like_the_paper() -> None:
    assert latex_sci(345.0) == r"$3.45\times 10^{2}$"
    assert latex_sci(9.999e2) == r"$1.00\times 10^{3}$"
    assert latex_sci(float("inf")) == r"$\infty$"
    assert latex_sci(0.0) == "$0$"


def test_latex_cells_of_the_shared_number_formats() -> None:
    """procexec.io.formats writes a missing number as an en dash and intervals with ±: LaTeX spells them."""
    from procexec.analysis.latex import latex_escape
    from procexec.io.formats import format_fixed

    assert latex_escape(f"42.00 ± 1.50 [{format_fixed(float('nan'), 1)}]") == r"42.00 $\pm$ 1.50 [--]"
    assert latex_escape("50% of S_3") == r"50\% of S\_3"


def test_write_tables_writes_csv_and_tex(
    config: dict, scores: pd.DataFrame, metrics: pd.DataFrame, tmp_path: Path
) -> None:
    """Each table's CSV reads back as the frame its builder returns, and its .tex is the builder's LaTeX."""
    from procexec.analysis import reproduction
    from procexec.analysis.paper_numbers import load_paper_numbers

    (tmp_path / "agg").mkdir()
    metrics.to_parquet(tmp_path / "agg" / "metrics.parquet")
    scores.to_parquet(tmp_path / "agg" / "scores.parquet")
    for dataset in ["mul_int_1-10_k1", "add_float_0-1_k1"]:
        examples = generate_dataset(DatasetSpec.from_id(dataset), [5, 45], 3, seed=1)
        write_jsonl(tmp_path / "refs" / f"{dataset}.jsonl", (execute(e).to_json() for e in examples))
    out = tmp_path / "out"
    written = write_tables(config, tmp_path / "agg", tmp_path / "refs", out, resamples=20)
    models = models_frame(config, present=metrics["model"].unique())
    built = {
        "table1_models": table1(models),
        "table2_par_step_following": table2(metrics, models),
        "table3_accuracy": table3(metrics, models),
        "table4_expected_output": table4_expected_output(tmp_path / "refs"),
    }
    names = [*built, reproduction.TABLE_ID]
    assert written == [out / f"{name}.{ext}" for name in names for ext in ("csv", "tex")]
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in written)  # nothing else, no temporaries
    for name, (frame, latex) in built.items():
        assert not frame.empty, name
        pd.testing.assert_frame_equal(
            pd.read_csv(out / f"{name}.csv"), frame.reset_index(drop=True), check_dtype=False, obj=name
        )
        assert (out / f"{name}.tex").read_text() == latex
    comparison = pd.read_csv(out / f"{reproduction.TABLE_ID}.csv")
    assert len(comparison) == len(load_paper_numbers().numbers)
    assert set(comparison["verdict"]) <= set(reproduction.VERDICTS)
    assert (out / f"{reproduction.TABLE_ID}.tex").read_text().startswith(r"\begin{table}")


def test_table4_reads_only_the_listed_datasets(tmp_path: Path) -> None:
    """A stale reference file of a dataset no longer in the suite is not summarised (the rules pass --datasets)."""
    for dataset in ["mul_int_1-10_k1", "add_int_1-10_k1"]:
        examples = generate_dataset(DatasetSpec.from_id(dataset), [5], 3, seed=1)
        write_jsonl(tmp_path / f"{dataset}.jsonl", (execute(e).to_json() for e in examples))
    frame, _ = table4_expected_output(tmp_path, ["add_int_1-10_k1"])
    assert list(frame["operator"]) == ["add"]
    with pytest.raises(ProcexecError, match="sub_int_1-10_k1.jsonl"):
        table4_expected_output(tmp_path, ["sub_int_1-10_k1"])


def test_one_table4_semantics_across_its_outputs(tmp_path: Path) -> None:
    """The table4 rule's CSV and the tables rule's Table 4 summarise the same finals: Appendix A's."""
    from procexec.benchmark.table4 import TABLE4_SEMANTICS, base_suite_finals, reference_files
    from procexec.benchmark.table4 import table4 as table4_stats
    from procexec.cli import main

    for dataset in ["div_int_0-1_k1", "add_int_1-10_k1"]:  # 0-1 inputs: divisions by zero, where the two differ
        examples = generate_dataset(DatasetSpec.from_id(dataset), [5, 15], 30, seed=2)
        write_jsonl(tmp_path / f"{dataset}.jsonl", (execute(e).to_json() for e in examples))
    files = reference_files(tmp_path)
    appendix_a = table4_stats(base_suite_finals(files, "appendix-a"))
    default = table4_stats(base_suite_finals(files, "default"))
    assert TABLE4_SEMANTICS == "appendix-a"
    assert not appendix_a.loc["div"].equals(default.loc["div"]), "the data must tell the semantics apart"
    out = tmp_path / "table4.csv"
    assert main(["table4", "--references-dir", str(tmp_path), "--out", str(out)]) == 0
    cli = pd.read_csv(out, index_col="operator")
    tables, _ = table4_expected_output(tmp_path)
    tables = tables.set_index("operator")
    for stat in ("median", "min", "max"):
        assert cli.loc["div", f"{stat}_ours"] == pytest.approx(appendix_a.loc["div", stat], rel=1e-5, nan_ok=True)
        assert tables.loc["div", stat] == pytest.approx(appendix_a.loc["div", stat], nan_ok=True)

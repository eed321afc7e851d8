"""Figures: builders produce the paper's quantities; every spec draws PNG + SVG from synthetic scores."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from procexec import config as config_mod
from procexec.analysis.figures.builders import lookback_degradation, median_expected
from procexec.analysis.figures.inputs import load_inputs
from procexec.analysis.figures.specs import figure_specs
from procexec.analysis.figures.write import write_figures
from report_fixtures import dataset_ids, synthetic_scores, write_aggregate

REPO = Path(__file__).resolve().parents[2]
MODELS = ["ds-1.5", "mn-14", "oa-120"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path, pd.DataFrame]:
    raw = yaml.safe_load((REPO / "config.yaml").read_text())
    raw["run_models"] = MODELS
    config = config_mod.prepare(raw)
    scores = synthetic_scores(MODELS, dataset_ids(full=False), [5, 45, 95], 6, seed=1)
    root = tmp_path_factory.mktemp("figures")
    write_aggregate(scores, root / "aggregate")
    return config, root, scores


def test_every_spec_draws_png_and_svg(setup: tuple[dict, Path, pd.DataFrame]) -> None:
    config, root, _ = setup
    manifest = write_figures(config, root / "aggregate", root / "figures", workers=2)
    specs = figure_specs(load_inputs(config, root / "aggregate").models)
    assert [f["id"] for f in manifest] == [s.id for s in specs]
    assert len(specs) == 21 + 7 * len(MODELS)
    for entry in manifest:
        assert entry["files"] == [f"{entry['id']}.png", f"{entry['id']}.svg"], entry["id"]
        png = root / "figures" / entry["files"][0]
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in (root / "figures" / entry["files"][1]).read_bytes()[:400]
    g = [f for f in manifest if f["section"] == "G"]
    assert g[0]["number"] == "G.1/20" and g[-1]["number"] == f"G.7/{20 + 15 * 6 + len(MODELS) - 1}"


def test_lookback_degradation_is_relative_to_k1(setup: tuple[dict, Path, pd.DataFrame]) -> None:
    config, root, _ = setup
    inputs = load_inputs(config, root / "aggregate")
    frame, _ = lookback_degradation(inputs)
    faa = inputs.metric("lookback", ["faa"]).set_index(["model", "lookback"])["value"]
    row = frame[(frame["row"] == "MN-14") & (frame["col"] == 3)].iloc[0]
    assert row["value"] == pytest.approx(100 * (faa["mn-14", 1] - faa["mn-14", 3]) / faa["mn-14", 1])
    assert 1 not in set(frame["col"])


def test_median_expected_splits_correct_and_incorrect(setup: tuple[dict, Path, pd.DataFrame]) -> None:
    config, root, scores = setup
    frame, opts = median_expected(load_inputs(config, root / "aggregate"), "operator", [], model="ds-1.5")
    own = scores[
        (scores["model"] == "ds-1.5")
        & (scores["lookback"] == 1)
        & (scores["operator"] == "mul")
        & (scores["length"] == 45)
        & ~scores["faa"]
    ]
    row = frame[(frame["hue"] == "mul") & (frame["x"] == 45) & (frame["style"] == "incorrect")].iloc[0]
    assert row["y"] == pytest.approx(own["expected_log10_abs"].median())
    assert opts["dashed"] == ("incorrect",)


def test_models_without_any_parseable_answer_mark_the_figure_missing(tmp_path: Path) -> None:
    """Small models often never close an <answer> tag: answer_position is null everywhere."""
    raw = yaml.safe_load((REPO / "config.yaml").read_text())
    raw["run_models"] = ["ds-1.5"]
    config = config_mod.prepare(raw)
    scores = synthetic_scores(["ds-1.5"], dataset_ids(full=False), [5, 95], 3, seed=2)
    scores["answer_position"] = None
    scores["answer_position_basis"] = None
    write_aggregate(scores, tmp_path / "aggregate")
    manifest = write_figures(config, tmp_path / "aggregate", tmp_path / "figures", workers=1)
    fig19 = next(f for f in manifest if f["id"] == "fig19_answer_position")
    assert fig19["missing"] == "no data"
    fig02 = next(f for f in manifest if f["id"] == "fig02_faa_vs_steps")
    assert "missing" not in fig02 and fig02["files"]  # the other figures are still drawn

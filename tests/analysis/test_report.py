"""Acceptance: the report built from the real pipeline on simulated generations lists and links everything."""

from __future__ import annotations

import html.parser
import re
from pathlib import Path
from urllib.parse import unquote

import pytest

from procexec.analysis.artifacts import read_figure_manifest
from procexec.analysis.provenance import gpu_hours
from procexec.analysis.study import models_frame
from procexec.analysis.tables import TABLES
from procexec.cli import main
from report_fixtures import REPORT_MODELS, build_pipeline, write_benchmarks

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return build_pipeline(tmp_path_factory.mktemp("report"), REPO)


class Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.hrefs: list[str] = []
        self.ids: set[str] = set()
        self.scripts = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "img":
            self.images.append(a["src"] or "")
        if tag == "a" and a.get("href"):
            self.hrefs.append(a["href"] or "")
        if tag == "script":
            self.scripts += 1
        if a.get("id"):
            self.ids.add(a["id"] or "")


@pytest.fixture(scope="module")
def page(built: dict[str, Path]) -> tuple[str, Links]:
    text = built["report"].read_text()
    links = Links()
    links.feed(text)
    return text, links


def test_every_figure_is_drawn_and_shown(built: dict[str, Path], page: tuple[str, Links]) -> None:
    _, links = page
    manifest = read_figure_manifest(built["figures"])
    drawn = [f for f in manifest if f["files"]]
    # kk-1t has no scores: its seven G figures lack data, and so do Figures 12-13 (no model of those groups).
    expected_missing = {f["id"] for f in manifest if f["model"] == "kk-1t" or f["number"] in ("12", "13")}
    assert {f["id"] for f in manifest if not f["files"]} == expected_missing
    numbers = {f["number"].split("/")[-1] for f in drawn}
    assert {"2", "3", "4", "5", "8", "9", "10", "11", "14", "15", "16", "17", "18", "19"} <= numbers
    assert {f["number"] for f in drawn if f["section"] == "X"} == {"X1", "X2", "X3", "X4", "X5"}
    assert len([f for f in drawn if f["section"] == "G"]) == 7 * 2
    shown = {Path(unquote(src)).name for src in links.images}
    for f in drawn:
        assert {Path(name).suffix for name in f["files"]} == {".png", ".svg"}
        assert f"{f['id']}.png" in shown, f["id"]
    base = built["report"].parent
    for src in links.images:
        target = (base / unquote(src)).resolve()
        assert target.is_file() and target.stat().st_size > 0, src
        assert not src.startswith(("/", "http")), "images must be relative so the page opens from disk"


def test_tables_written_and_linked(built: dict[str, Path], page: tuple[str, Links]) -> None:
    text, links = page
    for spec in TABLES:
        for ext in ("csv", "tex"):
            assert (built["tables"] / f"{spec.id}.{ext}").is_file()
        assert spec.id in links.ids
        assert f"Table {spec.number}." in text
    assert "\\toprule" in (built["tables"] / "table3_accuracy.tex").read_text()
    base = built["report"].parent
    for href in links.hrefs:
        if href.startswith("#"):
            assert href[1:] in links.ids, href
        else:
            assert (base / unquote(href)).resolve().is_file(), href


def test_model_sections_and_missing_model(page: tuple[str, Links]) -> None:
    text, links = page
    for key in REPORT_MODELS:
        assert f"model-{key}" in links.ids
    assert "No scores yet for KK-1T" in text
    assert "No generations available for KK-1T" in text


def test_the_header_says_the_stage(page: tuple[str, Links]) -> None:
    """A config without ``stage`` is the full study: said in the header, the title left as it is."""
    text, links = page
    assert "stage" in links.ids and '<p class="stage stage-full" id="stage"><strong>Full stage</strong>:' in text
    assert "<strong>Full stage</strong>: 4 examples per length at 2 lengths (5, 15 steps).</p>" in text
    assert "<title>procexec report: When LLMs Stop Following Steps</title>" in text


def test_the_pilots_speculative_figures_are_a_table_per_model(built: dict[str, Path], tmp_path: Path, capsys) -> None:
    """``--speculative``: each model's figures from ``procexec speculative-pilot``, in a section of their own; a
    page without them has no such section."""
    import json

    from procexec.generation.engine_stats import EngineStats
    from procexec.generation.speculative import speculative_figures

    figures = speculative_figures(
        [[1, 2, 3], [4, 5]],
        [[1, 2, 3], [4, 6]],
        EngineStats(decoded_tokens=50, generate_s=5.0),
        EngineStats(decoded_tokens=50, generate_s=4.0, drafts=10, draft_tokens=40, accepted_tokens=20),
    )
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    (tmp_path / "qw-4.json").write_text(json.dumps({"model": "qw-4", "speculative_config": spec, **figures}))
    argv = ["report", "--config", str(built["config"]), "--aggregate-dir", str(built["aggregate"])]
    argv += ["--references-dir", str(built["references"]), "--figures-dir", str(built["figures"])]
    argv += ["--tables-dir", str(built["tables"]), "--generations-dir", str(built["generations"])]
    argv += ["--speculative", str(tmp_path / "qw-4.json"), "--out", str(tmp_path / "index.html")]
    assert main(argv) == 0
    text = (tmp_path / "index.html").read_text()
    row = text[text.index('<section id="speculative">') :].split("</tr>")[1]
    assert '<a href="#model-qw-4">QW-4</a>' in row and "1 of 2" in row and "<td>1</td>" in row
    assert "<td>0.500</td><td>3.00</td>" in row and "<td>10.0</td><td>12.5</td><td>1.250</td>" in row
    assert 'id="speculative"' not in built["report"].read_text()
    del figures["speed_ratio"]  # a figure the table shows, missing: one line naming it, the good page kept
    (tmp_path / "qw-4.json").write_text(json.dumps({"model": "qw-4", "speculative_config": spec, **figures}))
    capsys.readouterr()
    assert main(argv) == 2
    assert (
        "qw-4.json: not the figures of procexec speculative-pilot (speed_ratio: Field required)"
        in capsys.readouterr().err
    )
    assert (tmp_path / "index.html").read_text() == text


def test_the_pilots_loops_are_a_section_and_a_guarded_models_evidence_its_deviation(
    built: dict[str, Path], tmp_path: Path, capsys
) -> None:
    """``--loops``/``--cost``: each model's figures from ``procexec loops`` beside ``procexec cost --measured``'s
    projection, in a "Loops" section; in a full stage that guards a model's reruns, its section states the
    deviation with the pilot's evidence."""
    import json

    import yaml

    model = REPORT_MODELS[1]
    guard = {"max_pattern_size": 128, "min_pattern_size": 1, "min_count": 16}
    figures = {
        "model": model, "guard": guard, "guard_source": "candidate", "examples": 40, "attempt1_loops": 2,
        "reruns": 16, "loops": 12, "tail_tokens": 1_234_567, "guard_stops": 12, "guard_stops_in_loops": 12,
        "saved_tokens": 1_200_000, "escapes": 0, "answer_position_moved": 3, "unmeasured": 0, "stopped": [],
    }  # fmt: skip
    (tmp_path / "loops.json").write_text(json.dumps(figures))
    cost = {"models": [{"model": model, "measured": {"pilot_tail_gpu_hours": 4.5},
                        "unguarded_gpu_hours": 612.4, "guarded_gpu_hours": 401.2}]}  # fmt: skip
    (tmp_path / "cost.json").write_text(json.dumps(cost))
    argv = ["report", "--aggregate-dir", str(built["aggregate"]), "--references-dir", str(built["references"])]
    argv += ["--figures-dir", str(built["figures"]), "--tables-dir", str(built["tables"])]
    argv += ["--generations-dir", str(built["generations"]), "--loops", str(tmp_path / "loops.json")]
    assert (
        main(
            [
                *argv,
                "--config",
                str(built["config"]),
                "--cost",
                str(tmp_path / "cost.json"),
                "--out",
                str(tmp_path / "a.html"),
            ]
        )
        == 0
    )
    text = (tmp_path / "a.html").read_text()
    row = re.sub(r">\s+<", "><", text[text.index('<section id="loops">') :].split("</tr>")[1])
    assert f'<a href="#model-{model}">' in row and "<td>12 of 16</td>" in row and "<td>30.00%</td>" in row
    assert "<td>1,234,567</td><td>4.50</td><td>12 (12)</td><td>1,200,000</td><td>0</td><td>3</td>" in row
    assert "<td>612</td><td>401</td><td>the guard may be enabled: no escape in its loops</td>" in row
    assert 'id="loops"' not in built["report"].read_text() and "Deviation from the paper" not in text
    # the full stage with this model's reruns guarded: its section says so, with the pilot's evidence
    raw = yaml.safe_load(built["config"].read_text())
    raw["models"][model]["rerun_repetition_guard"] = guard
    (tmp_path / "guarded.yaml").write_text(yaml.safe_dump(raw))
    assert main([*argv, "--config", str(tmp_path / "guarded.yaml"), "--out", str(tmp_path / "b.html")]) == 0
    section = (tmp_path / "b.html").read_text().split(f'id="model-{model}"', 1)[1].split("</section>", 1)[0]
    assert "Deviation from the paper" in section and f"models.{model}.rerun_repetition_guard" in section
    assert "12 of 16 reruns ended in a loop" in section and "0 escaped (the guard may be enabled" in section
    del figures["escapes"]  # a figure the section shows, missing: one line naming it
    (tmp_path / "loops.json").write_text(json.dumps(figures))
    capsys.readouterr()
    assert main([*argv, "--config", str(built["config"]), "--out", str(tmp_path / "c.html")]) == 2
    assert "loops.json: not the figures of procexec loops (no escapes)" in capsys.readouterr().err


def _section(text: str, model: str) -> str:
    return text.split(f'id="model-{model}"', 1)[1].split("</section>", 1)[0]


def test_missing_answers_are_one_line_at_the_top_of_each_models_section(
    built: dict[str, Path], page: tuple[str, Links], tmp_path: Path
) -> None:
    """Where answers are missing, a model's section opens with the counts (no tag, cut at the budget), so zeros read
    as the model's floor: a model that never answers (SmolLM2 in the demo), one that sometimes does not, one cut every
    time. A model whose every generation has its answer gets no line."""
    import shutil

    import pandas as pd
    import yaml

    text, _ = page
    aggregate = tmp_path / "aggregate"
    shutil.copytree(built["aggregate"], aggregate)
    frame = pd.read_parquet(aggregate / "scores.parquet")
    for model, rows in frame.groupby("model"):  # as simulated: qw-4 leaves some answers out, ds-1.5 none
        no_tag, cut = rows["n_answers"] == 0, rows["truncated"]
        line = f"in {no_tag.sum()} of {len(rows)} generations ({(no_tag & cut).sum()} of them cut at the token budget):"
        assert no_tag.any() == (model == "qw-4") and not cut.all(), model
        assert (line in _section(text, str(model))) == (model == "qw-4"), model
    assert 'id="missing-kk-1t"' not in text and 'id="missing-ds-1.5"' not in text  # no scores; every answer there
    raw = yaml.safe_load(built["config"].read_text())
    raw["models"]["qw-4"]["abbrev"] = "<b>QW</b>"
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    argv = ["report", "--config", str(tmp_path / "config.yaml"), "--aggregate-dir", str(aggregate)]
    argv += ["--references-dir", str(built["references"]), "--figures-dir", str(built["figures"])]
    argv += ["--tables-dir", str(built["tables"]), "--generations-dir", str(built["generations"])]
    argv += ["--out", str(tmp_path / "index.html")]

    def render(qw: pd.Series, ds: pd.Series) -> tuple[str, str]:
        """The two sections after qw-4's and ds-1.5's rows were changed by ``qw`` and ``ds``."""
        changed = frame.copy()
        for model, change in (("qw-4", qw), ("ds-1.5", ds)):
            rows = changed.index[changed["model"] == model]
            for column, values in change.items():
                changed.loc[rows, column] = values[: len(rows)]
        changed.to_parquet(aggregate / "scores.parquet", index=False)
        assert main(argv) == 0
        page = (tmp_path / "index.html").read_text()
        assert "<b>QW</b>" not in page
        return _section(page, "qw-4"), _section(page, "ds-1.5")

    n = int((frame["model"] == "qw-4").sum())
    assert n == int((frame["model"] == "ds-1.5").sum()) == 32
    some = [0] * 5 + [1] * (n - 5)
    cut = [True, True] + [False] * (n - 2)
    qw, ds = render(
        pd.Series({"n_answers": [0] * n, "truncated": cut}), pd.Series({"n_answers": some, "truncated": cut})
    )
    assert (
        '<p class="missing answers" id="missing-qw-4">No answer tag (<code>&lt;answer&gt;…&lt;/answer&gt;</code>) in '
        f"{n} of {n} generations (2 of them cut at the token budget):\nevery accuracy below is 0 and the answer "
        "position undefined because &lt;b&gt;QW&lt;/b&gt; never wrote an answer, not because of a scoring fault.</p>"
    ) in qw.split('<table class="model-stats">', 1)[0]
    assert (
        f"in 5 of {n} generations (2 of them cut at the token budget):\neach of them counts as wrong in FAA, CAA and "
        "PAR and has no answer position.</p>"
    ) in ds.split('<table class="model-stats">', 1)[0]
    qw, ds = render(pd.Series({"n_answers": [1] * n}), pd.Series({"n_answers": [1] * n, "truncated": [True] * n}))
    assert 'id="missing-qw-4"' not in qw
    assert (
        f'<p class="missing answers" id="missing-ds-1.5">Every generation ({n} of {n}) was cut at the token budget: '
        "the figures below show only answers written before the cut.</p>"
    ) in ds.split('<table class="model-stats">', 1)[0]


def test_model_output_is_escaped(page: tuple[str, Links]) -> None:
    text, links = page
    assert links.scripts == 0
    assert "&lt;script&gt;document.title" in text
    assert "<img src=x" not in text and "&lt;img src=x onerror=" in text


def test_examples_align_trace_and_mark_divergence(built: dict[str, Path], page: tuple[str, Links]) -> None:
    """Each incorrect example marks its score row's divergent claim in the text and shows the claimed value."""
    import html

    import pandas as pd

    from procexec.analysis.appendix_examples import pick_examples
    from procexec.analysis.report import EXAMPLE_COLUMNS

    text, _ = page
    scores = pd.read_parquet(built["aggregate"] / "scores.parquet", columns=list(EXAMPLE_COLUMNS))
    wrong = pick_examples(scores).query("not faa")
    assert set(wrong["model"]) == set(REPORT_MODELS[:2]) and wrong["divergent_claim"].notna().any()
    for row in wrong.itertuples():
        article = text.split(f'id="example-{row.model}-{row.id}"', 1)[1].split("</article>", 1)[0]
        var = int(row.first_divergent_step) + 2
        assert f"first divergent step <strong>{var - 2}</strong>\n    (S{var}, " in article
        if pd.isna(row.divergent_claim):
            assert "<mark" not in article and f'<tr class="missing divergent"><td>S{var}</td>' in article
            continue
        assert article.count('<mark class="divergent">') == 1
        assert re.search(rf'<mark class="divergent">S_?{{?{var}}}? *=</mark>', article), row.id
        claimed = html.escape(row.divergent_claim) if len(row.divergent_claim) <= 48 else ""
        assert f'<tr class="differs divergent"><td>S{var}</td><td>' in article and f"<td>{claimed}" in article


def test_gpu_hours_from_benchmark_files(tmp_path: Path) -> None:
    import yaml

    from procexec import config as config_mod
    from procexec.cluster.layouts import planned

    config = planned(config_mod.prepare(yaml.safe_load((REPO / "config.yaml").read_text())))
    write_benchmarks(["ds-1.5", "ds-685"], tmp_path, shards=2)
    write_benchmarks(["ds-1.5"], tmp_path, shards=3)  # a stale shard count's files beside them: not named
    declared = sorted(tmp_path.rglob("*-of-2.tsv"))
    hours = gpu_hours(models_frame(config), declared).set_index("model")
    assert hours.loc["ds-1.5", "gpu_hours"] == pytest.approx(1.0)  # 2 shards x 0.5 h x 1 GPU
    assert hours.loc["ds-685", "gpu_hours"] == pytest.approx(8.0)  # 8 GPUs
    assert hours.loc["qw-4", "shards"] == 0 and hours.loc["qw-4", "gpu_hours"] == 0


def _example(text: str, **row: object) -> dict:
    """example_view of a one-step example (S3 = 1 + 2 = 3) whose score row says ``row``."""
    import pandas as pd

    from procexec.analysis.appendix_examples import example_view
    from procexec.records import GenerationRecord, Reference

    ref = Reference(
        id="add_int_1-10_k1:1:0",
        dataset="add_int_1-10_k1",
        length=1,
        index=0,
        semantics="default",
        final="3",
        final_float=3.0,
        final_type="int",
        trace=["1", "2", "3"],
        edge_cases=[],
        appendix_a_final="3",
        appendix_a_disagrees=False,
    )
    gen = GenerationRecord(
        id=ref.id,
        model="m",
        dataset=ref.dataset,
        length=1,
        index=0,
        attempt=1,
        text=text,
        num_generated_tokens=9,
        finish_reason="length",
    )
    nothing = {
        "faa": False,
        "first_answer_raw": None,
        "first_divergent_step": None,
        "correct_prefix": 1,
        "first_error_class": None,
        "divergent_claim": None,
        "divergent_claim_start": None,
        "divergent_claim_end": None,
    }
    return example_view(gen, ref, pd.Series({**nothing, **row}, dtype=object))


def test_example_without_any_answer_says_none() -> None:
    """A generation with no <answer> tag (parquet null, read back as NaN) shows 'none', not 'nan'."""
    view = _example("Step 1: S3 = 1 + 2 = 4", first_answer_raw=float("nan"), first_divergent_step=1, correct_prefix=0)
    assert view["first_answer"] is None and view["first_divergent_step"] == 1


def test_example_shows_the_divergent_claim_of_the_score_row() -> None:
    """The highlighted span and the claimed value are the row's; the model's text is not parsed again."""
    text = "Step 1: S3 = 1 + 2 = 4"
    view = _example(
        text,
        first_divergent_step=1,
        correct_prefix=0,
        first_error_class="arithmetic_slip",
        divergent_claim="4",
        divergent_claim_start=8,
        divergent_claim_end=12,
    )
    assert [seg["text"] for seg in view["segments"] if seg["mark"]] == ["S3 ="]
    assert [(r.var, r.status, r.claimed, r.divergent) for r in view["trace"]] == [
        (1, "input", "input", False),
        (2, "input", "input", False),
        (3, "differs", "4", True),
    ]
    assert view["error_class"] == "arithmetic slip"
    # the row's word counts, not the text: a claim of 7 in the row is shown although the text says 4
    assert (
        _example(
            text,
            first_divergent_step=1,
            correct_prefix=0,
            divergent_claim="7",
            divergent_claim_start=8,
            divergent_claim_end=12,
        )["trace"][2].claimed
        == "7"
    )


def test_example_statuses_before_at_and_after_the_divergence() -> None:
    agrees = _example("S3 = 3", faa=True)
    assert [r.status for r in agrees["trace"]] == ["input", "input", "match"]
    assert not any(seg["mark"] for seg in agrees["segments"])
    skipped = _example("no steps at all", first_divergent_step=1, correct_prefix=0, first_error_class="skipped")
    assert skipped["trace"][2].status == "missing" and skipped["trace"][2].claimed == "no claim (skipped)"
    unaligned = _example("S3 = 3", correct_prefix=float("nan"))
    assert [r.status for r in unaligned["trace"]] == ["input", "input", "unaligned"]


@pytest.mark.parametrize("span", [(8, 40), (0, 4)])
def test_a_span_outside_the_claims_of_the_text_is_refused(span: tuple[int, int]) -> None:
    """Scores from other generations than the ones read: said, not shown as a wrong highlight."""
    from procexec.errors import ProcexecError

    with pytest.raises(ProcexecError, match="not in its generation text"):
        _example(
            "Step 1: S3 = 1 + 2 = 4",
            first_divergent_step=1,
            correct_prefix=0,
            divergent_claim="4",
            divergent_claim_start=span[0],
            divergent_claim_end=span[1],
        )


def test_analysis_never_imports_the_claim_parser() -> None:
    """Data flows one way: what the report says of a trace is in the score rows."""
    import ast

    for path in (REPO / "src" / "procexec" / "analysis").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert node.module != "procexec.scoring.alignment", path.name
            elif isinstance(node, ast.Import):
                assert "procexec.scoring.alignment" not in [a.name for a in node.names], path.name


def _merged(base: dict, extra: dict) -> dict:
    """Snakemake's --configfile merge: nested mappings update key by key."""
    out = dict(base)
    for key, value in extra.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def test_demo_report_compares_nothing_and_says_why(tmp_path: Path) -> None:
    """The demo runs SmolLM2 only, a model the paper did not test: every paper number is 'not run'."""
    import yaml

    from procexec import config as config_mod
    from procexec.analysis.paper_numbers import load_paper_numbers
    from procexec.cli import main as cli
    from report_fixtures import synthetic_scores, write_aggregate, write_generations, write_references

    raw = _merged(
        yaml.safe_load((REPO / "config.yaml").read_text()), yaml.safe_load((REPO / "config" / "demo.yaml").read_text())
    )
    raw["stage"] = "pilot"
    raw["inference"]["rerun_repetition_guard"] = {"max_pattern_size": 8, "min_pattern_size": 2, "min_count": 3}
    (tmp_path / "config.yaml").write_text(yaml.safe_dump(raw))
    config = config_mod.load(tmp_path / "config.yaml")
    scores = synthetic_scores(
        config.run_models,
        config.suite.datasets,
        config.suite.lengths,
        config.suite.examples_per_length,
    )
    scores.loc[scores.index[:3], ["looping", "loop_period"]] = True, 5  # planted loops
    write_aggregate(scores, tmp_path / "aggregate")
    write_references(scores, tmp_path / "references")
    write_generations(scores, tmp_path / "generations")
    (tmp_path / "figures").mkdir()
    (tmp_path / "figures" / "manifest.json").write_text('{"figures": []}')  # no figure drawn: not under test
    common = [
        "--config",
        str(tmp_path / "config.yaml"),
        "--aggregate-dir",
        str(tmp_path / "aggregate"),
        "--references-dir",
        str(tmp_path / "references"),
    ]
    assert cli(["tables", *common, "--out-dir", str(tmp_path / "tables")]) == 0
    assert (
        cli(
            [
                "report",
                *common,
                "--figures-dir",
                str(tmp_path / "figures"),
                "--tables-dir",
                str(tmp_path / "tables"),
                "--generations-dir",
                str(tmp_path / "generations"),
                "--out",
                str(tmp_path / "report" / "index.html"),
            ]
        )
        == 0
    )
    text = (tmp_path / "report" / "index.html").read_text()
    # a pilot says so in its title and in its header
    assert "<title>pilot stage — 1 example per length · procexec report:" in text
    assert '<p class="stage stage-pilot" id="stage"><strong>Pilot stage</strong>: 1 example per length' in text
    assert "95 steps): a pilot run of the workflow, not the full study, so its numbers are not the study's.</p>" in text
    # the pilot reruns unguarded whatever the config sets (it measures what the guard would change): no deviation
    assert "Deviation from the paper" not in text
    total = len(load_paper_numbers().numbers)
    assert f"0 of {total} published numbers reproduced; 0 differ; {total} not run" in text
    assert text.count('class="verdict-not-run"') == total and 'class="verdict-agrees"' not in text
    # what was not run is collapsed under one summary line, after what the demo measured (nothing here)
    collapsed = text.split('<details class="not-run">', 1)
    assert len(collapsed) == 2 and f"{total} published numbers\n    not run by this study" in collapsed[1]
    assert 'class="verdict-not-run"' not in collapsed[0].split('id="reproduction-table"', 1)[1]
    assert "No published number was measured by this study." in text
    # the loops planted in the synthetic scores are counted per attempt in the model's section
    counts = scores.groupby(["model", "attempt"])["looping"].agg(["sum", "size"])
    assert counts["sum"].sum() > 0, "the synthetic scores plant loops"
    for (model, attempt), row in counts.iterrows():
        section = text.split(f'id="model-{model}"', 1)[1].split("</section>", 1)[0]
        assert (
            f"Attempt {attempt} ending in a repetition loop</td>\n    <td>{row['sum']} of {row['size']}" in section
        ), (model, attempt)
    assert "Outside the comparison (not models of the paper):" in text
    assert '<a href="#model-smollm2-135m-instruct">SM-135M</a> (SmolLM2-135M-Instruct)' in text
    links = Links()
    links.feed(text)
    assert "model-smollm2-135m-instruct" in links.ids and "reproduction" in links.ids


def test_analysis_commands_print_their_completion_line_on_stderr(built, tmp_path, capsys):
    """figures, tables and report tell the job's log what they wrote on stderr, as infer and collect do."""
    common = ["--config", str(built["config"]), "--aggregate-dir", str(built["aggregate"])]
    references = ["--references-dir", str(built["references"])]
    steps = {
        "figures drawn": ["figures", *common, "--out-dir", str(tmp_path / "figures")],
        "tables (CSV + LaTeX)": ["tables", *common, *references, "--out-dir", str(tmp_path / "tables")],
        "report written": [
            "report",
            *common,
            *references,
            "--figures-dir",
            str(built["figures"]),
            "--tables-dir",
            str(built["tables"]),
            "--generations-dir",
            str(built["generations"]),
            "--out",
            str(tmp_path / "report" / "index.html"),
        ],
    }
    capsys.readouterr()
    for completion, argv in steps.items():
        assert main(argv) == 0, argv
        printed = capsys.readouterr()
        assert printed.out == "", argv
        assert len(printed.err.splitlines()) == 1 and completion in printed.err, printed.err

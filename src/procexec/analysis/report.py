"""The appendix report: one self-contained HTML page laid out like the paper's appendix A-I.

Rendered with Jinja2 (templates in the repository's ``reports/templates``, shipped as ``procexec/templates``) and autoescaping on:
model output is untrusted text and is only ever inserted as escaped text, never
with ``|safe``.  Images are linked by paths relative to the page, so the report
opens from disk without a server.  Missing *results* (a model without scores, a
figure without data) are said so in the page; a missing *input* (a folder or
file the report reads: the aggregate, figures, tables, generations, references)
is an error, so a mistyped path never replaces a good report with an empty one.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

import jinja2
import pandas as pd
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from procexec import config as config_mod
from procexec.analysis import paper_numbers, provenance, reproduction
from procexec.analysis.appendix_examples import appendix_examples
from procexec.analysis.artifacts import read_figure_manifest, read_metrics
from procexec.analysis.loops import guarded_models, loop_rows
from procexec.analysis.study import GROUP_TITLES, models_frame
from procexec.analysis.tables import TABLES
from procexec.benchmark.prompts import SYSTEM_PROMPT
from procexec.config.model import Config, ImportedModel
from procexec.errors import ProcexecError, first_problem, reading
from procexec.io.files import atomic_write
from procexec.io.formats import format_fixed, format_interval, format_sci, is_missing
from procexec.io.jsonl import read_json
from procexec.io.parquet import read_columns
from procexec.scoring.score import SCORE_COLUMNS

TEMPLATES_DIR = Path(__file__).resolve().parents[1] / "templates"  # package data: works from a wheel too
# The score columns the report reads (Appendix I examples), with their types.
EXAMPLE_COLUMNS = {
    name: SCORE_COLUMNS[name]
    for name in [
        "model",
        "id",
        "dataset",
        "length",
        "index",
        "attempt",
        "faa",
        "first_answer_raw",
        "expected",
        "looping",
        "finish_reason",
        "first_divergent_step",
        "correct_prefix",
        "first_error_class",
        "divergent_claim",
        "divergent_claim_start",
        "divergent_claim_end",
        "n_answers",
        "truncated",
    ]
}
SECTIONS = {
    "C": "Appendix C: expected-output analysis",
    "D": "Appendix D: FAA vs CAA",
    "E": "Appendix E: heatmaps",
    "F": "Appendix F: generation-level failure modes",
    "X": "Beyond the paper: trace-level diagnostics",
}


def _pct(v: Any) -> str:
    return format_fixed(v, 1)


def _hundredths(v: Any) -> str:
    return format_fixed(v, 2)


# Columns shown per table: (header, column, formatter).
TABLE_COLUMNS: dict[str, list[tuple[str, str, Any]]] = {
    "table1_models": [
        ("Abbrev.", "abbrev", str),
        ("Model", "name", str),
        ("Params", "params", lambda p: "–" if is_missing(p) else str(p)),  # an entry may leave params out
        ("Group", "group", lambda g: GROUP_TITLES.get(g, g)),
    ],
    "table2_par_step_following": [
        ("Model", "abbrev", str),
        ("PAR", "par", _pct),
        ("Exact", "exact", _pct),
        ("Under", "under", _pct),
        ("Over", "over", _pct),
    ],
    "table3_accuracy": [
        ("Model", "name", str),
        ("Abbrev.", "abbrev", str),
        ("Accuracy (%)", "accuracy", _hundredths),
        ("± half-width", "half_width", _hundredths),
        ("n", "n", str),
    ],
    "table4_expected_output": [
        ("Task", "task", str),
        ("Median", "median", format_sci),
        ("Std. Dev.", "std", format_sci),
        ("Min", "min", format_sci),
        ("Max", "max", format_sci),
    ],
}


def load_tables(tables_dir: Path, page_dir: Path) -> dict[str, dict[str, Any]]:
    """Every table of ``TABLES`` from its CSV (written by ``procexec tables``; a missing one is an error)."""
    out = {}
    for spec in TABLES:
        csv_path = tables_dir / f"{spec.id}.csv"
        if not csv_path.is_file():
            raise ProcexecError(f"{csv_path}: table not found (run `procexec tables` first)")
        columns = TABLE_COLUMNS[spec.id]
        with reading(csv_path, faults=(ValueError, pd.errors.ParserError)):
            frame = pd.read_csv(csv_path, keep_default_na=False, na_values=[""], encoding="utf-8")
        missing = [c for _, c, _ in columns if c not in frame.columns]
        if missing:
            raise ProcexecError(f"{csv_path}: missing column(s) {', '.join(missing)}")
        try:
            rows = [[fmt(row[c]) for _, c, fmt in columns] for _, row in frame.iterrows()]
        except (TypeError, ValueError) as exc:
            raise ProcexecError(f"{csv_path}: a value of the wrong kind ({exc})") from None
        tex = csv_path.with_suffix(".tex")
        out[spec.id] = {
            "id": spec.id,
            "number": spec.number,
            "caption": spec.caption,
            "rows": rows,
            "headers": [h for h, _, _ in columns],
            "csv": _rel(csv_path, page_dir),
            "tex": _rel(tex, page_dir) if tex.exists() else None,
        }
    return out


def _rel(path: Path, page_dir: Path) -> str:
    return Path(os.path.relpath(path.resolve(), page_dir.resolve())).as_posix()


def load_figures(figures_dir: Path, page_dir: Path) -> list[dict[str, Any]]:
    figures = []
    for figure in read_figure_manifest(figures_dir):
        files = figure.get("files") or []
        figure = dict(figure, anchor=f"fig-{figure['id']}")
        figure["png"] = next((_rel(figures_dir / f, page_dir) for f in files if f.endswith(".png")), None)
        figure["svg"] = next((_rel(figures_dir / f, page_dir) for f in files if f.endswith(".svg")), None)
        figures.append(figure)
    return figures


class ReproductionRow(BaseModel):
    """One row of ``reproduction.csv`` (``procexec tables``), as the report reads it."""

    model_config = ConfigDict(extra="allow")

    id: Annotated[str, Field(min_length=1)]
    source: str
    model: str | None = None
    model_key: str | None = None
    averaged_over: str | None = None
    measures: str
    note: str | None = None
    explained_by: str | None = None
    verdict: Literal[reproduction.VERDICTS]  # type: ignore[valid-type]  # pydantic reads the tuple; mypy cannot
    rule: Literal["interval", "bound", "magnitude"] | None = None
    paper_value: float | None = None
    paper_half_width: float | None = None
    paper_decimals: Annotated[int, Field(ge=0, le=20)] | None = None
    ours: float | None = None
    ours_ci_low: float | None = None
    ours_ci_high: float | None = None
    difference: float | None = None
    tolerance: float | None = None


def check_rows(frame: pd.DataFrame, model: type[BaseModel], path: Path) -> None:
    """Every row of a CSV the workflow wrote fits ``model``: one line naming the file, line and column if not."""
    missing = [name for name, info in model.model_fields.items() if info.is_required() and name not in frame.columns]
    if missing:
        raise ProcexecError(f"{path}: missing column(s) {', '.join(missing)} (run `procexec tables` again)")
    for number, row in enumerate(frame.to_dict("records"), start=2):
        values = {k: (None if not isinstance(v, str) and pd.isna(v) else v) for k, v in row.items()}
        try:
            model.model_validate(values)
        except ValidationError as exc:
            error = exc.errors(include_url=False)[0]
            column = ".".join(str(part) for part in error["loc"])
            raise ProcexecError(
                f"{path}:{number}: column '{column}': {error['msg']} (got {error.get('input')!r:.40})"
            ) from None


def load_reproduction(
    tables_dir: Path, page_dir: Path, models: pd.DataFrame, figures: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """The reproduction section: summary, one row per published number, links that explain a difference.

    A differing number links to its model's Appendix G section and to the figures or
    tables its data entry names; the study's models that are not the paper's are listed apart.
    """
    paper = paper_numbers.load_paper_numbers()
    outside = reproduction.outside_comparison(models, paper)
    section: dict[str, Any] = {"rows": None, "outside": outside[["model", "abbrev", "name"]].to_dict("records")}
    csv_path = tables_dir / f"{reproduction.TABLE_ID}.csv"
    if not csv_path.exists():
        return section
    with reading(csv_path, faults=(ValueError, pd.errors.ParserError)):
        frame = pd.read_csv(csv_path, keep_default_na=False, na_values=[""], encoding="utf-8")
    check_rows(frame, ReproductionRow, csv_path)
    table_numbers = {spec.id: spec.number for spec in TABLES}
    rows = []
    for _, row in frame.iterrows():
        links = []
        if row["verdict"] == "differs":
            if isinstance(row["model_key"], str):
                links.append({"text": f"Appendix G: {row['model']}", "href": f"#model-{row['model_key']}"})
            for ref in row["explained_by"].split(";") if isinstance(row["explained_by"], str) else ():
                if ref in figures:
                    links.append({"text": f"Figure {figures[ref]['number']}", "href": f"#{figures[ref]['anchor']}"})
                elif ref in table_numbers:
                    links.append({"text": f"Table {table_numbers[ref]}", "href": f"#{ref}"})
        rows.append(
            {
                "anchor": f"reproduction-{row['id']}",
                "source": row["source"],
                "model": reproduction.model_text(row),
                "measures": row["measures"],
                "note": row["note"] if isinstance(row["note"], str) else None,
                "paper": reproduction.paper_text(row),
                "ours": reproduction.ours_text(row),
                "difference": reproduction.difference_text(row),
                "verdict": row["verdict"],
                "verdict_class": row["verdict"].replace(" ", "-"),
                "links": links,
            }
        )
    tex_path = csv_path.with_suffix(".tex")
    section.update(
        rows=rows,
        counts=reproduction.summary(frame),
        summary=reproduction.summary_line(frame),
        csv=_rel(csv_path, page_dir),
        tex=_rel(tex_path, page_dir) if tex_path.exists() else None,
    )
    return section


# --------------------------------------------------------------------------- page


def loop_counts(scores: pd.DataFrame, model: str) -> list[dict[str, Any]]:
    """Per attempt of one model: scored generations, those ending in a repetition loop, those the guard stopped."""
    own = scores[scores["model"] == model]
    return [
        {
            "attempt": int(attempt),
            "n": len(rows),
            "looping": int(rows["looping"].sum()),
            "guard_stops": int((rows["finish_reason"] == "repetition").sum()),
        }
        for attempt, rows in own.groupby("attempt")
    ]


def missing_answers(scores: pd.DataFrame, model: str) -> dict[str, int] | None:
    """What the line at the top of a model's section counts, so its zeros read as the model's floor, not a fault:
    of the scored generations, those without an ``<answer>`` tag and those cut at the token budget (each of them
    counts as wrong). None where every generation has a tag and not all were cut."""
    own = scores[scores["model"] == model]
    no_tag = own["n_answers"] == 0
    cut = own["truncated"].astype(bool)
    if own.empty or (not no_tag.any() and not cut.all()):
        return None
    return {
        "n": len(own),
        "no_tag": int(no_tag.sum()),
        "truncated": int(cut.sum()),
        "no_tag_cut": int((no_tag & cut).sum()),
    }


def model_sections(
    models: pd.DataFrame,
    metrics: pd.DataFrame | None,
    figures: list[dict[str, Any]],
    examples: dict[str, list],
    hours: pd.DataFrame,
    scores: pd.DataFrame,
) -> list[dict[str, Any]]:
    overall = pd.DataFrame() if metrics is None else metrics[metrics["grouping"] == "overall"]
    sections = []
    for row in models.to_dict("records"):
        own = overall[overall["model"] == row["model"]].set_index("metric") if len(overall) else overall
        stats = {}
        for name in ("faa", "caa", "par", "tolerance_accuracy", "truncation_rate"):
            if name in own.index:
                r = own.loc[name]
                stats[name] = format_interval(100 * r["value"], 100 * r["ci_low"], 100 * r["ci_high"], 1)
        hrs = hours[hours["model"] == row["model"]].iloc[0]
        sections.append(
            {
                **row,
                "anchor": f"model-{row['model']}",
                "has_scores": bool(stats),
                "stats": stats,
                "n": int(own.loc["faa", "n"]) if "faa" in own.index else 0,
                "gpu_hours": float(hrs["gpu_hours"]),
                "shards": int(hrs["shards"]),
                "origin": hrs["origin"],
                "figures": [f for f in figures if f.get("model") == row["model"]],
                "examples": examples.get(row["model"], []),
                "loops": loop_counts(scores, row["model"]),
                "missing": missing_answers(scores, row["model"]),
            }
        )
    return sections


class ShownPrompt(BaseModel):
    """A rendered-prompt file (``procexec show-prompt --out``), as the report's template reads it: what the
    template needs is checked here, so a file without it is one line naming the file and the field."""

    model_config = ConfigDict(extra="allow")

    model: str
    example: str
    commit: str | None
    tokenizer_mode: str
    template_kwargs: dict[str, Any]
    route: Literal["chat", "token ids"]
    system_folded: bool | None
    messages: list[dict[str, Any]] | None = None  # the chat route's turns
    text: str | None = None
    decoded: str | None = None  # the token-ids route's prompt, decoded for reading
    prompt_tokens: Annotated[int, Field(ge=1)] | None = None
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None

    def route_problem(self) -> str | None:
        """The fields its route needs that it lacks (None: none)."""
        needed = ["messages"] if self.route == "chat" else ["decoded", "prompt_tokens", "sha256"]
        lacking = [name for name in needed if getattr(self, name) is None]
        return f"route '{self.route}' needs {', '.join(lacking)}" if lacking else None


def load_prompts(prompts_dir: Path | None, models: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """model key -> its rendered prompt and commit (``procexec show-prompt --out``), for the models that have one."""

    out: dict[str, dict[str, Any]] = {}
    if prompts_dir is None:
        return out
    for key in models["model"]:
        path = prompts_dir / f"{key}.json"
        if path.is_file():
            shown = read_json(path, what="rendered prompt (procexec show-prompt --out)")
            try:
                prompt = ShownPrompt.model_validate(shown)
            except ValidationError as exc:
                raise ProcexecError(
                    f"{path}: not a rendered prompt (procexec show-prompt --out): "
                    f"{first_problem(exc, whole='the file')}"
                ) from None
            if prompt.model != key:
                raise ProcexecError(f"{path}: not the rendered prompt of model {key!r} (procexec show-prompt --out)")
            problem = prompt.route_problem()
            if problem:
                raise ProcexecError(f"{path}: not a rendered prompt (procexec show-prompt --out): {problem}")
            out[key] = prompt.model_dump()
    return out


def imported_origins(config: Config, keys: list[str]) -> dict[str, dict[str, Any]]:
    """Where each imported model's generations came from (harness, logs, prompt check): the report shows it
    where it shows GPU-hours, commits and rendered prompts for the models this study ran."""
    origins: dict[str, dict[str, Any]] = {}
    for key in keys:
        entry = config.models.get(key)
        if isinstance(entry, ImportedModel):
            logs = [str(path) for pattern in entry.log_patterns for path in config_mod.harness_log_files(pattern)]
            origins[key] = {"model": key, "abbrev": entry.abbrev, "harness": entry.harness, "logs": logs}
            origins[key]["model_dir"] = entry.model_dir
    return origins


def render(
    config_paths: Sequence[str | Path],
    config: Config,
    aggregate_dir: str | Path,
    figures_dir: str | Path,
    tables_dir: str | Path,
    generations_dir: str | Path,
    references_dir: str | Path,
    benchmarks: Sequence[str | Path],
    out: str | Path,
    templates_dir: str | Path = TEMPLATES_DIR,
    prompts_dir: str | Path | None = None,
    speculative: Sequence[dict[str, Any]] = (),
    loops: Sequence[dict[str, Any]] = (),
    cost: dict[str, Any] | None = None,
) -> Path:
    """Write the report page to ``out`` and return its path (nothing is written if an input is missing);
    ``config``: the study ``config_paths`` hold, its layouts planned (each model's GPUs multiply its wall time);
    ``loops`` and ``cost``: the pilot's loop figures and its projection (``procexec.analysis.loops``)."""
    out = Path(out)
    page_dir = out.parent
    inputs = {
        "--aggregate-dir": aggregate_dir,
        "--figures-dir": figures_dir,
        "--tables-dir": tables_dir,
        "--generations-dir": generations_dir,
        "--references-dir": references_dir,
        "--prompts-dir": prompts_dir,
    }
    for flag, directory in inputs.items():
        if directory is not None and not Path(directory).is_dir():
            raise ProcexecError(f"{directory}: directory not found ({flag})")
    metrics = read_metrics(aggregate_dir)  # also settles an interrupted `procexec aggregate` commit
    scores = read_columns(Path(aggregate_dir) / "scores.parquet", EXAMPLE_COLUMNS)
    models = models_frame(config, present=list(metrics["model"].unique()))
    figures = load_figures(Path(figures_dir), page_dir)
    tables = load_tables(Path(tables_dir), page_dir)
    examples = appendix_examples(scores, Path(generations_dir), Path(references_dir))
    hours = provenance.gpu_hours(models, benchmarks)
    prompts = load_prompts(None if prompts_dir is None else Path(prompts_dir), models)
    hours["commit"] = [prompts.get(key, {}).get("commit") for key in hours["model"]]
    origins = imported_origins(config, list(models["model"]))
    hours["origin"] = [origins.get(key) for key in hours["model"]]
    comparison = load_reproduction(Path(tables_dir), page_dir, models, {f["id"]: f for f in figures})
    abbrevs = dict(zip(models["model"], models["abbrev"], strict=True))
    drafting = [{**row, "abbrev": abbrevs.get(row["model"], row["model"])} for row in speculative]
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["fixed"] = format_fixed
    if not Path(templates_dir).is_dir():
        raise ProcexecError(f"{templates_dir}: templates directory not found (--templates-dir)")
    with reading(templates_dir, faults=(jinja2.TemplateError,)):
        html = env.get_template("report.html.j2").render(
            provenance=provenance.run_provenance(config_paths),
            stage={
                "name": config.stage or "full",
                "per_length": config.suite.examples_per_length,
                "lengths": config.suite.lengths,
            },
            hours=hours.merge(models[["model", "abbrev"]], on="model").to_dict("records"),
            total_gpu_hours=float(hours["gpu_hours"].sum()),
            tables=tables,
            figures={f["id"]: f for f in figures},
            sections={key: [f for f in figures if f["section"] == key] for key in ("main", *SECTIONS)},
            section_titles=SECTIONS,
            models=model_sections(models, metrics, figures, examples, hours, scores),
            guarded=guarded_models(config, loops, list(models["model"])),  # the deviation each model's section states
            loops=loop_rows(loops, cost, abbrevs),
            system_prompt=SYSTEM_PROMPT,
            reproduction=comparison,
            speculative=drafting,
            imported=list(origins.values()),
            prompts=[
                {**prompts[m["model"]], "abbrev": m["abbrev"]}
                for m in models.to_dict("records")
                if m["model"] in prompts
            ],
        )
    with atomic_write(out) as handle:
        handle.write(html)
    return out

"""The paper's published numbers: every cell of Tables 2-4 and each quantitative claim of the text, checked.

They live in ``procexec/data/paper_numbers.yaml`` (schema: ``schemas/paper_numbers.schema.json``),
each with what it measures: a statistic over one or two selections of the paper's
suite, for a model or averaged over several.  ``procexec.analysis.reproduction`` sets
ours beside them; rules: docs/decisions.md.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from procexec.analysis.aggregate import METRICS
from procexec.benchmark.suite import DatasetSpec, expand_suite
from procexec.config.model import Family, InputRange
from procexec.errors import ProcexecError

DATA_FILE = "data/paper_numbers.yaml"
SCHEMA_FILE = "schemas/paper_numbers.schema.json"
SCORE_STATISTICS = {"value": 1, "difference": 2, "relative_difference": 2}  # -> number of terms
REFERENCE_STATISTICS = ("median", "std", "min", "max")  # Table 4, over reference final values

Selection = tuple[tuple[str, tuple[Any, ...]], ...]  # sorted (score column, allowed values) pairs; () = all


@dataclass(frozen=True)
class PublishedNumber:
    id: str
    source: str
    model: str | None  # paper abbreviation; None for a cross-model number
    models: tuple[str, ...]  # every paper model the number involves
    terms: tuple[tuple[str, Selection], ...]  # (metric, selection) combined by ``statistic``
    statistic: str
    comparison: str
    unit: str
    value: float
    half_width: float | None
    decimals: int | None  # None: printed to significant digits (Table 4), where rounding does not enter the rule
    measures: str
    quote: str | None
    explained_by: tuple[str, ...]
    note: str | None

    @property
    def rounding(self) -> float:
        """Half a unit of the last printed digit: how far the exact value may be from the printed one."""
        return 0.0 if self.decimals is None else 0.5 * 10.0**-self.decimals

    @property
    def from_references(self) -> bool:
        return self.statistic in REFERENCE_STATISTICS

    @property
    def rule(self) -> str:
        """How the verdict is reached: ``interval``, ``bound`` (the text gives a bound) or ``magnitude`` (Table 4)."""
        if self.from_references:
            return "magnitude"
        return "bound" if self.comparison == "greater_than" else "interval"

    @property
    def formula(self) -> str:
        """The statistic as a compact expression, e.g. ``faa(length=5) - faa(length=95)``."""
        parts = [f"{metric}({selection_text(selection)})" for metric, selection in self.terms]
        if self.statistic == "difference":
            text = f"{parts[0]} - {parts[1]}"
        elif self.statistic == "relative_difference":
            text = f"({parts[0]} - {parts[1]}) / {parts[0]}"
        elif self.from_references:
            text = f"{self.statistic} {parts[0]}"
        else:
            text = parts[0]
        return text if self.model is not None or self.from_references else f"mean over models of {text}"


@dataclass(frozen=True)
class PaperNumbers:
    models: tuple[str, ...]  # the paper's abbreviations, Table 1 order
    datasets: tuple[DatasetSpec, ...]  # the paper's suite
    lengths: tuple[int, ...]
    numbers: tuple[PublishedNumber, ...]

    def cells(self, selection: Selection) -> set[tuple[str, int]]:
        """The paper suite's (dataset, length) groups a selection covers."""
        wanted = dict(selection)
        lengths = [n for n in self.lengths if "length" not in wanted or n in wanted["length"]]
        return {(spec.id, n) for spec in self.datasets if _dataset_matches(spec, wanted) for n in lengths}


@dataclass(frozen=True)
class _PaperSuite:
    """The paper's datasets as ``expand_suite`` reads them (the file's ``suite:`` names no seed: no config Suite)."""

    inputs: list[InputRange]
    families: dict[str, Family]
    datasets: None = None  # the whole suite

    @classmethod
    def of(cls, suite: dict[str, Any]) -> _PaperSuite:
        return cls(
            [InputRange.model_validate(entry) for entry in suite["inputs"]],
            {name: Family.model_validate(family) for name, family in suite["families"].items()},
        )


def _dataset_matches(spec: DatasetSpec, wanted: dict[str, tuple[Any, ...]]) -> bool:
    attributes = {
        "operator": spec.operator,
        "input_type": spec.setting.type,
        "input_range": spec.setting.range_label,
        "lookback": spec.lookback,
    }
    return all(attributes[key] in values for key, values in wanted.items() if key != "length")


def _selection(raw: dict[str, list[Any]]) -> Selection:
    return tuple(sorted((key, tuple(sorted(values))) for key, values in raw.items()))


def selection_text(selection: Selection) -> str:
    if not selection:
        return "all"
    return ", ".join(f"{key}={'|'.join(map(str, values))}" for key, values in selection)


def load_paper_numbers(path: str | Path | None = None) -> PaperNumbers:
    """Read and check the paper's numbers (the packaged file unless ``path`` is given)."""
    if path is None:
        source, text = f"procexec/{DATA_FILE}", resources.files("procexec").joinpath(DATA_FILE).read_text()
    else:
        source, text = str(path), Path(path).read_text()
    raw = yaml.safe_load(text)
    schema = json.loads(resources.files("procexec").joinpath(SCHEMA_FILE).read_text())
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(raw), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{_schema_where(raw, e)}: {e.message}" for e in errors[:10]]
        raise ProcexecError(f"{source}: invalid paper numbers\n  " + "\n  ".join(lines))
    models = tuple(m["abbrev"] for m in raw["models"])
    paper = PaperNumbers(
        models=models,
        datasets=tuple(expand_suite(_PaperSuite.of(raw["suite"]))),
        lengths=tuple(raw["suite"]["lengths"]),
        numbers=tuple(_number(entry, models) for entry in raw["numbers"]),
    )
    problems = _problems(paper)
    if problems:
        raise ProcexecError(f"{source}: invalid paper numbers\n  " + "\n  ".join(problems))
    return paper


def _schema_where(raw: Any, error: jsonschema.ValidationError) -> str:
    path = list(error.absolute_path)
    if len(path) >= 2 and path[0] == "numbers" and isinstance(raw, dict):
        number = raw["numbers"][path[1]]
        name = number.get("id", f"#{path[1]}") if isinstance(number, dict) else f"#{path[1]}"
        return ".".join(["numbers", str(name), *map(str, path[2:])])
    return ".".join(map(str, path)) or "<top level>"


def _number(number: dict[str, Any], paper_models: tuple[str, ...]) -> PublishedNumber:
    grouping = [_selection(s) for s in number["grouping"]]
    metrics = number["metric"] if isinstance(number["metric"], list) else [number["metric"]]
    size = max(len(grouping), len(metrics))
    grouping = grouping * size if len(grouping) == 1 else grouping
    metrics = metrics * size if len(metrics) == 1 else metrics
    averaged = number.get("averaged_over")
    models = (number["model"],) if number["model"] else paper_models if averaged in ("all", None) else tuple(averaged)
    paper = number["paper"]
    return PublishedNumber(
        id=number["id"],
        source=number["source"],
        model=number["model"],
        models=() if number["metric"] == "expected_output" else models,
        terms=tuple(zip(metrics, grouping)),
        statistic=number["statistic"],
        comparison=number.get("comparison", "equal"),
        unit=number["unit"],
        value=float(paper["value"]),
        half_width=paper.get("half_width"),
        decimals=paper.get("decimals"),
        measures=number["measures"],
        quote=number.get("quote"),
        explained_by=tuple(number.get("explained_by", ())),
        note=number.get("note"),
    )


def _problems(paper: PaperNumbers) -> list[str]:
    """Cross-field rules the schema cannot say."""
    problems = []
    seen: set[str] = set()
    for number in paper.numbers:
        where = f"numbers.{number.id}"
        if number.id in seen:
            problems.append(f"{where}: duplicate id")
        seen.add(number.id)
        unknown = [m for m in number.models if m not in paper.models]
        if unknown:
            problems.append(f"{where}: unknown model {', '.join(unknown)} (known: {', '.join(paper.models)})")
        metrics = {metric for metric, _ in number.terms}
        if number.from_references:
            if metrics != {"expected_output"} or len(number.terms) != 1:
                problems.append(f"{where}: {number.statistic} takes one selection of metric expected_output")
        elif "expected_output" in metrics or not metrics <= set(METRICS):
            problems.append(f"{where}: statistic {number.statistic} needs metrics of {', '.join(METRICS)}")
        elif len(number.terms) != SCORE_STATISTICS[number.statistic]:
            problems.append(
                f"{where}: {number.statistic} takes {SCORE_STATISTICS[number.statistic]} "
                f"selection(s), got {len(number.terms)}"
            )
        for _, selection in number.terms:
            if not paper.cells(selection):
                problems.append(f"{where}: selection {selection_text(selection)} matches nothing in the suite")
    return problems

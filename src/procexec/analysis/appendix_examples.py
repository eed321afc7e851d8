"""Appendix I of the report: per model, the shortest wrong example with a divergent step and the shortest right
one, the model's text beside the reference trace, aligned as the score row says (the page renders these views).

The excerpt and the trace are cut to sizes the page can carry with 15 models; the divergent claim is its own
segment, so the template highlights it without ever marking up model text (autoescaping stays on).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd

from procexec.errors import ProcexecError
from procexec.io.formats import is_missing
from procexec.io.jsonl import read_jsonl
from procexec.records import GenerationRecord, Record, Reference

EXCERPT_CHARS = 12_000  # per generation shown; the page must stay light with 15 models
VALUE_CHARS = 48  # a 190-digit value is cut in the trace table (full value in the title attribute)


@dataclass
class TraceRow:
    var: int
    reference: str
    claimed: str  # what the model column says
    status: str  # input | match | differs | missing | after | unaligned
    divergent: bool


# The model column of each status but "differs" (which shows the claimed value).
CLAIM_TEXT = {"input": "input", "match": "agrees", "missing": "no claim (skipped)", "after": "—", "unaligned": "—"}


def _cut(value: str) -> str:
    return value if len(value) <= VALUE_CHARS else value[: VALUE_CHARS - 1] + "…"


def _segment(text: str, mark: bool = False, omitted: bool = False) -> dict[str, Any]:
    return {"text": text, "mark": mark, "omitted": omitted}


def _segments(text: str, span: tuple[int, int] | None) -> list[dict[str, Any]]:
    """The excerpt as text segments; the divergent claim is its own (highlighted) segment."""
    centre = span[0] if span else 0
    start = max(0, min(centre - EXCERPT_CHARS // 3, len(text) - EXCERPT_CHARS))
    end = min(len(text), start + EXCERPT_CHARS)
    parts = []
    if start:
        parts.append(_segment(f"[… {start} characters omitted …]\n", omitted=True))
    if span and start <= span[0] and span[1] <= end:
        parts += [
            _segment(text[start : span[0]]),
            _segment(text[span[0] : span[1]], mark=True),
            _segment(text[span[1] : end]),
        ]
    else:
        parts.append(_segment(text[start:end]))
    if end < len(text):
        parts.append(_segment(f"\n[… {len(text) - end} characters omitted …]", omitted=True))
    return parts


def _span(gen: GenerationRecord, row: pd.Series) -> tuple[int, int] | None:
    """The divergent claim's ``S<j> =`` in the text, as the score row gives it (refused if it is not there)."""
    if is_missing(row["divergent_claim_start"]):
        return None
    start, end = int(row["divergent_claim_start"]), int(row["divergent_claim_end"])
    if not 0 <= start < end <= len(gen.text) or gen.text[start] + gen.text[end - 1] != "S=":
        raise ProcexecError(
            f"{gen.id} (attempt {gen.attempt}): the scores' divergent claim at characters "
            f"{start}-{end} is not in its generation text; were they scored from other generations?"
        )
    return start, end


def _status(var: int, divergent: int | None, aligned: bool, claimed: bool) -> str:
    if var <= 2:
        return "input"
    if not aligned:
        return "unaligned"
    if divergent is None or var < divergent:
        return "match"
    if var == divergent:
        return "differs" if claimed else "missing"
    return "after"


def example_view(gen: GenerationRecord, ref: Reference, row: pd.Series) -> dict[str, Any]:
    """One Appendix I entry: excerpt of the model's text beside the reference trace, aligned as the score row says."""
    divergent = None if is_missing(row["first_divergent_step"]) else int(row["first_divergent_step"]) + 2
    claim = None if is_missing(row["divergent_claim"]) else row["divergent_claim"]
    aligned = not is_missing(row["correct_prefix"])
    trace = []
    for var, value in enumerate(ref.trace, start=1):
        status = _status(var, divergent, aligned, claim is not None)
        trace.append(
            TraceRow(
                var,
                _cut(value),
                _cut(claim) if status == "differs" and claim is not None else CLAIM_TEXT[status],
                status,
                var == divergent,
            )
        )
    return {
        "id": gen.id,
        "dataset": gen.dataset,
        "length": gen.length,
        "attempt": gen.attempt,
        "correct": bool(row["faa"]),
        "first_divergent_step": None if divergent is None else divergent - 2,
        "error_class": None if is_missing(row["first_error_class"]) else row["first_error_class"].replace("_", " "),
        "first_answer": None if is_missing(row["first_answer_raw"]) else row["first_answer_raw"],
        "expected": ref.final,
        "finish_reason": gen.finish_reason,
        "tokens": gen.num_generated_tokens,
        "segments": _segments(gen.text, _span(gen, row)),
        "trace": trace,
    }


def pick_examples(scores: pd.DataFrame) -> pd.DataFrame:
    """Per model: the shortest incorrect example with a divergent step, and the shortest correct one."""
    ordered = scores.sort_values(["model", "length", "dataset", "index"])
    wrong = ordered[~ordered["faa"] & ordered["first_divergent_step"].notna()].groupby("model").head(1)
    right = ordered[ordered["faa"]].groupby("model").head(1)
    return pd.concat([wrong, right])


R = TypeVar("R", bound=Record)


def _find(path: Path, wanted: dict[str, int | None], cls: type[R]) -> dict[str, R]:
    """Records of ``path`` whose id is wanted (with that attempt, when given), stopping once all are found."""
    found: dict[str, R] = {}
    for line, obj in read_jsonl(path):
        rid = obj.get("id")
        if rid in wanted and rid not in found and wanted[rid] in (None, obj.get("attempt")):
            found[rid] = cls.from_json(obj, f"{path}:{line}")
            if len(found) == len(wanted):
                break
    missing = [rid for rid in wanted if rid not in found]
    if missing:
        raise ProcexecError(f"{path}: no record for {missing[0]!r}, which the scores name")
    return found


def appendix_examples(scores: pd.DataFrame, generations_dir: Path, references_dir: Path) -> dict[str, list]:
    """Appendix I per model: ``pick_examples`` rows with their generation text and reference trace."""
    out: dict[str, list] = {}
    picked = pick_examples(scores)
    for (model, dataset), rows in picked.groupby(["model", "dataset"], sort=False):
        gens = _find(
            generations_dir / model / f"{dataset}.jsonl.gz",
            dict(zip(rows["id"], rows["attempt"].astype(int))),
            GenerationRecord,
        )
        refs = _find(references_dir / f"{dataset}.jsonl", dict.fromkeys(rows["id"]), Reference)
        for _, row in rows.iterrows():
            out.setdefault(model, []).append(example_view(gens[row["id"]], refs[row["id"]], row))
    return out

"""One harness sample scored by procexec's scorer: a suite row and the raw text a model returned for it.

lm-eval's ``process_results``, inspect's scorer and ``procexec import-harness`` all go through here, so a text
gets the same score row whichever harness produced it (``procexec.scoring.score.score_example``).  What a
harness does not report (lm-eval: the finish reason and token counts) stays null, never guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from procexec.records import GenerationRecord
from procexec.release.rows import example_of, reference_of
from procexec.scoring.score import score_example

#: The metrics both harnesses report, as procexec.analysis.aggregate defines them: a mean over examples,
#: AP over the examples that have a parseable answer (NaN elsewhere, skipped by ``nanmean``).
HARNESS_METRICS = ("faa", "caa", "par", "ap", "sfb_under", "sfb_exact", "sfb_over", "tolerance_accuracy")
#: The model field of a record scored inside a harness, which names no procexec model.
HARNESS_MODEL = "harness"


@dataclass(frozen=True)
class HarnessOutput:
    """What a harness knows about one generation; None where it does not know."""

    text: str
    finish_reason: str | None = None
    num_generated_tokens: int | None = None
    token_ids: list[int] | None = None
    token_offsets: list[int] | None = None
    prompt_sha256: str = ""
    prompt_tokens: int = 0
    provenance: dict[str, Any] = field(default_factory=dict)


def generation_record(
    row: dict[str, Any], output: HarnessOutput, model: str = HARNESS_MODEL, where: str = ""
) -> GenerationRecord:
    """The procexec record of one harness generation (attempt 1: a harness makes one)."""
    return GenerationRecord.from_json(
        {
            "id": row["id"],
            "model": model,
            "dataset": row["dataset"],
            "length": row["length"],
            "index": row["index"],
            "attempt": 1,
            "text": output.text,
            "num_generated_tokens": output.num_generated_tokens,
            "finish_reason": output.finish_reason,
            "token_ids": output.token_ids,
            "token_offsets": output.token_offsets,
            "prompt_sha256": output.prompt_sha256,
            "prompt_tokens": output.prompt_tokens,
            "provenance": output.provenance,
        },
        where,
    )


def score_row(row: dict[str, Any], record: GenerationRecord) -> dict[str, Any]:
    """procexec's score row of a record for a suite row."""
    return score_example(record, reference_of(row), example_of(row))


def metric_values(score: dict[str, Any]) -> dict[str, float]:
    """One example's contribution to each of HARNESS_METRICS (their means are the metrics)."""
    sfb = score["step_following"]
    return {
        "faa": float(score["faa"]),
        "caa": float(score["caa"]),
        "par": float(score["parseable"]),
        "ap": math.nan if score["answer_position"] is None else score["answer_position"],
        "sfb_under": float(sfb == "under"),
        "sfb_exact": float(sfb == "exact"),
        "sfb_over": float(sfb == "over"),
        "tolerance_accuracy": float(score["tolerance_match"]),
    }


def nanmean(values: list[float]) -> float:
    """The mean of the values that are not NaN (AP's aggregation); NaN when none is."""
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan

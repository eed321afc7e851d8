"""Per-example scores: the paper's five metrics plus tolerance, truncation, trace alignment and tail loops.

Pure functions from (generation, reference, example) to one row whose columns
are exactly the score columns of docs/interfaces.md; every definition lives in
docs/scoring.md.  File handling is in ``procexec.scoring.files``.
"""

from __future__ import annotations

import math
import re
from bisect import bisect_right
from typing import Any

from procexec.benchmark.executor import format_value, parse_value
from procexec.benchmark.procedure import parse_rows
from procexec.io.files import encodable
from procexec.records import Example, GenerationRecord, Reference, ends_looping
from procexec.scoring.alignment import ERROR_CLASSES, Alignment, align
from procexec.scoring.extract import (
    MAX_SPAN_CHARS,
    AnswerSpan,
    extract_answers,
    rounded_match,
    tolerance_match,
    values_agree,
)
from procexec.scoring.loops import record_loop

# Column name -> Arrow type name, in the order of docs/interfaces.md.
SCORE_COLUMNS: dict[str, str] = {
    "id": "string",
    "model": "string",
    "dataset": "string",
    "length": "int64",
    "index": "int64",
    "input_type": "string",
    "input_range": "string",
    "operator": "string",
    "lookback": "int64",
    "attempt": "int64",
    "expected": "string",
    "expected_float": "float64",
    "expected_log10_abs": "float64",
    "faa": "bool",
    "caa": "bool",
    "parseable": "bool",
    "n_answers": "int64",
    "n_parseable": "int64",
    "first_answer_raw": "string",
    "first_answer_value": "string",
    "answer_position": "float64",
    "answer_position_basis": "string",
    "steps_generated": "int64",
    "step_following": "string",
    "tolerance_match": "bool",
    "truncated": "bool",
    "finish_reason": "string",
    "num_generated_tokens": "int64",
    "first_divergent_step": "int64",
    "correct_prefix": "int64",
    "n_claims": "int64",
    "n_arithmetic_slip": "int64",
    "n_wrong_operand": "int64",
    "n_skipped": "int64",
    "n_propagation": "int64",
    "first_error_class": "string",
    "divergent_claim": "string",
    "divergent_claim_start": "int64",
    "divergent_claim_end": "int64",
    "answer_matches_last_claim": "bool",
    "looping": "bool",
    "loop_period": "int64",
}

_STEP_MARKER = re.compile(r"Step[ \t]++([0-9]++)")  # literal prefix: fast; word boundary checked below


def reference_value(ref: Reference) -> int | float:
    """The exact reference value (a Python int for integer results)."""
    return parse_value(ref.final)


def log10_abs(value: int | float) -> float:
    """log10|v| without overflow for huge ints; -inf for 0, inf for +-inf, nan for nan."""
    if value == 0:
        return -math.inf
    if type(value) is float and not math.isfinite(value):
        return math.inf if value == value else math.nan
    return math.log10(abs(value))


def answer_position(
    span: AnswerSpan, text: str, offsets: list[int] | None, num_tokens: int | None
) -> tuple[float, str]:
    """AP of one example: the token holding the span's ``<`` over the generated tokens, x 100.

    Without token offsets the position is measured in characters (basis "chars").
    """
    if offsets:
        token = max(bisect_right(offsets, span.start) - 1, 0)
        return 100.0 * token / (num_tokens or len(offsets)), "tokens"
    return 100.0 * span.start / len(text), "chars"


def steps_generated(text: str) -> int:
    """G: the number of distinct ``Step k`` markers (k compared as a number)."""
    return len(
        {
            m.group(1).lstrip("0")
            for m in _STEP_MARKER.finditer(text)
            if m.start() == 0 or not text[m.start() - 1].isalnum()
        }
    )


def step_following(generated: int, expected: int) -> str:
    """SFB class of one example: G against the procedure length T."""
    return "under" if generated < expected else "exact" if generated == expected else "over"


def _alignment(gen: GenerationRecord, ref: Reference, example: Example) -> Alignment | None:
    if len(ref.trace) != example.length + 2:  # appendix-a trace with skipped steps: no step map
        return None
    return align(gen.text, parse_rows(example.procedure), ref.trace)


def score_example(gen: GenerationRecord, ref: Reference, example: Example) -> dict[str, Any]:
    """One score row (columns and order as ``SCORE_COLUMNS``)."""
    expected = reference_value(ref)
    spans = extract_answers(gen.text)
    parsed = [s for s in spans if s.value is not None]
    first = spans[0] if spans else None
    first_parsed = parsed[0] if parsed else None
    faa = first is not None and first.value is not None and rounded_match(first.value, expected)
    if first_parsed is not None:
        ap, basis = answer_position(first_parsed, gen.text, gen.token_offsets, gen.num_generated_tokens)
    else:
        ap, basis = None, None
    g = steps_generated(gen.text)
    al = _alignment(gen, ref, example)
    last_claim = None if al is None else al.last_claim
    claim = None if al is None else al.divergent_claim
    loop = record_loop(gen)  # the verdict made with the record, as status counts it
    return {
        "id": gen.id,
        "model": gen.model,
        "dataset": gen.dataset,
        "length": gen.length,
        "index": gen.index,
        "input_type": example.input_type,
        "input_range": example.input_range,
        "operator": example.operator,
        "lookback": example.lookback,
        "attempt": gen.attempt,
        "expected": ref.final,
        "expected_float": math.nan if ref.final_float is None else ref.final_float,
        "expected_log10_abs": log10_abs(expected),
        "faa": faa,
        "caa": any(s.value is not None and rounded_match(s.value, expected) for s in parsed),
        "parseable": bool(parsed),
        "n_answers": len(spans),
        "n_parseable": len(parsed),
        "first_answer_raw": None if first is None else encodable(first.raw[:MAX_SPAN_CHARS]),
        "first_answer_value": None if first is None or first.value is None else format_value(first.value),
        "answer_position": ap,
        "answer_position_basis": basis,
        "steps_generated": g,
        "step_following": step_following(g, gen.length),
        "tolerance_match": first is not None and first.value is not None and tolerance_match(first.value, expected),
        "truncated": None if gen.finish_reason is None else gen.finish_reason == "length",  # null: unknown
        "finish_reason": gen.finish_reason,
        "num_generated_tokens": gen.num_generated_tokens,
        "first_divergent_step": None if al is None else al.first_divergent_step,
        "correct_prefix": None if al is None else al.correct_prefix,
        "n_claims": None if al is None else al.n_claims,
        **{f"n_{c}": None if al is None else al.count(c) for c in ERROR_CLASSES},
        "first_error_class": None if al is None else al.first_error_class,
        "divergent_claim": None if claim is None else claim.token,
        "divergent_claim_start": None if claim is None else claim.start,
        "divergent_claim_end": None if claim is None else claim.end,
        "answer_matches_last_claim": (
            None
            if first_parsed is None or first_parsed.value is None or last_claim is None
            else values_agree(first_parsed.value, last_claim)
        ),
        "looping": ends_looping(loop, gen.finish_reason),
        "loop_period": None if loop is None else loop.period,
    }

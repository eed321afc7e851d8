"""Answer extraction and matching: ``<answer>`` spans, the number grammar and match rules of spec section 5.

The raw model output is scored (thinking included), and outputs can be long and
hostile (a model stuck repeating ``<answer>``), so spans are found with
``str.find`` loops and numbers with anchored, backtracking-free patterns: the
cost is linear in the text length.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from fractions import Fraction

OPEN, CLOSE = "<answer>", "</answer>"

# Unambiguous pieces only (each quantifier is followed by a character it cannot
# consume), so a failed match never backtracks more than linearly.
# Digits are ASCII 0-9 only (re.ASCII): Python's \d, int() and float() also take
# other scripts' digits ("٦" is 6), which the spec's grammar does not have.
_NUMBER = re.compile(
    r"[+-]?(?:(?P<grouped>\d{1,3}(?:,\d{3})+)|(?P<digits>\d+))?(?P<frac>\.\d*)?(?P<exp>[eE][+-]?\d+)?", re.ASCII
)
_SPECIAL = re.compile(r"[+-]?(?:inf|infinity|nan)", re.IGNORECASE)
# LaTeX wrappers peeled from the outside in: \boxed{..}, \text{..}, $..$, $$..$$, \(..\), \[..\].
_WRAPPERS = (("\\boxed{", "}"), ("\\text{", "}"), ("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# Python refuses longer int literals (quadratic conversion); no reference comes
# near it (the largest has ~200 digits), so longer integers are unparseable, and
# so is any span too long to hold such an integer with separators and wrappers.
MAX_INT_DIGITS = 4300
MAX_SPAN_CHARS = 6000


@dataclass(frozen=True, slots=True)
class AnswerSpan:
    """One tagged answer: where its ``<answer>`` tag starts, its raw content, its parsed value."""

    start: int
    raw: str
    value: int | float | None  # None: unparseable


def find_spans(text: str) -> list[tuple[int, str]]:
    """``(start, content)`` of every closed span, in order.

    A span is the nearest ``<answer>`` before each ``</answer>``: an opening
    tag that is never closed (or is re-opened before closing) is not a span.
    """
    spans: list[tuple[int, str]] = []
    pos = 0
    while True:
        close = text.find(CLOSE, pos)
        if close < 0:
            return spans
        start = text.rfind(OPEN, pos, close)
        if start >= 0:
            spans.append((start, text[start + len(OPEN) : close]))
        pos = close + len(CLOSE)


def _unwrap(s: str) -> str:
    changed = True
    while changed:
        changed = False
        s = s.strip()
        for left, right in _WRAPPERS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)]
                changed = True
                break
    return s


def _strip_period(s: str) -> str:
    return s[:-1].rstrip() if s.endswith(".") and len(s) > 1 else s


def parse_number(raw: str) -> int | float | None:
    """A span's content as a number (int when written as an integer), or None.

    Accepts: sign (ASCII or U+2212), ASCII digits, decimal point, exponent,
    thousands separators in groups of three, surrounding whitespace, one
    trailing period, inf/infinity/nan in any case, LaTeX wrappers.  An
    integer longer than ``MAX_INT_DIGITS``, or any content longer than
    ``MAX_SPAN_CHARS``, is unparseable.
    """
    if len(raw) > MAX_SPAN_CHARS:
        return None
    s = _strip_period(_unwrap(_strip_period(raw.replace("\u2212", "-").strip())))
    if _SPECIAL.fullmatch(s):
        return float(s)
    m = _NUMBER.fullmatch(s)
    if m is None or not (m["grouped"] or m["digits"] or (m["frac"] or "")[1:]):
        return None
    if m["frac"] is None and m["exp"] is None:
        digits = m["grouped"].replace(",", "") if m["grouped"] else m["digits"]
        if len(digits) > MAX_INT_DIGITS:
            return None
        return -int(digits) if s[0] == "-" else int(digits)
    return float(s.replace(",", ""))


def extract_answers(text: str) -> list[AnswerSpan]:
    """Every answer span of a generated text, parsed."""
    return [AnswerSpan(start, raw, parse_number(raw)) for start, raw in find_spans(text)]


# --- Matching a value against the reference (spec section 5) ---------------

REL_TOL = 1e-6
ABS_TOL = 1e-9


def _is_nan(v: int | float) -> bool:
    return type(v) is float and v != v


def rounded_match(pred: int | float, ref: int | float) -> bool:
    """The paper's rule ``round(pred, 3) == round(ref, 3)``; nan matches nan.

    ``round`` of an int is the int itself, so exact integers (190 digits) are
    compared exactly; ``inf`` matches ``inf`` of the same sign through ``==``.
    """
    if _is_nan(pred) or _is_nan(ref):
        return _is_nan(pred) and _is_nan(ref)
    return round(pred, 3) == round(ref, 3)


def tolerance_match(pred: int | float, ref: int | float) -> bool:
    """``|pred - ref| <= max(REL_TOL * max(|pred|, |ref|), ABS_TOL)``, computed exactly.

    Like ``math.isclose`` but without overflowing on integers beyond float
    range; non-finite values match only themselves (nan matches nan).
    """
    if _is_nan(pred) or _is_nan(ref):
        return _is_nan(pred) and _is_nan(ref)
    if type(pred) is int and type(ref) is int:
        return abs(pred - ref) * 1_000_000 <= max(abs(pred), abs(ref))
    if (type(pred) is float and pred in (math.inf, -math.inf)) or (type(ref) is float and ref in (math.inf, -math.inf)):
        return pred == ref
    try:
        return math.isclose(pred, ref, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    except OverflowError:
        fp, fr = Fraction(pred), Fraction(ref)
        return abs(fp - fr) <= max(Fraction(REL_TOL) * max(abs(fp), abs(fr)), Fraction(ABS_TOL))


def values_agree(pred: int | float, ref: int | float) -> bool:
    """Either rule: how a claimed intermediate value is judged in trace alignment."""
    return rounded_match(pred, ref) or tolerance_match(pred, ref)

"""Step-level trace alignment (beyond the paper): where and how a model's trace leaves the reference.

A model states intermediate values as ``S<j> = ...`` claims ("S5 = S3 * S4 =
13 * 21 = 273" or just "S5 = 273").  Comparing the first valued claim of each
variable with the reference trace tells us the first divergent step, the
longest correct prefix (ProcBench's prefix accuracy) and, for every wrong
step, why it is wrong: an arithmetic slip, a wrong operand, a skipped step, or
a correct operation applied to the model's own earlier wrong values.
Definitions: docs/scoring.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from procexec.benchmark.executor import apply, parse_value
from procexec.scoring.extract import MAX_INT_DIGITS, values_agree

Number = int | float
ERROR_CLASSES = ("arithmetic_slip", "wrong_operand", "skipped", "propagation")

# "S5 =", "S_5 =", "S_{5} =" (not "S5 =="), ASCII digits only (as the answer
# grammar, docs/scoring.md); a literal first character and
# possessive quantifiers keep the scan fast and linear on hostile input.  The
# character before a match is checked in Python (a lookbehind would disable the
# regex engine's literal-prefix search).
_CLAIM = re.compile(r"S_?+\{?+([0-9]++)\}?+[ \t]*+=(?!=)")
# A number, or a word (consumed whole so that "S3", "x2", ".5" yield no number).
_TOKEN = re.compile(
    r"([-\u2212]?+[0-9]++(?:,[0-9]{3})*+(?:\.[0-9]++)?+(?:[eE][-+]?+[0-9]++)?+|-?+(?:[iI]nf(?:inity)?+|INF|[nN]a[nN])(?!\w))"
    r"|[A-Za-z_.]\w*+"
)
_WORD = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.")
_CLAUSE_END = re.compile(r"\n|[,;.] ")
MAX_CLAUSE_CHARS = 5000  # three ~300-digit numbers fit; bounds the work on hostile text


@dataclass(frozen=True, slots=True)
class Claim:
    """The value a model states for one variable, as written and parsed.

    ``operand_text`` is the '='-segment before the value ("13 * 21" in "S5 =
    S3 * S4 = 13 * 21 = 273"), parsed only when the claim is wrong.
    ``start``/``end`` delimit the claim's ``S<j> =`` in the text (the score row
    keeps the first divergent one's, for the report to highlight).
    """

    var: int
    token: str
    value: Number
    operand_text: str | None
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Alignment:
    """Per-step verdicts: ``classes[i]`` is None for a correct step i+1, else its error class."""

    classes: tuple[str | None, ...]
    n_claims: int
    last_claim: Number | None  # value claimed for the highest variable the model reached
    divergent_claim: Claim | None  # the first divergent step's claim (None: no divergence, or a skipped step)

    @property
    def first_divergent_step(self) -> int | None:
        return next((i + 1 for i, c in enumerate(self.classes) if c is not None), None)

    @property
    def correct_prefix(self) -> int:
        first = self.first_divergent_step
        return len(self.classes) if first is None else first - 1

    @property
    def first_error_class(self) -> str | None:
        first = self.first_divergent_step
        return None if first is None else self.classes[first - 1]

    def count(self, error_class: str) -> int:
        return sum(1 for c in self.classes if c == error_class)


def _to_number(token: str) -> Number | None:
    t = token.replace("\u2212", "-").replace(",", "")
    if t.lstrip("-").isdigit():
        return int(t) if len(t) <= MAX_INT_DIGITS else None
    return float(t)


def _clause_end(text: str, start: int) -> int:
    limit = min(len(text), start + MAX_CLAUSE_CHARS)
    m = _CLAUSE_END.search(text, start, limit)
    return limit if m is None else m.start()


def _numbers(segment: str) -> list[str]:
    return [token for token in _TOKEN.findall(segment) if token]


def _claim(var: int, clause: str, start: int, end: int) -> Claim | None:
    """Value = the clause's last number; operands are read from the '='-segment before it."""
    segments = clause.split("=")
    for i in range(len(segments) - 1, -1, -1):
        numbers = _numbers(segments[i])
        if numbers:
            value = _to_number(numbers[-1])
            operands = segments[i - 1] if i else None
            return None if value is None else Claim(var, numbers[-1], value, operands, start, end)
    return None


def claim_operands(claim: Claim) -> tuple[Number, Number] | None:
    """The two operand values written before the claimed value, if exactly two are there."""
    if claim.operand_text is None:
        return None
    seg = _numbers(claim.operand_text)
    if len(seg) != 2:
        return None
    p, q = _to_number(seg[0]), _to_number(seg[1])
    return None if p is None or q is None else (p, q)


def parse_claims(text: str, max_var: int) -> dict[int, Claim]:
    """The first valued claim of each variable S3..S{max_var}, in the text's order.

    A clause runs from the ``=`` to the end of its line or a ``, `` / ``; ``
    / ``. `` separator; ``S<j> =`` inside a clause ("S3 = S2 / S1 = 8 / 5 =
    1.6") is part of it.  A claim without any number (a restated procedure
    line) is not a claim.
    """
    claims: dict[int, Claim] = {}
    clause_end = 0
    for m in _CLAIM.finditer(text):
        if m.start() < clause_end or (m.start() > 0 and text[m.start() - 1] in _WORD):
            continue
        clause_end = _clause_end(text, m.end())
        digits = m.group(1)
        var = int(digits) if len(digits) <= 4 else 0
        if var < 3 or var > max_var or var in claims:
            continue
        claim = _claim(var, text[m.end() : clause_end], m.start(), m.end())
        if claim is not None:
            claims[var] = claim
    return claims


def _apply(op: str, a: Number, b: Number) -> Number:
    return apply(op, a, b, set())


class _Trace:
    """Reference and model-side values of S1..S{n+2}, parsed only when a wrong step needs them."""

    def __init__(self, trace: list[str], claims: dict[int, Claim]):
        self.text = trace
        self.claims = claims
        self.values: list[Number | None] = [None] * len(trace)
        self.ok = [True] * len(trace)  # the model's value of S_j agrees with the reference

    def ref(self, var: int) -> Number:
        value = self.values[var - 1]
        if value is None:
            value = self.values[var - 1] = parse_value(self.text[var - 1])
        return value

    def own(self, var: int) -> Number:
        """The model's value: its claim, or the reference value when it made none."""
        claim = self.claims.get(var)
        return self.ref(var) if claim is None else claim.value


def _classify(claim: Claim, op: str, left: int, right: int, t: _Trace) -> str:
    """Why a present but wrong claim is wrong: propagation, then slip / wrong operand."""
    oa, ob = t.own(left), t.own(right)
    if not (t.ok[left - 1] and t.ok[right - 1]) and values_agree(claim.value, _apply(op, oa, ob)):
        return "propagation"
    operands = claim_operands(claim)
    if operands is not None:

        def right_operands(p: Number, q: Number) -> bool:
            return (values_agree(p, oa) or values_agree(p, t.ref(left))) and (
                values_agree(q, ob) or values_agree(q, t.ref(right))
            )

        p, q = operands
        if right_operands(p, q) or (op in "+*" and right_operands(q, p)):
            return "arithmetic_slip"
        return "wrong_operand"
    for j in range(1, claim.var):
        if j != left and values_agree(claim.value, _apply(op, t.own(j), ob)):
            return "wrong_operand"
        if j != right and values_agree(claim.value, _apply(op, oa, t.own(j))):
            return "wrong_operand"
    return "arithmetic_slip"


def align(text: str, rows: list[tuple[int, int, str, int]], trace: list[str]) -> Alignment:
    """Align a generated text with the reference.

    ``rows`` are the procedure's ``(target, left, op, right)`` steps
    (``procexec.benchmark.procedure.parse_rows``); ``trace`` the reference values of
    S1..S{n+2} as exact text (``Reference.trace``).
    """
    claims = parse_claims(text, len(rows) + 2)
    t = _Trace(trace, claims)
    classes: list[str | None] = []
    for target, left, op, right in rows:
        claim = claims.get(target)
        if claim is None:
            classes.append("skipped")
        elif claim.token == trace[target - 1] or values_agree(claim.value, t.ref(target)):
            classes.append(None)
        else:
            t.ok[target - 1] = False
            classes.append(_classify(claim, op, left, right, t))
    last = claims[max(claims)].value if claims else None
    first = next((target for (target, *_), c in zip(rows, classes) if c is not None), None)
    return Alignment(tuple(classes), len(claims), last, None if first is None else claims.get(first))

"""Reference execution of a procedure (spec section 2), without eval.

Default semantics: exact Python ints under + - *, true division to float,
IEEE-754 doubles for floats (x/0 -> +-inf, 0/0 -> nan, overflow -> inf), and
an exact integer that meets a float beyond float range becomes an infinity
with the sign of the exact result.  The paper's Appendix A executor (Python
``eval`` per line, a step that raises is silently skipped, the final value is
whatever was computed last) is reproduced as the ``appendix-a`` mode, and
every reference says whether the two modes disagree.
"""

from __future__ import annotations

import contextlib
import math
import sys
from collections.abc import Iterator
from fractions import Fraction

from procexec.benchmark.procedure import parse_rows
from procexec.errors import ProcexecError
from procexec.records import EDGE_CASES, SEMANTICS, Example, Reference  # the sets are defined with the records

_INF = math.inf
_PYTHON_RAISED = "python_raised"  # internal marker: some step would raise under eval


def format_value(value: int | float) -> str:
    """Exact text of a value: all digits of an int, ``repr`` of a float (inf, -inf, nan)."""
    if type(value) is not int:
        return repr(value)
    with _unlimited_int_digits():
        return str(value)


def format_trace(values: list[int | float]) -> list[str]:
    try:
        return [str(v) if type(v) is int else repr(v) for v in values]  # format_value, inlined: hot
    except ValueError:  # an int past Python's 4,300-digit conversion limit (very long procedures)
        return [format_value(v) for v in values]


def parse_value(text: str) -> int | float:
    """Inverse of ``format_value``."""
    try:
        with _unlimited_int_digits():
            return int(text)
    except ValueError:
        return float(text)


@contextlib.contextmanager
def _unlimited_int_digits() -> Iterator[None]:
    """Exact values are the point here: lift Python's int<->str digit limit, then restore it."""
    limit = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(0)
    try:
        yield
    finally:
        sys.set_int_max_str_digits(limit)


def to_float(value: int | float) -> float:
    """Float64 approximation; an int beyond float range becomes a signed infinity."""
    try:
        return float(value)
    except OverflowError:
        return _INF if value > 0 else -_INF


def _sign(value: int | float) -> float:
    return math.copysign(1.0, value) if type(value) is float else (1.0 if value >= 0 else -1.0)


def _divide_by_zero(a: int | float, b: int | float, flags: set[str]) -> float:
    flags.add("division_by_zero")
    if a == 0 or a != a:
        return math.nan
    return _sign(a) * _sign(b) * _INF


def _mixed_exact(op: str, a: int | float, b: int | float) -> float:
    """An int too large for a float meets a float: exact result, then rounded (inf if too big)."""
    big_is_left = type(a) is int
    big, other = (a, b) if big_is_left else (b, a)
    if other != other:
        return math.nan
    if math.isinf(other):  # a huge finite int is negligible next to infinity
        if op == "+":
            return other
        if op == "-":
            return -other if big_is_left else other
        if op == "*":
            return _sign(big) * other
        return 0.0 * _sign(big) * _sign(other) if big_is_left else _sign(big) * other
    fa, fb = (Fraction(a), Fraction(b))
    exact = {"+": fa + fb, "-": fa - fb, "*": fa * fb, "/": fa / fb}[op]
    try:
        return float(exact)
    except OverflowError:
        return _INF if exact > 0 else -_INF


def apply(op: str, a: int | float, b: int | float, flags: set[str]) -> int | float:
    """One step under the default semantics, flagging the edge cases it meets.

    The slow path: ``_run_rows`` uses Python's operators and calls this only
    where they raise.
    """
    if type(a) is int and type(b) is int:
        if op == "+":
            return a + b
        if op == "-":
            return a - b
        if op == "*":
            return a * b
        if b == 0:
            return _divide_by_zero(a, b, flags)
        try:
            return a / b
        except OverflowError:
            flags.add("overflow")
            return _INF if (a > 0) == (b > 0) else -_INF
    try:
        fa = float(a)
        fb = float(b)
    except OverflowError:
        flags.add("overflow")
        return _mixed_exact(op, a, b)
    if op == "+":
        result = fa + fb
    elif op == "-":
        result = fa - fb
    elif op == "*":
        result = fa * fb
    elif fb == 0.0:
        return _divide_by_zero(fa, fb, flags)
    else:
        result = fa / fb
    if result in (_INF, -_INF) and not (math.isinf(fa) or math.isinf(fb)):
        flags.add("overflow")
    return result


def edge_cases(values: list[int | float], flags: set[str]) -> list[str]:
    """Edge cases in spec order: those flagged by the steps plus nan/inf among the values."""
    found = set(flags)
    for v in values:
        if type(v) is float and v - v != 0.0:
            found.add("nan" if v != v else "inf")
    return [e for e in EDGE_CASES if e in found]


def run(procedure: str, x: int | float, y: int | float) -> tuple[list[int | float], set[str]]:
    """Default semantics: every value S1..S{n+2} and the flags the steps raised."""
    return _run_rows(parse_rows(procedure), x, y)


def _run_rows(
    rows: list[tuple[int, int, str, int]], x: int | float, y: int | float
) -> tuple[list[int | float], set[str]]:
    values: list[int | float] = [x, y]
    flags: set[str] = set()
    append = values.append
    for _target, left, op, right in rows:
        a = values[left - 1]
        b = values[right - 1]
        # Fast path: Python's own operators already give the default semantics
        # except where they raise or leave finite ground; ``apply`` handles those.
        try:
            if op == "+":
                v = a + b
            elif op == "-":
                v = a - b
            elif op == "*":
                v = a * b
            else:
                v = a / b
        except (ZeroDivisionError, OverflowError):
            flags.add(_PYTHON_RAISED)
            v = apply(op, a, b, flags)
        else:
            # Finite operands giving inf without raising: the float overflowed.
            if type(v) is float and v - v != 0.0 and a - a == 0 and b - b == 0:
                flags.add("overflow")
        append(v)
    return values, flags


def run_appendix_a(procedure: str, x: int | float, y: int | float) -> tuple[list[int | float], set[str]]:
    """The paper's executor: a step that raises (or uses a skipped variable) is skipped."""
    return _run_rows_appendix_a(parse_rows(procedure), x, y)


def _run_rows_appendix_a(
    rows: list[tuple[int, int, str, int]], x: int | float, y: int | float
) -> tuple[list[int | float], set[str]]:
    known: dict[int, int | float] = {1: x, 2: y}
    flags: set[str] = set()
    get = known.get
    for target, left, op, right in rows:
        a = get(left)
        b = get(right)
        if a is None or b is None:  # the paper's KeyError: an operand was skipped
            continue
        try:
            if op == "+":
                v = a + b
            elif op == "-":
                v = a - b
            elif op == "*":
                v = a * b
            else:
                v = a / b
        except ZeroDivisionError:
            flags.add("division_by_zero")
            continue
        except OverflowError:
            flags.add("overflow")
            continue
        if type(v) is float and v - v != 0.0 and a - a == 0 and b - b == 0:
            flags.add("overflow")
        known[target] = v
    return list(known.values()), flags


def _same(a: int | float, b: int | float) -> bool:
    if type(a) is float and a != a:
        return type(b) is float and b != b
    return type(a) is type(b) and a == b


def execute(example: Example, semantics: str = "default") -> Reference:
    """Reference for one example under the chosen semantics, with the other mode's verdict."""
    if semantics not in SEMANTICS:
        raise ProcexecError(f"unknown semantics {semantics!r}; choose one of {', '.join(SEMANTICS)}")
    try:
        rows = parse_rows(example.procedure)
        values, flags = _run_rows(rows, example.x, example.y)
        # Appendix A only departs from the default where Python's operators raise.
        if _PYTHON_RAISED in flags:
            appendix_values, appendix_flags = _run_rows_appendix_a(rows, example.x, example.y)
        else:
            appendix_values, appendix_flags = values, flags
    except ProcexecError as exc:
        raise ProcexecError(f"example {example.id}: {exc}") from None
    default_final, appendix_final = values[-1], appendix_values[-1]
    if semantics == "appendix-a":
        values, flags = appendix_values, appendix_flags
    final = values[-1]
    final_float = to_float(final)
    return Reference(
        id=example.id,
        dataset=example.dataset,
        length=example.length,
        index=example.index,
        semantics=semantics,
        final=format_value(final),
        final_float=final_float if math.isfinite(final_float) else None,
        final_type="int" if type(final) is int else "float",
        trace=format_trace(values),
        edge_cases=edge_cases(values, flags),
        appendix_a_final=format_value(appendix_final),
        appendix_a_disagrees=not _same(default_final, appendix_final),
    )

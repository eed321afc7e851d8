"""The procedure grammar (spec section 1): render a procedure and parse it back strictly.

The text form is the benchmark's interface with models, so parsing accepts
exactly what ``render`` produces and refuses anything else with the line number
and text -- there is no ``eval`` anywhere.
"""

from __future__ import annotations

import functools
import operator
import re
from dataclasses import dataclass

from procexec.errors import ProcexecError
from procexec.records import OPERATOR_SYMBOLS

HEADER = "function(x, y):"
LET_LINES = ("Let S1 = x", "Let S2 = y")

_OP = f"[{re.escape(''.join(OPERATOR_SYMBOLS.values()))}]"
_STEP = re.compile(rf"Step ([1-9][0-9]*): S([1-9][0-9]*) = S([1-9][0-9]*) ({_OP}) S([1-9][0-9]*)")
_STEPS = re.compile(rf"^(Step [1-9][0-9]*: S[1-9][0-9]*) = S([1-9][0-9]*) ({_OP}) S([1-9][0-9]*)\n", re.MULTILINE)
_FINAL = re.compile(r"Final Step: Return S([1-9][0-9]*)")


@dataclass(frozen=True, slots=True)
class Step:
    """``S{target} = S{left} {op} S{right}``; step number i defines target i + 2."""

    target: int
    left: int
    op: str
    right: int

    @property
    def number(self) -> int:
        return self.target - 2


def render(steps: list[Step] | tuple[Step, ...]) -> str:
    """The exact text form: newline-separated, no trailing spaces, no final newline."""
    lines = [HEADER, *LET_LINES]
    lines += [f"Step {s.number}: S{s.target} = S{s.left} {s.op} S{s.right}" for s in steps]
    lines.append(f"Final Step: Return S{len(steps) + 2}")
    return "\n".join(lines)


def _refuse(number: int, text: str, problem: str) -> ProcexecError:
    return ProcexecError(f"procedure line {number}: {problem}: {text!r}")


def parse(text: str) -> tuple[Step, ...]:
    """Parse procedure text into steps, refusing any line that is not in the grammar."""
    return tuple(Step(*row) for row in parse_rows(text))


def parse_rows(text: str) -> list[tuple[int, int, str, int]]:
    """``(target, left, op, right)`` per step: the executor's fast path.

    All step lines are matched by one ``findall`` and their "Step i: Sj"
    heads compared in one list comparison; only when something is off does the
    line-by-line pass run, to name the bad line.
    """
    if text.startswith(_PREAMBLE):
        body_end = text.rfind("\n")
        found = _STEPS.findall(text, len(_PREAMBLE), body_end + 1)
        n = len(found)
        if n and n == text.count("\n", len(_PREAMBLE), body_end + 1) and tuple(map(_head, found)) == _heads(n):
            rows = [(t, int(a), op, int(b)) for t, (_, a, op, b) in enumerate(found, start=3)]
            if all(a < t and b < t for t, a, _, b in rows) and text[body_end + 1 :] == f"Final Step: Return S{n + 2}":
                return rows
    return _parse_lines_slowly(text.split("\n"))


_PREAMBLE = "\n".join((HEADER, *LET_LINES)) + "\n"
_head = operator.itemgetter(0)


@functools.cache
def _heads(n: int) -> tuple[str, ...]:
    return tuple(f"Step {i}: S{i + 2}" for i in range(1, n + 1))


def _parse_lines_slowly(lines: list[str]) -> list[tuple[int, int, str, int]]:
    """Check line by line and raise at the first line outside the grammar."""
    if len(lines) < 4:
        raise ProcexecError(
            f"procedure has {len(lines)} lines; expected a header, two Let lines, steps and a Final Step"
        )
    for number, expected in enumerate((HEADER, *LET_LINES), start=1):
        if lines[number - 1] != expected:
            raise _refuse(number, lines[number - 1], f"expected {expected!r}")
    rows: list[tuple[int, int, str, int]] = []
    for number, line in enumerate(lines[3:-1], start=4):
        m = _STEP.fullmatch(line)
        if m is None and _FINAL.fullmatch(line):
            raise _refuse(number + 1, lines[number], "unexpected line after the Final Step")
        if m is None:
            raise _refuse(number, line, "not a step of the form 'Step i: Sj = Sa o Sb'")
        step_no, target, left, op, right = m.groups()
        step_no, target, left, right = int(step_no), int(target), int(left), int(right)
        if step_no != len(rows) + 1:
            raise _refuse(number, line, f"expected step number {len(rows) + 1}")
        if target != step_no + 2:
            raise _refuse(number, line, f"step {step_no} must define S{step_no + 2}")
        if left >= target or right >= target:
            raise _refuse(number, line, "an operand is not defined before this step")
        rows.append((target, left, op, right))
    if not rows:
        raise ProcexecError("procedure has no steps")
    final_line = lines[-1]
    m = _FINAL.fullmatch(final_line)
    if m is None:
        raise _refuse(len(lines), final_line, "expected 'Final Step: Return Sj'")
    if int(m.group(1)) != len(rows) + 2:
        raise _refuse(len(lines), final_line, f"must return the last variable S{len(rows) + 2}")
    return rows

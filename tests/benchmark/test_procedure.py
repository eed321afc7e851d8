"""The procedure grammar: render/parse round trip and strict refusal of bad lines."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procexec.benchmark.procedure import Step, parse, render
from procexec.errors import ProcexecError

FIGURE1 = (
    "function(x, y):\nLet S1 = x\nLet S2 = y\n"
    "Step 1: S3 = S1 + S2\nStep 2: S4 = S3 - S2\nStep 3: S5 = S4 / S2\n"
    "Step 4: S6 = S5 * S3\nStep 5: S7 = S6 - S4\nFinal Step: Return S7"
)


@st.composite
def procedures(draw):
    n = draw(st.integers(1, 40))
    return [
        Step(t, draw(st.integers(1, t - 1)), draw(st.sampled_from("+-*/")), draw(st.integers(1, t - 1)))
        for t in range(3, n + 3)
    ]


def test_parses_the_papers_figure_1():
    steps = parse(FIGURE1)
    assert steps[2] == Step(5, 4, "/", 2)
    assert render(steps) == FIGURE1


@given(procedures())
def test_render_parse_round_trip(steps):
    assert list(parse(render(steps))) == steps


@pytest.mark.parametrize(
    "line_no, bad_line, message",
    [
        (2, "Let S1 = 5", "expected 'Let S1 = x'"),
        (5, "Step 2: S4 = S3 ** S2", "not a step"),
        (5, "Step 2: S4 = S3 + S2 ", "not a step"),  # trailing space
        (5, "Step 3: S5 = S3 + S2", "expected step number 2"),
        (5, "Step 2: S5 = S3 + S2", "must define S4"),
        (5, "Step 2: S4 = S9 + S2", "not defined before"),
        (5, "Step 2: S4 = __import__('os').system('x')", "not a step"),
        (9, "Final Step: Return S6", "must return the last variable S7"),
        (9, "Return S7", "expected 'Final Step"),
    ],
)
def test_malformed_line_is_refused_with_line_number_and_text(line_no, bad_line, message):
    lines = FIGURE1.split("\n")
    lines[line_no - 1] = bad_line
    with pytest.raises(ProcexecError) as info:
        parse("\n".join(lines))
    assert f"line {line_no}" in str(info.value)
    assert repr(bad_line) in str(info.value)
    assert message in str(info.value)


def test_procedure_without_steps_is_refused():
    with pytest.raises(ProcexecError, match="no steps"):
        parse("function(x, y):\nLet S1 = x\nLet S2 = y\nFinal Step: Return S2")


def test_trailing_newline_is_refused():
    with pytest.raises(ProcexecError, match="line 10"):
        parse(FIGURE1 + "\n")

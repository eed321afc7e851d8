"""Reference execution: exact ints, IEEE floats, edge cases, the Appendix A mode."""

import math
import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procexec.benchmark.executor import execute, format_value, parse_value, run, run_appendix_a
from procexec.benchmark.procedure import Step, render
from procexec.benchmark.suite import DatasetSpec, generate_dataset
from procexec.errors import ProcexecError
from procexec.records import Example


def example(steps, x, y, dataset="mixed_int_1-10_k1"):
    text = render([Step(t, a, op, b) for t, (a, op, b) in enumerate(steps, start=3)])
    return Example(
        id=f"{dataset}:{len(steps)}:0",
        dataset=dataset,
        length=len(steps),
        index=0,
        x=x,
        y=y,
        procedure=text,
        input_type="int",
        input_range="1-10",
        operator="mixed",
        lookback=1,
        seed=0,
        spec_version="1.0",
    )


def test_95_step_integer_multiply_is_exact():
    # S_t = S_{t-1} * S1 with x = 99: 99**96 has 192 digits, far beyond float64's 15-17.
    ref = execute(example([(2, "*", 1)] + [(t - 1, "*", 1) for t in range(4, 98)], 99, 99))
    assert ref.final == str(99**96)
    assert len(ref.final) == 192
    assert ref.final_type == "int"
    assert ref.trace[-1] == ref.final and len(ref.trace) == 97
    assert ref.final_float == float(99**96)
    assert ref.edge_cases == []


def test_suite_multiply_reaches_about_190_digits_exactly():
    examples = generate_dataset(DatasetSpec.from_id("mul_int_10-100_k1"), (95,), 100, 20260101)
    longest = max((execute(e) for e in examples), key=lambda r: len(r.final))
    assert 180 <= len(longest.final) <= 192
    values = [parse_value(v) for v in longest.trace]
    assert all(type(v) is int for v in values)
    assert values[-1] % values[0] == 0 or values[-1] % values[1] == 0  # built from the inputs only


@pytest.mark.parametrize(
    "steps, x, y, final, cases",
    [
        ([(1, "/", 2)], 5, 0, "inf", ["division_by_zero", "inf"]),
        ([(1, "/", 2)], -5, 0, "-inf", ["division_by_zero", "inf"]),
        ([(1, "/", 2)], 0, 0, "nan", ["division_by_zero", "nan"]),
        ([(1, "/", 2)], 2.5, -0.0, "-inf", ["division_by_zero", "inf"]),
        ([(1, "/", 2), (3, "-", 3)], 1, 0, "nan", ["division_by_zero", "nan", "inf"]),  # inf - inf
        ([(1, "*", 1), (3, "*", 3)], 1e200, 1.0, "inf", ["overflow", "inf"]),
        ([(1, "/", 2)], 10**400, 3, "inf", ["overflow", "inf"]),  # int quotient beyond float range
        ([(1, "/", 2)], -(10**400), 3, "-inf", ["overflow", "inf"]),
        ([(1, "+", 2)], 10**400, 2.5, "inf", ["overflow", "inf"]),  # exact int meets a float
        ([(2, "/", 1)], 10**400, 2.5, "0.0", ["overflow"]),
        ([(1, "-", 2)], 10**400, math.inf, "-inf", ["overflow", "inf"]),
        ([(1, "/", 2)], 7, 2, "3.5", []),
        ([(1, "-", 2)], 3, 10, "-7", []),
    ],
)
def test_ieee_and_exact_int_edge_cases(steps, x, y, final, cases):
    ref = execute(example(steps, x, y))
    assert ref.final == final
    assert sorted(ref.edge_cases) == sorted(cases)
    if final in ("inf", "-inf", "nan"):
        assert ref.final_float is None


def test_int_true_division_is_correctly_rounded():
    ref = execute(example([(1, "/", 2)], 10**30 + 1, 3))
    assert ref.final == repr((10**30 + 1) / 3)


def test_appendix_a_disagreement_is_flagged():
    # S3 = S1 / S2 with y = 0 raises in the paper's executor: S3 vanishes, S4 = S3 + S1
    # raises too (KeyError), and its "final output" is S2 = 0.
    ex = example([(1, "/", 2), (3, "+", 1)], 4, 0)
    default = execute(ex)
    compat = execute(ex, "appendix-a")
    assert default.final == "inf"
    assert default.appendix_a_final == compat.final == "0"
    assert default.appendix_a_disagrees and compat.appendix_a_disagrees
    assert compat.semantics == "appendix-a"
    assert compat.trace == ["4", "0"]


def test_appendix_a_agrees_when_nothing_raises():
    ref = execute(example([(1, "*", 2), (3, "-", 1)], 6, 7))
    assert not ref.appendix_a_disagrees and ref.final == ref.appendix_a_final == "36"


def test_malformed_procedure_names_the_example_and_line():
    ex = example([(1, "+", 2)], 1, 2)
    bad = Example(**{**ex.to_json(), "procedure": ex.procedure.replace("S1 + S2", "S1 ^ S2")})
    with pytest.raises(ProcexecError, match=r"example mixed_int_1-10_k1:1:0: procedure line 4"):
        execute(bad)


def test_unknown_semantics_refused():
    with pytest.raises(ProcexecError, match="unknown semantics"):
        execute(example([(1, "+", 2)], 1, 2), "python")


_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


def python_oracle(steps, x, y):
    """What the paper's Appendix A code computes, via Python's operators (no eval)."""
    known = {1: x, 2: y}
    for t, (a, op, b) in enumerate(steps, start=3):
        try:
            known[t] = _OPS[op](known[a], known[b])
        except (KeyError, ZeroDivisionError, OverflowError):
            pass
    return list(known.values())


@st.composite
def programs(draw):
    n = draw(st.integers(1, 25))
    steps = [
        (draw(st.integers(1, t - 1)), draw(st.sampled_from("+-*/")), draw(st.integers(1, t - 1)))
        for t in range(3, n + 3)
    ]
    number = st.one_of(
        st.integers(-5, 5),
        st.sampled_from([0.0, -0.0, 0.5, 1e300, -1e300, 2.0**-1074]),
        st.floats(allow_nan=True, allow_infinity=True),
    )
    return steps, draw(number), draw(number)


def _same(a, b):
    return (isinstance(a, float) and math.isnan(a) and isinstance(b, float) and math.isnan(b)) or (
        type(a) is type(b) and a == b
    )


@settings(max_examples=300, deadline=None)
@given(programs())
def test_appendix_a_mode_matches_pythons_operators(program):
    steps, x, y = program
    text = render([Step(t, a, op, b) for t, (a, op, b) in enumerate(steps, start=3)])
    ours, _ = run_appendix_a(text, x, y)
    expected = python_oracle(steps, x, y)
    assert len(ours) == len(expected) and all(map(_same, ours, expected))


@settings(max_examples=300, deadline=None)
@given(programs())
def test_default_mode_agrees_with_python_wherever_python_does_not_raise(program):
    steps, x, y = program
    text = render([Step(t, a, op, b) for t, (a, op, b) in enumerate(steps, start=3)])
    values, _ = run(text, x, y)
    assert len(values) == len(steps) + 2
    oracle = python_oracle(steps, x, y)
    if len(oracle) == len(values):  # nothing raised: the two semantics coincide
        assert all(map(_same, values, oracle))
    for v in values:
        assert parse_value(format_value(v)) == v or (v != v)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("+-*"), st.integers(1, 2)), min_size=1, max_size=40),
    st.integers(-100, 100),
    st.integers(-100, 100),
)
def test_integer_programs_stay_exact(ops, x, y):
    steps = [(t - 1, op, other if other != t - 1 else 1) for t, (op, other) in enumerate(ops, start=3)]
    text = render([Step(t, a, op, b) for t, (a, op, b) in enumerate(steps, start=3)])
    values, _ = run(text, x, y)
    exact = [x, y]
    for a, op, b in steps:
        exact.append(_OPS[op](exact[a - 1], exact[b - 1]))
    assert values == exact and all(type(v) is int for v in values)


def test_integers_beyond_float_range_and_past_pythons_digit_limit():
    # S_t = S_{t-1} * S_{t-1}: 10**(2**12) has 4,097 digits, 10**(2**13) 8,193 -- past Python's
    # 4,300-digit str() limit, which must not break exact text or the float approximation.
    steps = [(1, "*", 1)] + [(t - 1, "*", t - 1) for t in range(4, 16)]
    ref = execute(example(steps, 10, 1))
    assert ref.final == "1" + "0" * 2**13
    assert ref.final_float is None and ref.final_type == "int"
    assert parse_value(ref.final) == 10 ** (2**13)
    assert ref.edge_cases == []

"""Answer spans, the number grammar and the match rules (spec section 5)."""

import math
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procexec.scoring.extract import (
    MAX_INT_DIGITS,
    extract_answers,
    find_spans,
    parse_number,
    rounded_match,
    tolerance_match,
)

BIG = int("7" * 190)  # a 190-digit integer, like the longest mul_int products


def test_every_span_in_order_thinking_included():
    text = "<think>maybe <answer>3</answer></think> no: <answer>4</answer> and <answer>x</answer>"
    assert [raw for _, raw in find_spans(text)] == ["3", "4", "x"]
    assert [s.value for s in extract_answers(text)] == [3, 4, None]
    assert find_spans(text)[0][0] == text.index("<answer>3")


def test_unclosed_tag_is_not_a_span():
    assert find_spans("<answer>42") == []
    assert find_spans("<answer>1 <answer>2</answer>") == [(10, "2")]  # the reopened tag wins
    assert find_spans("</answer>5</answer><answer>") == []
    assert find_spans("") == []


@pytest.mark.parametrize(
    "raw, value",
    [
        ("42", 42),
        (" -7 ", -7),
        ("+3", 3),
        ("3.25", 3.25),
        ("1,234.5", 1234.5),
        ("1,234,567", 1234567),
        ("1.2E+05", 120000.0),
        ("1.2e5", 120000.0),
        ("2.5e-3", 0.0025),
        (".5", 0.5),
        ("13.", 13),
        ("\u22125", -5),
        ("\\boxed{42}", 42),
        ("$\\boxed{-1,000}$.", -1000),
        ("$3.5$", 3.5),
        ("\\(7\\)", 7),
        ("inf", math.inf),
        ("-Infinity", -math.inf),
        ("INF", math.inf),
        (str(BIG), BIG),
    ],
)
def test_number_grammar(raw, value):
    parsed = parse_number(raw)
    assert parsed == value and type(parsed) is type(value)


@pytest.mark.parametrize("raw", ["nan", "NaN", " -nan "])
def test_nan_parses(raw):
    assert math.isnan(parse_number(raw))


@pytest.mark.parametrize(
    "raw",
    [
        "",
        " ",
        ".",
        "+",
        "abc",
        "1,23",
        "12 345",
        "0x10",
        "5/2",
        "3 + 4",
        "S7",
        "1.2.3",
        "e5",
        "1" * (MAX_INT_DIGITS + 1),
    ],
)
def test_unparseable_kept_raw(raw):
    assert parse_number(raw) is None
    spans = extract_answers(f"<answer>{raw}</answer>")
    assert spans[0].raw == raw and spans[0].value is None


def test_rounded_match_python_semantics():
    assert rounded_match(BIG, BIG) and not rounded_match(BIG + 1, BIG)  # exact, no float detour
    assert rounded_match(1, 1.0) and rounded_match(3.1416, 3.14159)
    assert not rounded_match(3.14, 3.14159)
    assert rounded_match(math.nan, math.nan) and not rounded_match(math.nan, 1.0) and not rounded_match(0.0, math.nan)
    assert rounded_match(-math.inf, -math.inf) and not rounded_match(math.inf, -math.inf)
    assert not rounded_match(float(BIG), BIG)


def test_tolerance_match():
    assert tolerance_match(BIG + 1, BIG) and not tolerance_match(BIG + BIG // 10**5, BIG)
    assert tolerance_match(1.0000001, 1.0) and not tolerance_match(1.001, 1.0)
    assert tolerance_match(1e-10, 0.0)
    assert tolerance_match(10**400, 10**400 + 1) and not tolerance_match(1.0, 10**400)  # no OverflowError
    assert tolerance_match(math.nan, math.nan) and not tolerance_match(math.inf, 1e308)


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_arbitrary_text_never_raises(text):
    for span in extract_answers(text):
        assert span.value is None or isinstance(span.value, (int, float))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["<answer>", "</answer>", "1", ",", ".", "e", "-", " ", "$", "\\boxed{", "}", "x"])))
def test_tag_soup_never_raises(pieces):
    extract_answers("".join(pieces))


@given(st.one_of(st.integers(), st.floats(allow_nan=False)))
def test_python_numbers_round_trip(value):
    assert parse_number(repr(value)) == value


def test_hostile_megabyte_is_linear():
    text = "<answer>" * 100_000 + "9" * 200_000 + "</answer>" + "<answer>" + "1," * 100_000 + "</answer>"
    started = time.process_time()
    spans = extract_answers(text)
    assert time.process_time() - started < 1.0  # CPU time: other jobs on the machine do not count
    assert len(spans) == 2 and spans[0].value is None and spans[1].value is None


# --- digits are ASCII only (docs/scoring.md) ---------------------------------

NON_ASCII_DIGITS = st.characters(categories=["Nd"]).filter(lambda c: not c.isascii())


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.integers(), st.floats(allow_nan=False, allow_infinity=False)), st.data())
def test_a_non_ascii_digit_makes_a_number_unparseable(value, data):
    """Replacing any ASCII digit of a parseable number by another script's digit (Python's int() would
    take "٦" as 6) gives an unparseable span; the ASCII text itself still parses."""
    text = repr(value)
    positions = [i for i, c in enumerate(text) if c.isdigit()]
    i = data.draw(st.sampled_from(positions))
    digit = data.draw(NON_ASCII_DIGITS)
    assert parse_number(text) == value
    assert parse_number(text[:i] + digit + text[i + 1 :]) is None
    assert extract_answers(f"<answer>{text[:i] + digit + text[i + 1 :]}</answer>")[0].value is None


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.one_of(NON_ASCII_DIGITS, st.sampled_from(",.-+e "))))
def test_text_with_a_non_ascii_digit_is_never_a_number(text):
    if any(c.isdigit() and not c.isascii() for c in text):
        assert parse_number(text) is None


def test_non_ascii_digits_in_claims_and_step_markers_are_not_read():
    from procexec.scoring.alignment import parse_claims
    from procexec.scoring.score import steps_generated

    assert parse_claims("S3 = \u0665\nS\u0664 = 7\nS4 = 8", 4).keys() == {4}
    assert parse_claims("S3 = \u0665\nS\u0664 = 7\nS4 = 8", 4)[4].value == 8
    assert steps_generated("Step 1: a\nStep \u0662: b\nStep \uff13: c") == 1

"""procexec.io.formats: the one set of number formatters (missing numbers, fixed, scientific, intervals, counts)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from procexec.io.formats import (
    MISSING,
    format_clock,
    format_count,
    format_fixed,
    format_interval,
    format_number,
    format_sci,
    is_missing,
)


@pytest.mark.parametrize("value", [None, math.nan, np.nan, np.float32("nan"), pd.NA])
def test_every_kind_of_missing_number_is_the_dash(value: object) -> None:
    assert is_missing(value)
    assert format_fixed(value, 1) == format_sci(value) == format_number(value, 2) == MISSING


@pytest.mark.parametrize("value", [0, 0.0, -1.5, math.inf, "text"])
def test_present_values_are_not_missing(value: object) -> None:
    assert not is_missing(value)


def test_fixed_decimals_never_write_minus_zero() -> None:
    assert format_fixed(-0.04, 1) == "0.0" and format_fixed(-0.05001, 1) == "-0.1"
    assert format_fixed(42.346, 2) == "42.35" and format_fixed(7, 1) == "7.0"
    assert format_fixed(math.inf, 1) == "inf" and format_fixed(-math.inf, 2) == "-inf"


def test_scientific_is_three_significant_digits_like_table_4() -> None:
    assert format_sci(345.0) == "3.45e+02" and format_sci(-2.89e-1) == "-2.89e-01"
    assert (format_sci(math.inf), format_sci(-math.inf)) == ("inf", "-inf")


def test_a_number_as_the_paper_prints_it() -> None:
    assert format_number(0.4567, 1) == "0.5" and format_number(0.4567, 2.0) == "0.46"  # CSV decimals read as floats
    assert format_number(6.25e31) == format_number(6.25e31, math.nan) == "6.25e+31"


def test_interval_and_its_missing_bounds() -> None:
    assert format_interval(42.04, 40.0, 44.96, 1) == "42.0 [40.0, 45.0]"
    assert format_interval(42.04, math.nan, math.nan, 1) == "42.0"
    assert format_interval(1e5, 1e4, 1e6) == "1.00e+05 [1.00e+04, 1.00e+06]"


def test_counts_and_clock() -> None:
    assert format_count(1234) == "1,234" and format_count(9_999_999) == "9,999,999"
    assert format_count(12_345_678) == "12.3M"
    assert format_clock(0) == "0:00:00" and format_clock(4152.4) == "1:09:12" and format_clock(90_000) == "25:00:00"

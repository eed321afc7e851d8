"""Numbers as people read them: the one set of formatters for logs, tables, the report and the CLI.

Plain text only (LaTeX markup is ``procexec.analysis.latex``'s); a missing
number (None, NaN, pandas' NA) is always ``MISSING``, an infinity ``inf`` or
``-inf``.  The exact value texts of the benchmark (``executor.format_value``)
are a data format, not a display, and stay beside the executor.
"""

from __future__ import annotations

from typing import Any

MISSING = "–"  # en dash; LaTeX writes it "--"


def is_missing(value: Any) -> bool:
    """None or NaN (Python's, numpy's or pandas' NA): what an empty table cell reads back as."""
    try:
        return value is None or bool(value != value)
    except TypeError:  # pandas.NA refuses bool()
        return True


def format_fixed(value: Any, decimals: int) -> str:
    """Fixed decimals, without a "-0.0" for a value that rounds to zero."""
    if is_missing(value):
        return MISSING
    text = f"{value:.{decimals}f}"
    return text.removeprefix("-") if float(text) == 0 else text


def format_sci(value: Any) -> str:
    """Three significant digits in exponent form, like the paper's Table 4 (3.45e+02)."""
    return MISSING if is_missing(value) else f"{value:.2e}"


def format_number(value: Any, decimals: Any = None) -> str:
    """Fixed ``decimals`` when given, else ``format_sci`` (how the paper prints each of its numbers)."""
    return format_sci(value) if is_missing(decimals) else format_fixed(value, int(decimals))


def format_interval(value: Any, low: Any, high: Any, decimals: Any = None) -> str:
    """A value with its confidence interval: ``42.0 [40.1, 43.9]``."""
    text = format_number(value, decimals)
    return text if is_missing(low) else f"{text} [{format_number(low, decimals)}, {format_number(high, decimals)}]"


def format_count(n: float) -> str:
    """1,234 below ten million, 12.3M above (token counts in progress lines and ``procexec status``)."""
    return f"{n / 1e6:.1f}M" if n >= 1e7 else f"{n:,.0f}"


def format_clock(seconds: float) -> str:
    """H:MM:SS (elapsed time and ETAs in progress lines)."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"

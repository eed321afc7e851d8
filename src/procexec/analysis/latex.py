"""Booktabs LaTeX for the study's tables, written by one small helper (no LaTeX engine or extra dependency)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pandas as pd


def latex_escape(text: str) -> str:
    """Plain text (model names, formatted numbers with their ± and en-dash) as LaTeX source."""
    specials = {
        "&": r"\&",
        "%": r"\%",
        "$": r"\$",
        "#": r"\#",
        "_": r"\_",
        "{": r"\{",
        "}": r"\}",
        "~": r"\textasciitilde{}",
        "^": r"\textasciicircum{}",
        "\\": r"\textbackslash{}",
        "±": r"$\pm$",
        "–": "--",
    }
    return "".join(specials.get(ch, ch) for ch in str(text))


def latex_sci(value: float) -> str:
    """``$3.45\\times 10^{2}$`` like the paper's Table 4; 0, inf and nan spelled out."""
    if math.isnan(value):
        return "--"
    if math.isinf(value):
        return r"$\infty$" if value > 0 else r"$-\infty$"
    if value == 0:
        return "$0$"
    exponent = math.floor(math.log10(abs(value)))
    mantissa = value / 10.0**exponent
    if round(abs(mantissa), 2) >= 10:  # 9.996e2 rounds to 10.00: carry into the exponent
        mantissa, exponent = mantissa / 10, exponent + 1
    return rf"${mantissa:.2f}\times 10^{{{exponent}}}$"


@dataclass(frozen=True)
class LatexColumn:
    header: str
    key: str
    fmt: Callable[[Any], str] = latex_escape
    align: str = "l"


def to_latex(
    frame: pd.DataFrame,
    columns: list[LatexColumn],
    caption: str,
    label: str,
    group_by: str | None = None,
    group_titles: dict[str, str] | None = None,
) -> str:
    """A booktabs table; ``group_by`` inserts a spanning title row where that column changes."""
    lines = [
        r"\begin{table}[t]",
        r"\centering",
        rf"\begin{{tabular}}{{{''.join(c.align for c in columns)}}}",
        r"\toprule",
        " & ".join(latex_escape(c.header) for c in columns) + r" \\",
        r"\midrule",
    ]
    current = None
    for _, row in frame.iterrows():
        if group_by is not None and row[group_by] != current:
            if current is not None:
                lines.append(r"\midrule")
            current = row[group_by]
            title = (group_titles or {}).get(current, current)
            lines.append(rf"\multicolumn{{{len(columns)}}}{{l}}{{\textit{{{latex_escape(title)}}}}} \\")
        lines.append(" & ".join(c.fmt(row[c.key]) for c in columns) + r" \\")
    lines += [
        r"\bottomrule",
        r"\end{tabular}",
        rf"\caption{{{latex_escape(caption)}}}",
        rf"\label{{{label}}}",
        r"\end{table}",
        "",
    ]
    return "\n".join(lines)

"""The suite's dataset row: one example, its reference and its prompt texts in one flat record.

The one codec between procexec's records and the rows the released dataset holds and the harness tasks read
(``procexec.harness``): ``suite_row`` writes a row, ``example_of`` and ``reference_of`` read the records back,
so a harness scores exactly what ``procexec generate`` and ``procexec execute`` wrote.  Inputs are exact
text (``format_input``): int and float datasets share one schema, and every digit survives.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from procexec.benchmark.executor import execute, parse_value
from procexec.benchmark.prompts import SYSTEM_PROMPT, chat_messages, format_input, user_message
from procexec.records import Example, Reference

_STRING, _INT, _FLOAT, _BOOL, _STRINGS = pa.string(), pa.int64(), pa.float64(), pa.bool_(), pa.list_(pa.string())

#: Column -> Arrow type, in row order: the example's fields, its reference's, then the prompt texts.
SUITE_COLUMNS: dict[str, pa.DataType] = {
    "id": _STRING, "dataset": _STRING, "length": _INT, "index": _INT, "x": _STRING, "y": _STRING,
    "procedure": _STRING, "input_type": _STRING, "input_range": _STRING, "operator": _STRING, "lookback": _INT,
    "seed": _INT, "spec_version": _STRING,
    "semantics": _STRING, "final": _STRING, "final_float": _FLOAT, "final_type": _STRING, "trace": _STRINGS,
    "edge_cases": _STRINGS, "appendix_a_final": _STRING, "appendix_a_disagrees": _BOOL,
    "system": _STRING, "user": _STRING, "user_folded": _STRING,
}  # fmt: skip
SUITE_SCHEMA = pa.schema(list(SUITE_COLUMNS.items()))
_EXAMPLE_FIELDS = (
    "id",
    "dataset",
    "length",
    "index",
    "procedure",
    "input_type",
    "input_range",
    "operator",
    "lookback",
    "seed",
    "spec_version",
)
_REFERENCE_FIELDS = (
    "id",
    "dataset",
    "length",
    "index",
    "semantics",
    "final",
    "final_float",
    "final_type",
    "trace",
    "edge_cases",
    "appendix_a_final",
    "appendix_a_disagrees",
)


def suite_row(example: Example) -> dict[str, Any]:
    """The row of one example: its fields (inputs as exact text), its default-semantics reference, its prompt."""
    reference = execute(example)
    return {
        **{name: getattr(example, name) for name in _EXAMPLE_FIELDS},
        "x": format_input(example.x),
        "y": format_input(example.y),
        **{name: getattr(reference, name) for name in _REFERENCE_FIELDS},
        "system": SYSTEM_PROMPT,
        "user": user_message(example),
        "user_folded": chat_messages(example, system_role=False)[0]["content"],
    }


def rows_table(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=SUITE_SCHEMA)


def example_of(row: dict[str, Any], where: str = "") -> Example:
    """The Example a row was written from (checked as a dataset line is)."""
    fields = {name: row[name] for name in _EXAMPLE_FIELDS}
    return Example.from_json({**fields, "x": parse_value(row["x"]), "y": parse_value(row["y"])}, where)


def reference_of(row: dict[str, Any], where: str = "") -> Reference:
    """The Reference a row was written from (checked as a references line is)."""
    fields = {name: row[name] for name in _REFERENCE_FIELDS}
    return Reference.from_json({**fields, "trace": list(row["trace"]), "edge_cases": list(row["edge_cases"])}, where)

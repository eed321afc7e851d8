"""The suite's dataset row: one example, its reference and its prompt texts in one flat record.

The one codec between procexec's records and the rows the released dataset holds and the harness tasks read
(``procexec.harness``): ``suite_row`` writes a row, ``example_of`` and ``reference_of`` read the records back,
so a harness scores exactly what ``procexec generate`` and ``procexec execute`` wrote.  Inputs are exact
text (``format_input``): int and float datasets share one schema, and every digit survives.  A row read
from someone else's file (a harness's log) goes through ``read_row``: every column of its JSON type first,
then the example's and the reference's own checks, each problem one line naming the column.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

import pyarrow as pa
from pydantic import AfterValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError
from pydantic import create_model as _create_model
from pydantic_core import PydanticCustomError

from procexec.benchmark.executor import execute, parse_value
from procexec.benchmark.prompts import SYSTEM_PROMPT, chat_messages, format_input, user_message
from procexec.errors import ProcexecError, first_problem
from procexec.records import VALUE_TEXT, Example, InvalidRecord, Reference

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


def _value_text(text: str) -> str:
    if VALUE_TEXT.fullmatch(text) is None:
        raise PydanticCustomError("value_text", "not an exact value (digits, a float repr, inf, -inf or nan)")
    return text


_ARROW_TYPES: dict[pa.DataType, Any] = {
    _STRING: StrictStr,
    _INT: StrictInt,
    _FLOAT: StrictFloat,
    _BOOL: StrictBool,
    _STRINGS: list[StrictStr],
}
_NULLABLE = {"final_float", "appendix_a_final"}  # not finite; the appendix executor returned nothing
_ROW_TYPES = {
    name: (_ARROW_TYPES[kind] | None if name in _NULLABLE else _ARROW_TYPES[kind], ...)
    for name, kind in SUITE_COLUMNS.items()
}
_VALUE_TEXT = Annotated[StrictStr, AfterValidator(_value_text)]
_ROW_TYPES.update(x=(_VALUE_TEXT, ...), y=(_VALUE_TEXT, ...), final=(_VALUE_TEXT, ...))
_ROW_TYPES.update(appendix_a_final=(_VALUE_TEXT | None, ...), trace=(list[_VALUE_TEXT], ...))
# The position within the suite, as the config's suite bounds it (procexec.config.model.Suite: lengths up to
# 10,000, up to 10^6 examples per length, lookbacks 1..64).
_ROW_TYPES.update(
    length=(Annotated[StrictInt, Field(ge=1, le=10000)], ...),
    index=(Annotated[StrictInt, Field(ge=0, lt=1000000)], ...),
    lookback=(Annotated[StrictInt, Field(ge=1, le=64)], ...),
    seed=(Annotated[StrictInt, Field(ge=0)], ...),
)
#: A row as JSON carries it: every column, each of its Arrow type (other keys, such as a harness's, allowed).
_ROW_CONFIG = ConfigDict(strict=True, extra="allow", frozen=True)
# (pydantic's create_model is typed for fields as keywords, not as one ** of a dict of them)
SuiteRow = _create_model("SuiteRow", __config__=_ROW_CONFIG, **_ROW_TYPES)  # type: ignore[call-overload]
_FIELD = re.compile(r"field '([\w.]+)'")


def read_row(obj: Any, where: str, prefix: str) -> Example:
    """The example of a row from a file procexec did not write (``prefix`` names where the row sits: ``doc``,
    ``metadata``), the row checked whole: a missing column, a wrong type or a value its example or reference refuses is one line
    ``WHERE: PREFIX.COLUMN: problem``."""
    try:
        SuiteRow.model_validate(obj)
    except ValidationError as exc:
        raise ProcexecError(f"{where}: {first_problem(exc, prefix=prefix, whole=prefix)}") from None
    try:
        example = example_of(obj)
        reference_of(obj)
    except InvalidRecord as exc:  # the records name a field 'NAME': the row's column
        raise ProcexecError(f"{where}: {_FIELD.sub(lambda m: f'{prefix}.{m.group(1)}', str(exc))}") from None
    return example


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

"""Parquet at the edges: one atomic writer, and readers that name the file of any fault.

Score files, the aggregate's tables and the figures' inputs are parquet; a file
that is missing, a directory, not parquet, lacking a column or holding values of
another type is refused in one line naming it, never a pyarrow traceback.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from procexec.errors import ProcexecError
from procexec.io.files import atomic_write


def write_parquet(table: pa.Table, path: str | Path) -> None:
    with atomic_write(path, binary=True) as handle:
        pq.write_table(table, handle)


@contextlib.contextmanager
def _faults_named(source: Path) -> Iterator[None]:
    try:
        yield
    except (pa.ArrowException, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ProcexecError(f"{source}: not a readable parquet file ({first[:200]})") from None


def read_schema(path: str | Path) -> pa.Schema:
    """The file's schema (its footer only)."""
    source = Path(path)
    if not source.exists():
        raise ProcexecError(f"{source}: file not found")
    if not source.is_file():
        raise ProcexecError(f"{source}: is a directory, expected a parquet file")
    with _faults_named(source):
        return pq.read_schema(source)


def read_table(path: str | Path, schema: pa.Schema) -> pa.Table:
    """The whole file cast to ``schema`` (the caller has checked the column names)."""
    source = Path(path)
    with _faults_named(source):
        return pq.read_table(source).cast(schema)


def read_columns(path: str | Path, columns: dict[str, str]) -> pd.DataFrame:
    """``columns`` (name -> Arrow type name) of a parquet file as a DataFrame.

    A file that is not parquet, lacks one of the columns, or holds one whose
    values do not convert to its type is refused naming the file.
    """
    source = Path(path)
    names = read_schema(source).names
    missing = [c for c in columns if c not in names]
    if missing:
        raise ProcexecError(f"{source}: missing column(s) {', '.join(missing[:5])} (see docs/interfaces.md)")
    target = pa.schema([(name, pa.type_for_alias(kind)) for name, kind in columns.items()])
    with _faults_named(source):
        table = pq.read_table(source, columns=list(columns))
        table.select(list(columns)).cast(target)  # a type check; the original keeps its pandas dtypes
    return table.to_pandas()

"""JSON at the edges: one strict reader of JSON files and JSON Lines, one writer.

Every JSON document the project reads (config.json of a model, manifests, the
figure manifest, rendered prompts, JSON Lines of datasets, references and
generations) goes through ``read_json`` or ``read_jsonl``, so a fault is always
one line naming the file (and line): a missing file, a directory, bytes that
are not UTF-8, a truncated or non-gzip ``.gz``, text that is not strict JSON
(``NaN``/``Infinity`` literals are refused), a document of the wrong kind.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from procexec.errors import ProcexecError, describe_file_fault, reading
from procexec.io.files import atomic_write, read_text


def dumps(record: dict[str, Any]) -> str:
    """One strict-JSON line (no NaN/Infinity literals), keys in insertion order."""
    return json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def write_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> int:
    """Atomically write ``records`` as JSON Lines; returns the number written."""
    with atomic_write(path) as handle:
        return write_lines(handle, records)


def write_lines(handle: IO[str], records: Iterable[dict[str, Any]]) -> int:
    """``records`` as JSON Lines on an open text handle; returns the number written."""
    count = 0
    for record in records:
        handle.write(dumps(record))
        handle.write("\n")
        count += 1
    return count


class _NonFinite(ValueError):
    pass


def _refuse_constant(name: str) -> Any:
    raise _NonFinite(name)


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def _strict(text: str, source: Path, line: int | None = None) -> Any:
    """One strict-JSON value; a fault names the file and line (of the JSON Lines line, or inside the document)."""
    try:
        return _DECODER.decode(text)
    except _NonFinite as exc:
        where = f"{source}:{line}" if line else f"{source}"
        raise ProcexecError(f"{where}: {exc} is not strict JSON (numbers must be finite)") from None
    except json.JSONDecodeError as exc:
        raise ProcexecError(f"{source}:{line or exc.lineno}: not valid JSON ({exc.msg})") from None
    except RecursionError:
        raise ProcexecError(f"{source}{f':{line}' if line else ''}: JSON nested too deeply") from None


def _open_binary(source: Path) -> tuple[IO[bytes], IO[bytes]]:
    """(lines, file): the file's bytes, decompressed for ``.gz``; close both."""
    with reading(source):
        if source.is_dir():
            raise IsADirectoryError(source)
        raw = open(source, "rb")
    if source.name.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw  # type: ignore[return-value]  # typeshed's is no IO[bytes]
    return raw, raw


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)``; any fault raises naming the file (and line)."""
    source = Path(path)
    if not source.exists():
        raise ProcexecError(f"{source}: file not found")
    handle, raw = _open_binary(source)
    with raw, handle:
        lines = iter(handle)
        number = 0
        while True:
            try:
                data = next(lines)
            except StopIteration:
                return
            except EOFError:
                after = f" (cut after line {number})" if number else ""
                raise ProcexecError(f"{source}: truncated gzip file{after}") from None
            except (OSError, zlib.error) as exc:
                where = f"{source}" if number == 0 and isinstance(exc, gzip.BadGzipFile) else f"{source}:{number + 1}"
                raise ProcexecError(f"{where}: {describe_file_fault(exc)}") from None
            number += 1
            try:
                line = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                byte = data[exc.start : exc.start + 1].hex()
                raise ProcexecError(
                    f"{source}:{number}: not UTF-8 text (byte 0x{byte} at column {exc.start + 1})"
                ) from None
            if not line.strip():
                continue
            obj = _strict(line, source, number)
            if not isinstance(obj, dict):
                raise ProcexecError(f"{source}:{number}: expected a JSON object, got {type(obj).__name__}")
            yield number, obj


def read_json(path: str | os.PathLike[str], expect: type = dict, what: str = "JSON document") -> Any:
    """A whole strict-JSON file whose top level is an ``expect``; any fault is one line naming the file.

    ``what`` names the document in the message ("model manifest", "figure manifest", ...).
    """
    source = Path(path)
    document = _strict(read_text(source), source)
    if not isinstance(document, expect):
        raise ProcexecError(f"{source}: not a {what} (a JSON {expect.__name__}, got {type(document).__name__})")
    return document

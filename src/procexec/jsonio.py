"""File I/O at the edges: atomic writes and JSON Lines reading with file:line errors.

Every output of the workflow goes through ``atomic_write`` so an interrupted job
never leaves a half-written file that a rerun would mistake for a finished one.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

from procexec.errors import ProcexecError


def _open_text(path: Path, mode: str) -> IO[str]:
    if path.name.endswith(".gz"):
        return gzip.open(path, mode + "t", encoding="utf-8")
    return open(path, mode, encoding="utf-8", newline="\n")


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], binary: bool = False) -> Iterator[IO[Any]]:
    """Write to a temporary file beside ``path`` and rename it into place on success.

    ``.gz`` paths are gzip-compressed (text mode only).  On any exception the
    temporary file is removed and ``path`` is left untouched.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        if binary:
            handle: IO[Any] = open(tmp, "wb")
        elif target.name.endswith(".gz"):
            handle = gzip.open(tmp, "wt", encoding="utf-8")
        else:
            handle = open(tmp, "w", encoding="utf-8", newline="\n")
        with handle:
            yield handle
            handle.flush()
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def dumps(record: dict[str, Any]) -> str:
    """One strict-JSON line (no NaN/Infinity literals), keys in insertion order."""
    return json.dumps(record, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def write_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> int:
    """Atomically write ``records`` as JSON Lines; returns the number written."""
    count = 0
    with atomic_write(path) as handle:
        for record in records:
            handle.write(dumps(record))
            handle.write("\n")
            count += 1
    return count


def read_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line_number, object)``; a broken line raises naming file and line."""
    source = Path(path)
    if not source.exists():
        raise ProcexecError(f"{source}: file not found")
    with _open_text(source, "r") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ProcexecError(f"{source}:{number}: not valid JSON ({exc.msg})") from None
            if not isinstance(obj, dict):
                raise ProcexecError(f"{source}:{number}: expected a JSON object, got {type(obj).__name__}")
            yield number, obj


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

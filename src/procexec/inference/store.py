"""The resumable generation store: append-only JSON Lines, one file per writer.

A job appends each finished generation to its own file (``{writer}.jsonl``)
and fsyncs it, so a job killed at any moment loses at most the generation in
flight.  Reading merges every file in the directory, so a rerun with a
different shard layout still finds what earlier jobs produced.

Entries are keyed by ``cache_key`` (sha256 of everything that decides the
output); what the key covers is decided by ``procexec.inference.run``.  A torn
last line (the writer was killed mid-write) is ignored when reading and cut off
before the writer appends again; any other broken line is an error.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from procexec.errors import ProcexecError
from procexec.jsonio import dumps

_WRITER = re.compile(r"^[A-Za-z0-9._-]+$")


def cache_key(parts: dict[str, Any]) -> str:
    """sha256 of the canonical JSON of ``parts`` (key order and whitespace do not matter)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Store:
    def __init__(self, directory: str | os.PathLike[str], writer: str):
        if not _WRITER.match(writer):
            raise ProcexecError(f"store writer name '{writer}' must match {_WRITER.pattern}")
        self.directory = Path(directory)
        self.path = self.directory / f"{writer}.jsonl"
        self._entries: dict[str, dict[str, Any]] = {}
        self._handle: Any = None

    def load(self) -> int:
        """Read every file of the store; returns the number of entries."""
        if self.directory.is_dir():
            for path in sorted(self.directory.glob("*.jsonl")):
                self._read(path)
        return len(self._entries)

    def _read(self, path: Path) -> None:
        data = path.read_bytes()
        lines = data.split(b"\n")
        # The part after the last newline is either empty or a torn write.
        for number, raw in enumerate(lines[:-1], start=1):
            if not raw.strip():
                continue
            try:
                entry = json.loads(raw)
                key, record = entry["key"], entry["record"]
            except (ValueError, KeyError, TypeError):
                raise ProcexecError(f"{path}:{number}: broken store entry (not a torn last line); remove the line to continue") from None
            self._entries[key] = record

    def get(self, key: str) -> dict[str, Any] | None:
        return self._entries.get(key)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def _open(self) -> Any:
        self.directory.mkdir(parents=True, exist_ok=True)
        handle = open(self.path, "a+b")
        size = handle.seek(0, os.SEEK_END)
        keep = _end_of_last_line(handle, size)
        if keep != size:  # drop a torn last line left by a killed writer
            handle.truncate(keep)
            os.fsync(handle.fileno())
        return handle

    def put(self, key: str, record: dict[str, Any]) -> None:
        """Append one entry and fsync it: once this returns, a kill -9 cannot lose it."""
        if self._handle is None:
            self._handle = self._open()
        line = dumps({"key": key, "record": record}).encode("utf-8") + b"\n"
        self._handle.write(line)
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._entries[key] = record

    def close(self) -> None:
        if self._handle is not None:
            self._handle.close()
            self._handle = None


def _end_of_last_line(handle: Any, size: int, chunk: int = 1 << 20) -> int:
    """Offset just past the last newline (0 if none), scanning backwards from the end."""
    end = size
    while end > 0:
        start = max(0, end - chunk)
        handle.seek(start)
        cut = handle.read(end - start).rfind(b"\n")
        if cut >= 0:
            return start + cut + 1
        end = start
    return 0

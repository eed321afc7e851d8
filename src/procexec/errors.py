"""Bad input as one exception type, and the file faults that are bad input too.

The CLI prints a ``ProcexecError`` as one line and exits 2.  ``reading`` turns
what the operating system, gzip and the text decoder raise about a file we read
(missing, a directory, unreadable, truncated, not gzip, not UTF-8) into a
``ProcexecError`` naming that file, so every reader reports the path instead
of a traceback.
"""

from __future__ import annotations

import contextlib
import gzip
import zlib
from collections.abc import Callable, Iterator
from os import PathLike
from typing import Any

NEWLINE = b"\n"


class ProcexecError(Exception):
    """Bad input from the user (config, dataset line, model output file...).

    The message must name the problem and where it is (file:line, config key).
    """


def describe_os_error(exc: OSError) -> str:
    """A short reason for a file fault, without the path (the caller names it)."""
    if isinstance(exc, FileNotFoundError):
        return "not found"
    if isinstance(exc, IsADirectoryError):
        return "is a directory, expected a file"
    if isinstance(exc, (NotADirectoryError, FileExistsError)):
        return "a parent of the path is a file, not a directory"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return exc.strerror or str(exc)


def describe_decode_error(exc: UnicodeDecodeError, data: bytes | None = None) -> str:
    """``not UTF-8 text (byte 0xff at line 3)``; the line is counted when ``data`` is the decoded buffer."""
    byte = exc.object[exc.start : exc.start + 1].hex() if exc.object else "??"
    where = f" at offset {exc.start}" if data is None else f" at line {data.count(NEWLINE, 0, exc.start) + 1}"
    return f"not UTF-8 text (byte 0x{byte}{where})"


# What reading a (possibly gzip) file raises when the file, not the code, is at fault.
FILE_FAULTS = (OSError, EOFError, zlib.error, UnicodeDecodeError)


def describe_file_fault(exc: BaseException) -> str:
    if isinstance(exc, gzip.BadGzipFile):
        return f"not a gzip file ({exc})"
    if isinstance(exc, EOFError):
        return "truncated gzip file (it ends before the end-of-stream marker)"
    if isinstance(exc, zlib.error):
        return f"corrupt gzip data ({exc})"
    if isinstance(exc, UnicodeDecodeError):
        return describe_decode_error(exc)
    if isinstance(exc, OSError):
        return describe_os_error(exc)
    return str(exc)


@contextlib.contextmanager
def reading(path: str | PathLike[str], faults: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Re-raise file faults (and ``faults``, e.g. a parser's own errors) as ``PATH: reason``."""
    try:
        yield
    except ProcexecError:
        raise
    except FILE_FAULTS + faults as exc:
        reason = describe_file_fault(exc) if isinstance(exc, FILE_FAULTS) else _first_line(exc)
        raise ProcexecError(f"{path}: {reason}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


#: A pydantic error (``ValidationError.errors()`` item) rephrased: its key path and problem, or None (pydantic's own).
Phrasing = Callable[[dict[str, Any]], "tuple[tuple[Any, ...], str] | None"]


def validation_problems(
    exc: Any, prefix: str = "", width: int = 60, phrase: Phrasing | None = None, whole: str = "<top level>"
) -> list[str]:
    """Each error of a pydantic ``ValidationError`` as one ``key.path: problem (got VALUE)`` line.

    The one format every pydantic-checked input reports in (config, lock, manifest, replies, report rows);
    ``prefix`` names where the validated object sits (``whole`` names it when it has no key path),
    ``phrase`` may word an error its own way.
    """
    lines = []
    for error in exc.errors(include_url=False):
        phrased = phrase(error) if phrase else None
        if phrased:
            loc, message = phrased
        else:
            loc, message = error["loc"], error["msg"]
            if width and error["type"] != "missing":
                message += f" (got {error['input']!r:.{width}})"
        where = ".".join(part for part in (prefix, *map(str, loc)) if part) or whole
        lines.append(f"{where}: {message}")
    return lines


def first_problem(exc: Any, prefix: str = "", width: int = 60, whole: str = "<top level>") -> str:
    """The first error of a pydantic ``ValidationError`` as one line (``validation_problems``)."""
    return validation_problems(exc, prefix, width, whole=whole)[0]

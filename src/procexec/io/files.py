"""File I/O at the edges: atomic writes of one file or of a set of files, whole-file reads, hashes.

Every output of the workflow goes through ``atomic_write`` (one file) or
``FileSet`` (several files that must change together), so an interrupted job
never leaves a half-written file, or half of a new set beside half of the old
one, that a rerun would mistake for a finished result.

* Temporary files are created beside their target as
  ``.{name}.{host}-{pid}-{random}.tmp`` with mode ``0o666`` filtered by the
  umask (``os.open`` applies it; ``tempfile.mkstemp`` would give 0600, and
  ``os.replace`` keeps the mode), so a final file has the mode any other file
  written by the process would have.  Temporaries left by a *killed* process
  of this host are removed by the next write of the same target.
* Text is UTF-8 with ``errors="backslashreplace"``: the one thing UTF-8 cannot
  encode, a lone surrogate (reachable through a JSON ``"\\ud800"`` escape in a
  model's text), is written as the six characters ``\\ud800``.  Inside a JSON
  string that is exactly the JSON escape of the same code unit, so JSON Lines
  round-trip losslessly; in other text (HTML, CSV) it is a visible escape.
  Gzip files carry no name and mtime 0: the same records give the same bytes.
* Readers name the file of any fault: a missing file, a directory, bytes that
  are not UTF-8 (with the line).  JSON and JSON Lines: ``procexec.io.jsonl``.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import secrets
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from procexec.errors import ProcexecError, describe_decode_error, describe_os_error, reading

_HOST = re.sub(r"[^A-Za-z0-9]", "", socket.gethostname())[:32] or "host"
_TEMP_TAIL = re.compile(r"(?P<host>[A-Za-z0-9]+)-(?P<pid>[0-9]+)-[0-9a-f]+\.tmp")
JOURNAL_PREFIX = ".procexec-commit."


# --------------------------------------------------------------------------- test hook


def checkpoint(point: str) -> None:
    """Test hook: pause at a named point so a test can kill the process there.

    With ``PROCEXEC_PAUSE_AT=<point>`` the process writes its pid to
    ``PROCEXEC_PAUSE_FILE`` and sleeps until it is killed (or, inside a commit,
    until a deferred SIGINT/SIGTERM arrives: the commit then completes), at most
    ``PROCEXEC_PAUSE_SECONDS`` (default 60).  Without the variable it costs one
    dictionary lookup.
    """
    if os.environ.get("PROCEXEC_PAUSE_AT") != point:
        return
    marker = os.environ.get("PROCEXEC_PAUSE_FILE")
    if marker:
        Path(marker).write_text(f"{os.getpid()}\n")
    deadline = time.monotonic() + float(os.environ.get("PROCEXEC_PAUSE_SECONDS", "60"))
    while time.monotonic() < deadline and not any(_DEFERRED):
        time.sleep(0.01)


# --------------------------------------------------------------------------- signals

_DEFERRED: list[list[int]] = []  # signals received inside deferred_signals() blocks (innermost last)


@contextlib.contextmanager
def deferred_signals() -> Iterator[None]:
    """Hold SIGINT and SIGTERM for the duration of the block, then deliver them.

    The commit phase of a ``FileSet`` (a handful of renames) runs inside it, so
    Ctrl-C, SLURM or Snakemake stopping a job there lets the commit finish and
    the signal then takes effect as usual.  Off the main thread signal handlers
    cannot be changed: the block runs unprotected (a SIGKILL is possible anyway,
    which is what the commit journal is for).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []

    def hold(signum: int, _frame: Any) -> None:
        received.append(signum)

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    _DEFERRED.append(received)
    try:
        yield
    finally:
        _DEFERRED.pop()
        for sig, handler in previous.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        if received:
            signal.raise_signal(received[0])


# --------------------------------------------------------------------------- temporary files


def _cannot_write(target: Path, exc: OSError) -> ProcexecError:
    return ProcexecError(f"{target}: cannot write ({describe_os_error(exc)})")


def _prepare_target(target: Path) -> None:
    """The folder exists (created if needed) and the target is not a directory; stale temporaries go."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _cannot_write(target, exc) from None
    if target.is_dir():
        raise ProcexecError(f"{target}: cannot write (is a directory)")
    _sweep(target)


def _alive(host: str, pid: int) -> bool:
    """Whether (host, pid) may still be writing: another host is always assumed alive."""
    if host != _HOST:
        return True
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _sweep(target: Path) -> None:
    """Remove temporaries of ``target`` left by dead processes of this host (a SIGKILL mid-write)."""
    prefix = f".{target.name}."
    try:
        names = [n for n in os.listdir(target.parent) if n.startswith(prefix) and n.endswith(".tmp")]
    except OSError:
        return
    for name in names:
        m = _TEMP_TAIL.fullmatch(name[len(prefix) :])
        if m and not _alive(m["host"], int(m["pid"])):
            with contextlib.suppress(OSError):
                os.unlink(target.parent / name)


def _create_temp(target: Path) -> tuple[Path, int]:
    """A new temporary file beside ``target``, mode 0o666 & ~umask; returns (path, fd)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    while True:
        tmp = target.with_name(f".{target.name}.{_HOST}-{os.getpid()}-{secrets.token_hex(4)}.tmp")
        try:
            return tmp, os.open(tmp, flags, 0o666)
        except FileExistsError:
            continue
        except OSError as exc:
            raise _cannot_write(target, exc) from None


@contextlib.contextmanager
def _writer(fd: int, target: Path, binary: bool) -> Iterator[IO[Any]]:
    """A handle on ``fd``: bytes, gzip text (``.gz`` targets) or UTF-8 text; closed (and flushed) on exit."""
    with contextlib.ExitStack() as stack:
        raw = stack.enter_context(os.fdopen(fd, "wb"))
        if binary:
            handle: IO[Any] = raw
        else:
            buffer: io.BufferedWriter | gzip.GzipFile = raw
            if target.name.endswith(".gz"):
                buffer = stack.enter_context(gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0))
            handle = stack.enter_context(
                io.TextIOWrapper(buffer, encoding="utf-8", errors="backslashreplace", newline="\n")
            )
        yield handle
        handle.flush()


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike[str], binary: bool = False) -> Iterator[IO[Any]]:
    """Write to a temporary file beside ``path`` and rename it into place on success.

    ``.gz`` paths are gzip-compressed (text mode only).  On any exception
    (KeyboardInterrupt and the CLI's SIGTERM included) the temporary file is
    removed and ``path`` is left untouched.  A target that cannot be written
    (a parent is a file, no permission, the target is a directory) is a
    ``ProcexecError`` naming it.
    """
    target = Path(path)
    _prepare_target(target)
    tmp: Path | None = None
    try:
        with deferred_signals():  # the temporary named here before an interrupt can end this (it is removed)
            tmp, fd = _create_temp(target)
        with _writer(fd, target, binary) as handle:
            yield handle
        try:
            os.replace(tmp, target)
        except OSError as exc:
            raise _cannot_write(target, exc) from None
    except BaseException:
        if tmp is not None:
            tmp.unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------- sets of files


class FileSet:
    """All-or-nothing replacement of several files in one directory (e.g. a command's outputs).

    Usage::

        with FileSet(out_dir) as files:
            with files.open("metrics.csv") as handle:
                ...
            pq.write_table(table, files.path("metrics.parquet"))  # or hand a path to a worker
        # on a clean exit every file is replaced; on an exception none is

    Phases and what a failure leaves:

    1. *Write*: every new file goes to its own temporary beside the target.
       An exception (SIGINT/SIGTERM included) removes them; a SIGKILL leaves
       them for the next write of the same target to remove.  The old set is
       untouched either way.
    2. *Commit*, with SIGINT/SIGTERM deferred (``deferred_signals``): a
       journal ``.procexec-commit.<id>.json`` listing (temporary, target) pairs
       is written atomically -- its appearance is the commit point -- then each
       temporary is renamed over its target and the journal is removed.  A
       SIGKILL after the journal appeared leaves some targets renamed and
       others not: the next ``FileSet`` on the directory, and every reader
       that calls ``settle``, rolls the journal forward (renames what is left),
       giving the complete new set.  Before the journal exists, nothing has
       changed.

    Why a journal and not a directory swap: the outputs share folders with
    other files (``results/generations/{model}/`` also holds the shards and
    the store), and Linux's atomic exchange of two directories is
    not reachable from Python's standard library.  The guarantee is against
    process death, not power loss (nothing is fsync'ed, like ``atomic_write``).
    """

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ProcexecError(f"{self.directory}: cannot write ({describe_os_error(exc)})") from None
        settle(self.directory)
        self._temps: dict[str, Path] = {}

    def _reserve(self, name: str) -> tuple[Path, int]:
        if Path(name).name != name or name in self._temps:
            raise ValueError(f"bad or repeated file name {name!r} in a FileSet")
        target = self.directory / name
        _prepare_target(target)
        with deferred_signals():  # the temporary listed before an interrupt can end this (``discard`` removes it)
            tmp, fd = _create_temp(target)
            self._temps[name] = tmp
        return tmp, fd

    def path(self, name: str) -> Path:
        """The temporary path to write ``name`` to (by any process); it must exist at commit."""
        tmp, fd = self._reserve(name)
        os.close(fd)
        return tmp

    @contextlib.contextmanager
    def open(self, name: str, binary: bool = False) -> Iterator[IO[Any]]:
        """A handle writing ``name`` (same modes as ``atomic_write``)."""
        tmp, fd = self._reserve(name)
        with _writer(fd, self.directory / name, binary) as handle:
            yield handle
        checkpoint(f"fileset:written:{name}")

    def commit(self) -> list[Path]:
        """Replace every target by its new version (see the class docstring); returns the targets."""
        missing = [name for name, tmp in self._temps.items() if not tmp.exists()]
        if missing:
            raise ProcexecError(f"{self.directory}: {missing[0]} was never written")
        pairs = [[tmp.name, name] for name, tmp in self._temps.items()]
        with deferred_signals():
            journal_target = self.directory / f"{JOURNAL_PREFIX}{_HOST}-{os.getpid()}-{secrets.token_hex(4)}.json"
            tmp, fd = _create_temp(journal_target)
            with _writer(fd, journal_target, binary=False) as handle:
                handle.write(json.dumps({"host": _HOST, "pid": os.getpid(), "files": pairs}) + "\n")
            os.replace(tmp, journal_target)
            checkpoint("fileset:journal")
            _roll_forward(self.directory, pairs, journal_target)
        self._temps = {}
        return [self.directory / name for _, name in pairs]

    def discard(self) -> None:
        for tmp in self._temps.values():
            tmp.unlink(missing_ok=True)
        self._temps = {}

    def __enter__(self) -> FileSet:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            try:
                self.commit()
            except BaseException:
                self.discard()
                raise
        else:
            self.discard()


def _roll_forward(directory: Path, pairs: list[list[str]], journal: Path) -> None:
    for tmp_name, name in pairs:
        tmp = directory / tmp_name
        if tmp.exists():
            try:
                os.replace(tmp, directory / name)
            except OSError as exc:
                raise _cannot_write(directory / name, exc) from None
        checkpoint(f"fileset:renamed:{name}")
    journal.unlink(missing_ok=True)


def settle(directory: str | os.PathLike[str]) -> None:
    """Finish a ``FileSet`` commit that a killed process left in ``directory`` (a no-op otherwise).

    Called by the next writer of the set and by the readers of multi-file
    outputs (the aggregate folder), so nobody sees half of a committed set.
    A commit still in progress in a live process of this host is left alone.
    """
    folder = Path(directory)
    try:
        journals = sorted(p for p in folder.iterdir() if p.name.startswith(JOURNAL_PREFIX) and p.suffix == ".json")
    except OSError:
        return
    for journal in journals:
        try:
            commit = json.loads(journal.read_text(encoding="utf-8"))
            host, pid, pairs = commit["host"], int(commit["pid"]), commit["files"]
        except (OSError, ValueError, KeyError, TypeError):
            raise ProcexecError(f"{journal}: unreadable commit journal (remove it and rerun the command)") from None
        if not _alive(host, pid) or (host == _HOST and pid == os.getpid()):
            _roll_forward(folder, pairs, journal)


def encodable(text: str) -> str:
    """``text`` with any lone surrogate as a ``\\udXXX`` escape: what a UTF-8 file of ours stores.

    For writers that do not go through ``atomic_write``'s text handles (parquet).
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def read_text(path: str | os.PathLike[str]) -> str:
    """A whole UTF-8 file; a fault names the file (and the line of a bad byte)."""
    source = Path(path)
    with reading(source):
        data = source.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProcexecError(f"{source}: {describe_decode_error(exc, data)}") from None


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with reading(path), open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

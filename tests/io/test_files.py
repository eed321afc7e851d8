"""procexec.io.files: atomic writes of one file and of sets, modes, lossless text, reading faults."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from procexec.errors import ProcexecError
from procexec.io.files import FileSet, atomic_write, settle
from procexec.io.jsonl import read_jsonl, write_jsonl


@pytest.fixture
def umask():
    previous = os.umask(0o022)
    try:
        yield lambda mask: os.umask(mask)
    finally:
        os.umask(previous)


@pytest.mark.parametrize("mask, mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_final_files_get_the_umask_mode(umask, mask, mode, tmp_path: Path) -> None:
    umask(mask)
    with atomic_write(tmp_path / "one.txt") as handle:
        handle.write("x")
    write_jsonl(tmp_path / "two.jsonl.gz", [{"a": 1}])
    with FileSet(tmp_path / "set") as files:
        with files.open("a.csv") as handle:
            handle.write("a\n")
        files.path("b.bin").write_bytes(b"b")
    for path in [
        tmp_path / "one.txt",
        tmp_path / "two.jsonl.gz",
        tmp_path / "set" / "a.csv",
        tmp_path / "set" / "b.bin",
    ]:
        assert stat.S_IMODE(path.stat().st_mode) == mode, path


def test_a_lone_surrogate_round_trips_as_a_json_escape(tmp_path: Path) -> None:
    records = [{"text": "a\ud800b\udfff \U0001f600 é"}]
    for name in ("x.jsonl", "x.jsonl.gz"):
        write_jsonl(tmp_path / name, records)
        assert [obj for _, obj in read_jsonl(tmp_path / name)] == records
    assert b'"a\\ud800b\\udfff \xf0\x9f\x98\x80 \xc3\xa9"' in (tmp_path / "x.jsonl").read_bytes()


def test_gzip_output_is_reproducible(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl.gz", [{"a": 1}])
    write_jsonl(tmp_path / "b.jsonl.gz", [{"a": 1}])
    assert (tmp_path / "a.jsonl.gz").read_bytes() == (tmp_path / "b.jsonl.gz").read_bytes()


def test_a_failed_set_changes_nothing_and_leaves_no_temporary(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("old a")
    (tmp_path / "b.txt").write_text("old b")
    with pytest.raises(RuntimeError), FileSet(tmp_path) as files:
        with files.open("a.txt") as handle:
            handle.write("new a")
        raise RuntimeError("second file failed")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.txt"]
    assert (tmp_path / "a.txt").read_text() == "old a"


class Stopped(Exception):
    """What the CLI's SIGTERM handler raises, in this test's own handler."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped


def _write_with(writer: str, folder: Path) -> None:
    if writer == "atomic_write":
        with atomic_write(folder / "out.txt") as handle:
            handle.write("x")
    elif writer == "FileSet.open":
        with FileSet(folder) as files, files.open("out.txt") as handle:
            handle.write("x")
    else:
        with FileSet(folder) as files:
            files.path("out.txt").write_text("x")


@pytest.mark.parametrize("writer", ["atomic_write", "FileSet.open", "FileSet.path"])
def test_a_sigterm_just_after_the_temporary_came_to_be_leaves_none(writer, tmp_path, monkeypatch) -> None:
    """SIGTERM landing right after the temporary file was created, before its writer held its name: it is
    removed all the same (a loaded run once left one beside an interrupted ``score``'s output)."""
    real_open = os.open

    def open_then_sigterm(path, flags, mode=0o777, **kwargs):
        fd = real_open(path, flags, mode, **kwargs)
        if str(path).endswith(".tmp"):
            signal.raise_signal(signal.SIGTERM)
        return fd

    previous = signal.signal(signal.SIGTERM, _stop)
    try:
        monkeypatch.setattr(os, "open", open_then_sigterm)
        with pytest.raises(Stopped):
            _write_with(writer, tmp_path)
        monkeypatch.undo()
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert list(tmp_path.iterdir()) == []


def test_a_set_file_never_written_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ProcexecError, match="never written"), FileSet(tmp_path) as files:
        files.path("a.png").unlink()  # a worker that did not write its file
    assert not list(tmp_path.iterdir())


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(proc.stdout)


def test_temporaries_and_journals_of_dead_processes_are_finished(tmp_path: Path) -> None:
    from procexec.io import files as jsonio

    dead, host = _dead_pid(), jsonio._HOST
    stale = tmp_path / f".a.txt.{host}-{dead}-0abc.tmp"
    live = tmp_path / f".a.txt.{host}-{os.getppid()}-0abd.tmp"  # our parent: alive
    other_host = tmp_path / f".a.txt.elsewhere-{dead}-0abe.tmp"
    for path in (stale, live, other_host):
        path.write_text("partial")
    with atomic_write(tmp_path / "a.txt") as handle:
        handle.write("new")
    assert not stale.exists() and live.exists() and other_host.exists()
    # a commit journal of a killed process: rolled forward by settle (and by the next FileSet)
    (tmp_path / f".b.txt.{host}-{dead}-1abc.tmp").write_text("new b")
    (tmp_path / "b.txt").write_text("old b")
    journal = tmp_path / f".procexec-commit.{host}-{dead}-1abc.json"
    journal.write_text(f'{{"host": "{host}", "pid": {dead}, "files": [[".b.txt.{host}-{dead}-1abc.tmp", "b.txt"]]}}\n')
    settle(tmp_path)
    assert (tmp_path / "b.txt").read_text() == "new b" and not journal.exists()


def test_a_journal_of_a_live_process_is_left_alone(tmp_path: Path) -> None:
    from procexec.io import files as jsonio

    journal = tmp_path / f".procexec-commit.{jsonio._HOST}-{os.getppid()}-2abc.json"
    journal.write_text(f'{{"host": "{jsonio._HOST}", "pid": {os.getppid()}, "files": [[".c.tmp", "c.txt"]]}}\n')
    settle(tmp_path)
    assert journal.exists()
    journal.write_text("{torn")
    with pytest.raises(ProcexecError, match="unreadable commit journal"):
        settle(tmp_path)

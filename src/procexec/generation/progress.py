"""Progress lines for the generation jobs' logs: cluster logs are files, where a tqdm bar is unreadable.

A line is written when a phase starts, at least every ``interval`` seconds while
it runs (a ticker thread, so a minute without a finished generation still
shows up) and when it ends::

    [procexec infer qw-4 2-of-4] attempt 1: 3,210/13,750 done (23.3%), 7.9M tokens, 1,912 tok/s, 412 truncated, 3 looping, elapsed 1:09:12, ETA 3:47:20

A generation counts once its record is made (``add``, from the job), so its ``looping`` is the
verdict the record carries, the one ``procexec status`` and the score row read too.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from procexec.io.formats import format_clock, format_count


class ProgressLog:
    """Counts finished generations of one phase and writes a progress line now and then."""

    def __init__(
        self,
        label: str,
        phase: str,
        total: int,
        interval: float = 60.0,
        stream: TextIO | None = None,
        quiet: bool = False,
    ):
        self.label, self.phase, self.total, self.interval, self.quiet = label, phase, total, interval, quiet
        self.stream = stream or sys.stderr
        self.done = self.tokens = self.truncated = self.looping = 0
        self.started = time.monotonic()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def line(self) -> str:
        with self._lock:
            done, tokens, truncated, looping = self.done, self.tokens, self.truncated, self.looping
        elapsed = time.monotonic() - self.started
        share = done / self.total if self.total else 1.0
        rate = tokens / elapsed if elapsed > 0 else 0.0
        eta = format_clock(elapsed / done * (self.total - done)) if done else "unknown"
        return (
            f"[procexec infer {self.label}] {self.phase}: {done:,}/{self.total:,} done ({100 * share:.1f}%), "
            f"{format_count(tokens)} tokens, {rate:,.0f} tok/s, {truncated:,} truncated, {looping:,} looping, "
            f"elapsed {format_clock(elapsed)}, ETA {eta}"
        )

    def write(self) -> None:
        if not self.quiet:
            print(self.line(), file=self.stream, flush=True)

    def add_to_total(self) -> None:
        """One more generation in this phase: an attempt 2 queued while attempt 1 still runs."""
        with self._lock:
            self.total += 1

    def add(self, tokens: int, truncated: bool, looping: bool = False) -> None:
        with self._lock:
            self.done += 1
            self.tokens += tokens
            self.truncated += int(truncated)
            self.looping += int(looping)

    def __enter__(self) -> ProgressLog:
        self.write()
        if self.interval > 0 and not self.quiet:
            self._ticker = threading.Thread(target=self._tick, name="procexec-progress", daemon=True)
            self._ticker.start()
        return self

    def _tick(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        self.write()

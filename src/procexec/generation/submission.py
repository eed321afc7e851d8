"""One submission of a job's generations to its backend, and what happens as each one finishes.

Each request goes out with the tokens an interrupted run saved of it (a partial record); each completion
becomes a checked record in the store the moment it finishes; an attempt 1 the truncation rule reruns has
its attempt 2 queued at once, while the others still run (no barrier between attempts: a continuation
finds its prompt and attempt-1 blocks in the engine's prefix cache).  An interrupt (SIGTERM, SIGINT, a
stalled engine) keeps every unfinished generation's tokens so far as its partial record
(docs/generation.md, "Partial records").
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from procexec.errors import ProcexecError
from procexec.generation.backend import Completion, Request
from procexec.generation.engine_stats import EngineStats
from procexec.generation.planning import Planned
from procexec.generation.progress import ProgressLog
from procexec.generation.resumable import partial_key, partial_problem
from procexec.generation.watchdog import EngineStalled, Watchdog
from procexec.records import GenerationRecord

if TYPE_CHECKING:
    from procexec.generation.job import Job


class Submission:
    """``items`` of ``job`` in one ``backend.generate`` call (``phase`` names it in the progress lines)."""

    def __init__(self, job: Job, items: list[Planned], phase: str):
        self.job = job
        self.log = ProgressLog(
            f"{job.key} {job.writer}",
            phase,
            len(items),
            interval=job.progress_interval or 0,
            quiet=job.progress_interval is None,
        )
        self.resumed: dict[str, list[int]] = {}  # each generation's saved tokens (a partial record), by key
        self.request_of: dict[int, Request] = {}  # a completion's tag is its request's
        self.queued = {item.key for item in items}
        self.requests = [self.request(item) for item in items]

    def request(self, item: Planned) -> Request:
        """``item``'s request: what is left of its budget after the tokens it resumes from."""
        self.resumed[item.key] = self.resume_from(item)
        self.request_of[id(item)] = Request(
            item,
            item.prompt,
            item.max_tokens - len(self.resumed[item.key]),
            [] if item.continued is None else item.continued.token_ids or [],
            self.job.planner.guard(item.attempt),
            self.resumed[item.key],
        )
        return self.request_of[id(item)]

    def run(self) -> None:
        """Send every request; each result is in the store as soon as it finishes."""
        job = self.job
        job.backend.start()  # outside the timed span: the decode rate counts no start-up, and no failed start
        started = time.monotonic()
        watchdog = Watchdog(job.settings.stall_timeout_s, job.backend.progress, f"models.{job.key}: the engine")
        with self.log, watchdog:
            try:
                job.backend.generate(self.requests, job.settings.sampling, self.finished)
            except KeyboardInterrupt as exc:
                self.keep_unfinished()  # a stall too: stopped as on SIGTERM, the next run resumes
                if isinstance(exc, EngineStalled):
                    raise ProcexecError(exc.message) from None
                raise
            finally:
                job.generate_s += time.monotonic() - started
            job.store.flush()  # every record built, off the loop too: the last progress line counts them all

    def finished(self, completion: Completion) -> list[Request]:
        """Store ``completion``'s record; the attempt 2 it needs, if any, as the request to send next."""
        job, item = self.job, completion.tag
        already = len(self.resumed[item.key])  # decoded by an interrupted run, before this one
        if already:
            completion.details["resumed_tokens"] = already
        # Nothing invalid is stored: a record is checked as it is built, by the same checks
        # every reader applies.  Off the engine loop (the store's writer thread) when the backend's
        # finish asks for it; otherwise here and now, so a bad one stops the job before it reaches the store.
        # A truncated attempt 1 is built here: whether it is rerun is read from its text, now.
        rerun = job.chain_reruns and item.attempt == 1 and completion.finish_reason == "length"
        record = None
        if job.backend.finish_off_loop and not rerun:
            job.store.put(item.key, lambda: self.build(item, completion, already).to_json())
        else:
            record = self.build(item, completion, already)
            job.store.put(item.key, record.to_json())
        job.checked.add(item.key)
        job.generated += 1
        job.decoded_tokens += completion.num_generated_tokens - already
        if item.continued is not None and "num_cached_tokens" in completion.details:
            job.continuation_prefill += EngineStats(
                continuation_prefill_tokens=len(self.request_of[id(item)].engine_ids()),
                cached_prefill_tokens=completion.details["num_cached_tokens"],
            )
        second = None if record is None or not rerun else job.planner.rerun_of(item, record)
        if second is None or second.key in job.store or second.key in self.queued:
            return []
        self.queued.add(second.key)
        self.log.add_to_total()
        return [self.request(second)]

    def build(self, item: Planned, completion: Completion, already: int) -> GenerationRecord:
        """``item``'s record from its completion (``already``: tokens an interrupted run decoded of it)."""
        request = self.request_of[id(item)]
        self.job.backend.finish(request, completion)
        record = self.job.record(item, completion, request)
        self.log.add(completion.num_generated_tokens - already, record.finish_reason == "length", bool(record.looping))
        return record

    def resume_from(self, item: Planned) -> list[int]:
        """The tokens of ``item``'s partial record (an earlier run's interrupt); [] when there is none.

        One this job cannot continue from (damaged, another generation's, no room left, an id outside the
        model's vocabulary) is dropped with one warning line: the generation is then made from the start.
        """
        pkey = partial_key(item.key)
        if pkey not in self.job.store:
            return []
        problem: str | None
        try:
            obj = self.job.store.get(pkey) or {}
        except ProcexecError as exc:
            problem = str(exc)
        else:
            problem = partial_problem(obj, item.key, item.max_tokens, self.job.backend.vocabulary())
            if problem is None:
                return obj["token_ids"]
        self.job.store.drop(pkey)
        print(
            f"[procexec infer {self.job.key}] warning: the partial record of {item.example.id} (attempt "
            f"{item.attempt}) cannot be continued ({problem}); dropped, it is generated from the start",
            file=sys.stderr,
            flush=True,
        )
        return []

    def keep_unfinished(self) -> None:
        """On an interrupt: store each unfinished generation's tokens so far as its partial record (one that
        goes beyond the saved tokens it started from).

        Only token ids are stored (no detokenising: SLURM leaves 120 s); the store's close, which
        runs next, makes them durable.
        """
        kept = tokens = 0
        for item, ids in self.job.backend.unfinished():
            if (
                item.key not in self.resumed
                or item.key in self.job.store
                or not (len(self.resumed[item.key]) < len(ids) < item.max_tokens)
            ):
                continue
            pkey = partial_key(item.key)
            self.job.store.drop(pkey)  # an earlier partial of it: this one goes further
            self.job.store.put(
                pkey,
                {
                    "partial_of": item.key,
                    "id": item.example.id,
                    "model": self.job.key,
                    "attempt": item.attempt,
                    "finish_reason": "partial",
                    "num_generated_tokens": len(ids),
                    "token_ids": list(ids),
                    "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                },
            )
            kept, tokens = kept + 1, tokens + len(ids)
        if kept:
            print(
                f"[procexec infer {self.job.key}] interrupted: kept {kept} unfinished generation(s) "
                f"({tokens} tokens) as partial records; the next run continues them",
                file=sys.stderr,
                flush=True,
            )

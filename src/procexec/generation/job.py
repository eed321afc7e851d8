"""One generation job: (model, datasets, shard I of N) -> GenerationRecords, resumably, on any backend.

Order of work, chosen so that bad input fails before anything expensive and a
rerun does only what is missing:

1. read and check the job's settings (``JobSettings``), the manifest and the
   datasets, then build and open the backend (tokenizer and engine arguments
   checked, no weights loaded);
2. render every prompt and compute each generation's store key
   (``procexec.generation.planning``);
3. submit every generation missing from the store at once, the longest
   procedures first (``submission_order``), persisting each as it finishes
   (``procexec.generation.submission``; the backend starts its engine only
   now).  Truncation rule (spec section 4): an attempt 1 that
   stopped on the token limit without a correct answer gets an attempt 2 with
   the model's context as budget (``inference.truncation_rerun``), queued the
   moment attempt 1 finishes, while the others still run: no barrier between
   attempts, so a continuation finds its prompt and attempt-1 blocks in the
   engine's prefix cache;
4. write the shard file (atomic) from the store.

An interrupt (SIGTERM before a SLURM time limit, SIGINT) keeps every
unfinished generation's tokens so far as a partial record (``partial_key``);
the next run continues each from its tokens, so the finished record is the one
an uninterrupted run makes (docs/generation.md, "Partial records").

The job owns planning, keys, the store and the truncation policy; everything
engine-specific is behind ``procexec.generation.backend.Backend``.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procexec import __version__
from procexec.benchmark.prompts import chat_messages
from procexec.errors import ProcexecError
from procexec.generation.backend import Backend, Completion, Request
from procexec.generation.backends import create_backend
from procexec.generation.engine_stats import EngineStats, add_stats, speculative_label
from procexec.generation.job_settings import JobSettings
from procexec.generation.planning import Planned, Planner, load_examples, order_key, shard_slice, submission_order
from procexec.generation.resumable import finished_problem
from procexec.generation.store import Store, store_writer
from procexec.generation.submission import Submission
from procexec.io.jsonl import write_jsonl
from procexec.records import Example, GenerationRecord, InvalidRecord
from procexec.scoring.loops import detect_loop
from procexec.scoring.truncation import has_correct_answer


@dataclass
class JobResult:
    plans: list[Planned]  # every generation of the shard, in output order
    job: Job
    generated: int  # generations run by this job (0 when everything came from the store)
    cached: int
    wall_time_s: float
    decoded_tokens: int  # tokens this job decoded (a continuation counts only its new tokens)

    @property
    def records(self) -> list[GenerationRecord]:
        """All records at once (tests and small shards; ``run_job`` streams them)."""
        return list(self.job.records(self.plans))


class Job:
    def __init__(
        self,
        settings: JobSettings,
        examples: list[Example],
        store_dir: Path,
        writer: str,
        backend: Backend,
        progress_interval: float | None = 60.0,
        answered: Callable[[str, Example], bool] = has_correct_answer,
        attempt_barrier: bool = False,
        shortest_first: bool = False,
    ):
        """``attempt_barrier``: attempt 2 starts only once the whole of attempt 1 is done (the order before
        issue 31, kept as the comparison ``benchmarks/bench_attempt_barrier.py`` measures against).
        ``shortest_first``: submit in the shard's (length, dataset, index) order, shortest procedures first (the
        order before issue 37, kept as the comparison ``benchmarks/bench_shard_order.py`` measures against)."""
        self.settings = settings
        self.key = settings.model_key
        self.examples = examples
        self.backend = backend
        self.store = Store(store_dir, writer, settings.store_commit_records, settings.store_commit_seconds)
        self.writer = writer
        self.progress_interval = progress_interval
        self.generated = 0
        self.decoded_tokens = 0
        self.generate_s = 0.0  # in the backend's generate calls (for the shard's tokens/s)
        self.continuation_prefill = EngineStats()  # continuations' prefix tokens, and those the cache served
        self.planner = Planner(settings, backend, answered)
        # an attempt 2 is queued as its attempt 1 finishes (else in a pass of its own, after all of attempt 1)
        self.chain_reruns = not attempt_barrier and self.planner.truncation_rerun != "off"
        self.shortest_first = shortest_first
        self._provenance: dict[str, Any] | None = None
        self.checked: set[str] = set()  # keys whose record this job made, or read back and found valid

    # ------------------------------------------------------------------ plans

    def warn(self, problem: str) -> None:
        """One warning line on stderr (the job log): something was dropped, and the run goes on without it."""
        print(f"[procexec infer {self.key}] warning: {problem}", file=sys.stderr, flush=True)

    def plan_first(self) -> list[Planned]:
        """Attempt-1 plans of every example (renders the prompts; reads the store once)."""
        self.store.load(warn=lambda problem: self.warn(f"{problem}; skipped, what it held is generated again"))
        plans = []
        for ex in self.examples:
            prompt = self.backend.render(functools.partial(chat_messages, ex))
            plans.append(self.planner.plan(ex, 1, prompt, self.settings.max_new_tokens))
        return plans

    def rerun_for(self, item: Planned) -> Planned | None:
        """The attempt-2 plan for ``item``'s stored attempt 1 (``Planner.rerun_of``); the store's index answers
        for an attempt 1 that did not stop on the token limit, without reading its record."""
        entry = self.store.entry(item.key)
        if entry is not None and entry.finish_reason != "length":  # the index says it: no record read
            return None
        record = self.stored(item)
        assert record is not None
        return self.planner.rerun_of(item, record)

    # ------------------------------------------------------------------ records

    def provenance(self, item: Planned, completion: Completion, request: Request) -> dict[str, Any]:
        if self._provenance is None:
            settings, model = self.settings, self.settings.model
            self._provenance = {
                "model_key": self.key,
                "hf_id": model.hf_id,
                "revision": model.revision,
                "source": model.source,
                "model_files": self.planner.identity.get("model_files", {}),
                "chat_template_kwargs": model.chat_template_kwargs,
                "template_date": settings.template_date.isoformat(),
                "rerun_repetition_guard": settings.rerun_repetition_guard,  # the setting, in every record (null: none)
                "stage": settings.stage,  # the study stage that generated it (a smoke's budgets are its own)
                "procexec_version": __version__,
                **self.backend.provenance(),
            }
        # what the request was sent with (the backend's own parameters included), with the generation's budget:
        # a resumed request was sent what was left of it
        sampling = {**self.backend.request_sampling(request, self.settings.sampling), "max_tokens": item.max_tokens}
        if item.continued is None and item.max_tokens < item.requested_tokens:
            sampling["max_tokens_requested"] = item.requested_tokens
        return {
            **self._provenance,
            "sampling": sampling,
            **completion.details,
            "wall_time_s": round(completion.wall_time_s, 3),
            "cache_key": item.key,
            "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }

    def record(self, item: Planned, completion: Completion, request: Request) -> GenerationRecord:
        ex, text, ids, offsets = item.example, completion.text, completion.token_ids, completion.token_offsets
        generated = completion.num_generated_tokens
        first = item.continued
        if first is not None:  # a continuation's record is attempt 1 followed by the new tokens
            ids = None if ids is None or first.token_ids is None else [*first.token_ids, *ids]
            if offsets is not None and first.token_offsets is not None:
                offsets = [*first.token_offsets, *(len(first.text) + o for o in offsets)]
            else:
                offsets = None
            text = first.text + text
            generated += first.num_generated_tokens or 0
        provenance = self.provenance(item, completion, request)
        if first is not None:
            provenance["continued_tokens"] = first.num_generated_tokens
        # The loop verdict, judged here once: the progress line, the store's index (status) and the score
        # row read it from the record (``GenerationRecord.looping``), so they agree whatever loops.py says later.
        loop = detect_loop(ids, text)
        provenance["loop"] = None if loop is None else loop.to_json()
        try:
            return GenerationRecord(  # checked as it is constructed, by the checks every reader applies
                id=ex.id,
                model=self.key,
                dataset=ex.dataset,
                length=ex.length,
                index=ex.index,
                attempt=item.attempt,
                text=text,
                num_generated_tokens=generated,
                finish_reason=completion.finish_reason,
                token_ids=ids,
                token_offsets=offsets,
                prompt_sha256=item.prompt.sha256,
                prompt_tokens=item.prompt.num_tokens or completion.details.get("prompt_tokens", 0),
                system_folded=item.prompt.system_folded,
                continues_attempt=None if first is None else first.attempt,
                provenance=provenance,
            )
        except InvalidRecord as exc:
            where = f"{self.key}: the generation of {ex.id} (attempt {item.attempt}) is not a valid record"
            raise exc.at(where) from None

    def stored(self, item: Planned) -> GenerationRecord | None:
        """The stored record for ``item``, re-labelled for this example (equal prompts share a key).

        An entry today's reader refuses (a damaged frame, a record an older writer saved that fails
        ``GenerationRecord``'s checks, tokens that do not fit the model: ``resumable.finished_problem``) is
        dropped with one warning line and reads as missing, so the job makes that generation again instead of
        failing on it every run (or sending its tokens to the engine as a continuation's prefix)
        (``procexec status --verify`` names the same entries beforehand).
        """
        where = f"{self.store.directory} entry {item.key[:12]}"
        try:
            obj = self.store.get(item.key)
            if obj is None:
                return None
            record = GenerationRecord.from_json(obj, where)
            problem = finished_problem(record, item.max_tokens, self.backend.vocabulary())
            if problem is not None:
                raise ProcexecError(f"{where}: {problem}")
        except ProcexecError as exc:
            self.store.drop(item.key)
            print(
                f"[procexec infer {self.key}] warning: {exc}; dropped, {item.example.id} "
                f"(attempt {item.attempt}) is generated again",
                file=sys.stderr,
                flush=True,
            )
            return None
        labels = self.labels(item.example)
        if any(getattr(record, name) != value for name, value in labels.items()):  # another example's prompt
            record = dataclasses.replace(record, **labels)
        return record

    def labels(self, example: Example) -> dict[str, Any]:
        """The fields that say whose generation a record is: equal prompts share a key, so a stored
        record may be another example's."""
        return {
            "id": example.id,
            "model": self.key,
            "dataset": example.dataset,
            "length": example.length,
            "index": example.index,
        }

    def refused(self, items: list[Planned]) -> list[Planned]:
        """Of ``items`` stored by earlier runs, those whose record today's reader refuses (now dropped)."""
        refused = []
        for item in items:
            if item.key in self.store and item.key not in self.checked:
                if self.stored(item) is None:
                    refused.append(item)
                else:
                    self.checked.add(item.key)
        return refused

    # ------------------------------------------------------------------ running

    def generate(self, items: list[Planned], phase: str) -> None:
        """Run ``items`` in one submission; each result is in the store as soon as it finishes, and an attempt 1
        that the truncation rule reruns has its attempt 2 queued at once (unless ``attempt_barrier``)."""
        if items:
            Submission(self, items, phase).run()

    def run(self) -> JobResult:
        """Generate what is missing; the result lists every plan (records are read back on demand).

        One submission makes every missing generation: attempt 1, and attempt 2 of every attempt 1 the
        truncation rule reruns (stored by an earlier run: sent at once; made now: queued as it finishes).
        The attempt-2 pass after it finds nothing left to do, unless ``attempt_barrier`` left every attempt 2 to it.
        """
        started = time.monotonic()
        try:
            first = self.plan_first()
            self.refused(first)  # what an earlier run stored and today's reader refuses: dropped, made again
            second: list[Planned] = []
            if self.chain_reruns:  # a resumed shard: the attempts 2 its stored attempts 1 need go out with the rest
                second = [r for p in first if p.key in self.store and (r := self.rerun_for(p)) is not None]
                self.refused(second)
            todo = self.ordered([p for p in [*first, *second] if p.key not in self.store])
            self.generate(todo, "attempts 1-2" if self.chain_reruns else "attempt 1")
            if self.planner.truncation_rerun != "off":
                second = [r for r in map(self.rerun_for, first) if r is not None]
                self.generate(self.ordered([p for p in second if p.key not in self.store]), "attempt 2")
                self.generate(self.refused(second), "attempt 2 (repair)")
        finally:
            self.keep_stats()
            self.backend.close()
            self.store.close()
        plans = sorted(first + second, key=lambda p: (*order_key(p.example), p.attempt))
        missing = [p.example.id for p in plans if p.key not in self.store]
        if missing:
            raise RuntimeError(f"{len(missing)} generation(s) missing from the store after the run, e.g. {missing[0]}")
        return JobResult(
            plans, self, self.generated, len(plans) - self.generated, time.monotonic() - started, self.decoded_tokens
        )

    def ordered(self, plans: list[Planned]) -> list[Planned]:
        """``plans`` in the order they are submitted (``submission_order``; as planned with ``shortest_first``)."""
        return plans if self.shortest_first else sorted(plans, key=submission_order)

    def keep_stats(self) -> None:
        """Add this run's decode rate (and the backend's start-up, counters and KV pool) to the shard's statistics
        (``procexec.generation.engine_stats``, read by ``procexec status``); a failure is a warning only."""
        if self.generate_s <= 0:
            return
        stats = (
            EngineStats(
                decoded_tokens=self.decoded_tokens,
                generate_s=self.generate_s,
                speculative=speculative_label(self.settings.model.speculative_config),
            )
            + self.continuation_prefill
        )
        try:
            add_stats(self.store.directory, self.writer, stats + self.backend.engine_stats())
        except (ProcexecError, OSError) as exc:
            print(
                f"[procexec infer {self.key}] warning: engine statistics not kept ({exc})", file=sys.stderr, flush=True
            )

    def records(self, plans: list[Planned]) -> Iterator[GenerationRecord]:
        """The stored records of ``plans``, one at a time (a full shard does not fit in memory at once)."""
        for plan in plans:
            record = self.stored(plan)
            assert record is not None
            yield record

    def shard_lines(self, plans: list[Planned]) -> Iterator[dict[str, Any]]:
        """The shard file's lines: the stored JSON of ``plans``, re-labelled, one at a time.

        No ``GenerationRecord`` is built again: after ``run`` every one of them was checked in this
        run, as it was made or by ``refused``; ``procexec collect`` checks the shard file as it reads it.
        """
        for plan in plans:
            obj = self.store.get(plan.key)
            assert obj is not None
            yield {**obj, **self.labels(plan.example)}


def run_job(
    settings: JobSettings,
    datasets_dir: Path,
    datasets: list[str],
    shard: int,
    num_shards: int,
    store_dir: Path,
    out: Path,
    manifest_path: Path | None = None,
    progress_interval: float | None = 60.0,
    backend_factory: Callable[..., Backend] | None = None,
) -> JobResult:
    """``procexec infer``: run one shard of ``settings``' model and write its records (gzip JSON Lines, atomic)."""
    examples = shard_slice(load_examples(datasets_dir, datasets), shard, num_shards)
    backend = (backend_factory or create_backend)(settings, manifest_path)
    job = Job(
        settings, examples, store_dir, store_writer(settings.stage, shard, num_shards), backend, progress_interval
    )
    result = job.run()
    write_jsonl(out, job.shard_lines(result.plans))
    return result

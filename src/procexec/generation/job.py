"""One inference job: (model, datasets, shard I of N) -> GenerationRecords, resumably, on any backend.

Order of work, chosen so that bad input fails before anything expensive and a
rerun does only what is missing:

1. read and check the job's settings (``JobSettings``), the manifest and the
   datasets, then build and open the backend (tokenizer and engine arguments
   checked, no weights loaded);
2. render every prompt and compute each generation's store key;
3. submit every generation missing from the store at once, persisting each as
   it finishes (the backend starts its engine only now).  Truncation rule
   (spec section 4): an attempt 1 that stopped on the token limit without a
   correct answer gets an attempt 2 with the model's context as budget
   (``inference.truncation_rerun``), queued the moment attempt 1 finishes,
   while the others still run: no barrier between attempts, so a continuation
   finds its prompt and attempt-1 blocks in the engine's prefix cache;
4. write the shard file (atomic) from the store.

An interrupt (SIGTERM before a SLURM time limit, SIGINT) keeps every
unfinished generation's tokens so far as a partial record (``partial_key``);
the next run continues each from its tokens, so the finished record is the one
an uninterrupted run makes (docs/inference.md, "Partial records").

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
from procexec.config.keys import canonical_sha256, sampling_identity
from procexec.engine.tokenizer import RenderedPrompt
from procexec.errors import ProcexecError
from procexec.generation.backend import Backend, Completion, Request
from procexec.generation.backends import create_backend
from procexec.generation.engine_stats import EngineStats, add_stats, speculative_label
from procexec.generation.job_settings import JobSettings
from procexec.generation.progress import ProgressLog
from procexec.generation.resumable import finished_problem, partial_key, partial_problem
from procexec.generation.store import Store, store_writer
from procexec.generation.watchdog import EngineStalled, Watchdog
from procexec.io.jsonl import read_jsonl, write_jsonl
from procexec.records import Example, GenerationRecord, InvalidRecord
from procexec.scoring.loops import detect_loop
from procexec.scoring.truncation import has_correct_answer


def load_examples(datasets_dir: Path, datasets: list[str]) -> list[Example]:
    examples: list[Example] = []
    for dataset in datasets:
        path = datasets_dir / f"{dataset}.jsonl"
        for number, obj in read_jsonl(path):
            example = Example.from_json(obj, f"{path}:{number}")
            if example.dataset != dataset:
                raise ProcexecError(f"{path}:{number}: example of dataset '{example.dataset}', expected '{dataset}'")
            examples.append(example)
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise ProcexecError("duplicate example ids across the given datasets")
    return examples


def order_key(example: Example) -> tuple[int, str, int]:
    return (example.length, example.dataset, example.index)


def shard_slice(examples: list[Example], shard: int, num_shards: int) -> list[Example]:
    """Shard ``shard`` (1-based) of ``num_shards``: every N-th example in (length, dataset, index) order.

    Striding instead of cutting contiguous blocks gives every shard the same
    mix of lengths, so shards of one model take about the same time.
    """
    if not 1 <= shard <= num_shards:
        raise ProcexecError(f"--shard {shard} is outside 1..{num_shards}")
    return sorted(examples, key=order_key)[shard - 1 :: num_shards]


@dataclass
class Planned:
    """One generation the job needs: its example, prompt, budget, key and (continuations) what it extends."""

    example: Example
    attempt: int
    prompt: RenderedPrompt
    max_tokens: int
    requested_tokens: int  # the budget before clamping to the engine's context
    key: str
    continued: GenerationRecord | None = None  # a continuation: the stored attempt it extends


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
    ):
        """``attempt_barrier``: attempt 2 starts only once the whole of attempt 1 is done (the order before
        issue 31, kept as the comparison ``benchmarks/bench_attempt_barrier.py`` measures against)."""
        self.settings = settings
        self.key = settings.model_key
        # the truncation rule's question, scoring's versioned answer (procexec.scoring.truncation)
        self.answered = answered
        self.examples = examples
        self.backend = backend
        self.store = Store(store_dir, writer, settings.store_commit_records, settings.store_commit_seconds)
        self.writer = writer
        self.progress_interval = progress_interval
        self.generated = 0
        self.decoded_tokens = 0
        self.generate_s = 0.0  # in the backend's generate calls (for the shard's tokens/s)
        self.continuation_prefill = EngineStats()  # continuations' prefix tokens, and those the cache served
        self.truncation_rerun = settings.truncation_rerun
        if self.truncation_rerun == "continue" and not backend.supports_continuation:
            self.truncation_rerun = "regenerate"
        # an attempt 2 is queued as its attempt 1 finishes (else in a pass of its own, after all of attempt 1)
        self.chain_reruns = not attempt_barrier and self.truncation_rerun != "off"
        self._identity = backend.identity()
        self._provenance: dict[str, Any] | None = None
        self._checked: set[str] = set()  # keys whose record this job made, or read back and found valid
        self._answers: dict[tuple[str, str], bool] = {}  # (attempt-1 key, example id): has a correct answer

    # ------------------------------------------------------------------ plans and keys

    def budget(self, example: Example, prompt: RenderedPrompt, requested: int) -> int:
        """``requested`` new tokens, clamped to what the engine's context leaves after the prompt."""
        room = self.backend.max_model_len() - (prompt.num_tokens or 0)
        if room <= 0:
            raise ProcexecError(
                f"{example.id}: the prompt has {prompt.num_tokens} tokens, models.{self.key}.max_model_len "
                f"is {self.backend.max_model_len()}: no room to generate"
            )
        return min(requested, room)

    def plan(
        self,
        example: Example,
        attempt: int,
        prompt: RenderedPrompt,
        requested: int,
        extends: tuple[Planned, GenerationRecord] | None = None,
    ) -> Planned:
        """Plan one generation; a continuation names the attempt it extends (its plan and stored record)."""
        already = 0 if extends is None else extends[1].num_generated_tokens or 0
        max_tokens = self.budget(example, prompt, requested) - already
        key = canonical_sha256(
            {
                "engine": self._identity,
                "prompt_sha256": prompt.sha256,
                "prompt_tokens": prompt.num_tokens,
                "sampling": {
                    **self.settings.sampling.to_json(),
                    "max_tokens": max_tokens,
                    **sampling_identity(self.settings.model),
                    **({"repetition_detection": self.guard(attempt)} if self.guard(attempt) else {}),
                },
                "attempt": attempt,
                "continues": None if extends is None else extends[0].key,
            }
        )
        return Planned(example, attempt, prompt, max_tokens, requested, key, None if extends is None else extends[1])

    def warn(self, problem: str) -> None:
        """One warning line on stderr (the job log): something was dropped, and the run goes on without it."""
        print(f"[procexec infer {self.key}] warning: {problem}", file=sys.stderr, flush=True)

    def guard(self, attempt: int) -> dict[str, int] | None:
        """The repetition guard of an attempt's requests: the configured one on reruns, none on attempt 1."""
        return self.settings.rerun_repetition_guard if attempt > 1 else None

    def plan_first(self) -> list[Planned]:
        """Attempt-1 plans of every example (renders the prompts; reads the store once)."""
        self.store.load(warn=lambda problem: self.warn(f"{problem}; skipped, what it held is generated again"))
        plans = []
        for ex in self.examples:
            prompt = self.backend.render(functools.partial(chat_messages, ex))
            plans.append(self.plan(ex, 1, prompt, self.settings.max_new_tokens))
        return plans

    def rerun_for(self, item: Planned) -> Planned | None:
        """The attempt-2 plan for a truncated, incorrect attempt 1 (None when not needed or pointless).

        The budget is the model's context minus the prompt, capped by the
        engine's ``max_model_len``.  When that leaves no more room than attempt
        1 had, a greedy rerun would repeat attempt 1 token for token: skipped.
        ``continue`` submits attempt 1's tokens after the prompt and decodes
        only the rest; ``regenerate`` decodes everything again.
        """
        entry = self.store.entry(item.key)
        if entry is not None and entry.finish_reason != "length":  # the index says it: no record read
            return None
        record = self.stored(item)
        assert record is not None
        return self.rerun_of(item, record)

    def rerun_of(self, item: Planned, record: GenerationRecord) -> Planned | None:
        """``rerun_for`` given attempt 1's record (just made, or read from the store)."""
        if record.finish_reason != "length" or self.has_answer(item, record):
            return None
        requested = self.settings.max_context - (item.prompt.num_tokens or 0)
        if self.budget(item.example, item.prompt, requested) <= item.max_tokens:
            return None
        if self.truncation_rerun == "continue" and record.token_ids is not None:
            return self.plan(item.example, 2, item.prompt, requested, extends=(item, record))
        return self.plan(item.example, 2, item.prompt, requested)

    def has_answer(self, item: Planned, record: GenerationRecord) -> bool:
        """The truncation check's answer for ``item``'s attempt 1, asked once: the attempt-2 pass after a
        submission that queued attempts 2 as they came asks again of every truncated attempt 1."""
        asked = (item.key, item.example.id)
        if asked not in self._answers:
            self._answers[asked] = self.answered(record.text, item.example)
        return self._answers[asked]

    # ------------------------------------------------------------------ records

    def provenance(self, item: Planned, completion: Completion, request: Request) -> dict[str, Any]:
        if self._provenance is None:
            settings, model = self.settings, self.settings.model
            self._provenance = {
                "model_key": self.key,
                "hf_id": model.hf_id,
                "revision": model.revision,
                "source": model.source,
                "model_files": self._identity.get("model_files", {}),
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
            if item.key in self.store and item.key not in self._checked:
                if self.stored(item) is None:
                    refused.append(item)
                else:
                    self._checked.add(item.key)
        return refused

    def resumed(self, item: Planned) -> list[int]:
        """The tokens of ``item``'s partial record (an earlier run's interrupt); [] when there is none.

        One this job cannot continue from (damaged, another generation's, no room left, an id outside the
        model's vocabulary) is dropped with one warning line: the generation is then made from the start.
        """
        pkey = partial_key(item.key)
        if pkey not in self.store:
            return []
        problem: str | None
        try:
            obj = self.store.get(pkey) or {}
        except ProcexecError as exc:
            problem = str(exc)
        else:
            problem = partial_problem(obj, item.key, item.max_tokens, self.backend.vocabulary())
            if problem is None:
                return obj["token_ids"]
        self.store.drop(pkey)
        print(
            f"[procexec infer {self.key}] warning: the partial record of {item.example.id} (attempt "
            f"{item.attempt}) cannot be continued ({problem}); dropped, it is generated from the start",
            file=sys.stderr,
            flush=True,
        )
        return []

    def keep_unfinished(self, resumed: dict[str, list[int]]) -> None:
        """On an interrupt: store each unfinished generation's tokens so far as its partial record
        (``resumed``: the saved tokens each generation of this submission started from).

        Only token ids are stored (no detokenising: SLURM leaves 120 s); the store's close, which
        runs next, makes them durable.
        """
        kept = tokens = 0
        for item, ids in self.backend.unfinished():
            if (
                item.key not in resumed
                or item.key in self.store
                or not (len(resumed[item.key]) < len(ids) < item.max_tokens)
            ):
                continue
            pkey = partial_key(item.key)
            self.store.drop(pkey)  # an earlier partial of it: this one goes further
            self.store.put(
                pkey,
                {
                    "partial_of": item.key,
                    "id": item.example.id,
                    "model": self.key,
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
                f"[procexec infer {self.key}] interrupted: kept {kept} unfinished generation(s) "
                f"({tokens} tokens) as partial records; the next run continues them",
                file=sys.stderr,
                flush=True,
            )

    # ------------------------------------------------------------------ running

    def generate(self, items: list[Planned], phase: str) -> None:
        """Run ``items`` in one submission; each result is in the store as soon as it finishes, and an attempt 1
        that the truncation rule reruns has its attempt 2 queued at once (unless ``attempt_barrier``)."""
        if not items:
            return
        log = ProgressLog(
            f"{self.key} {self.writer}",
            phase,
            len(items),
            interval=self.progress_interval or 0,
            quiet=self.progress_interval is None,
        )
        resumed: dict[str, list[int]] = {}  # each generation's saved tokens (a partial record), by key
        request_of: dict[int, Request] = {}  # a completion's tag is its request's
        queued = {item.key for item in items}

        def request(item: Planned) -> Request:
            resumed[item.key] = self.resumed(item)
            request_of[id(item)] = Request(
                item,
                item.prompt,
                item.max_tokens - len(resumed[item.key]),
                [] if item.continued is None else item.continued.token_ids or [],
                self.guard(item.attempt),
                resumed[item.key],
            )
            return request_of[id(item)]

        requests = [request(item) for item in items]

        def finished(completion: Completion) -> list[Request]:
            item = completion.tag
            already = len(resumed[item.key])  # decoded by an interrupted run, before this one
            if already:
                completion.details["resumed_tokens"] = already

            def build() -> GenerationRecord:
                request = request_of[id(item)]
                self.backend.finish(request, completion)
                record = self.record(item, completion, request)
                log.add(
                    completion.num_generated_tokens - already, record.finish_reason == "length", bool(record.looping)
                )
                return record

            # Nothing invalid is stored: a record is checked as it is built, by the same checks
            # every reader applies.  Off the engine loop (the store's writer thread) when the backend's
            # finish asks for it; otherwise here and now, so a bad one stops the job before it reaches the store.
            # A truncated attempt 1 is built here: whether it is rerun is read from its text, now.
            rerun = self.chain_reruns and item.attempt == 1 and completion.finish_reason == "length"
            record = None
            if self.backend.finish_off_loop and not rerun:
                self.store.put(item.key, lambda: build().to_json())
            else:
                record = build()
                self.store.put(item.key, record.to_json())
            self._checked.add(item.key)
            self.generated += 1
            self.decoded_tokens += completion.num_generated_tokens - already
            if item.continued is not None and "num_cached_tokens" in completion.details:
                self.continuation_prefill += EngineStats(
                    continuation_prefill_tokens=len(request_of[id(item)].engine_ids()),
                    cached_prefill_tokens=completion.details["num_cached_tokens"],
                )
            second = None if record is None or not rerun else self.rerun_of(item, record)
            if second is None or second.key in self.store or second.key in queued:
                return []
            queued.add(second.key)
            log.add_to_total()
            return [request(second)]

        self.backend.start()  # outside the timed span: the decode rate counts no start-up, and no failed start
        started = time.monotonic()
        watchdog = Watchdog(self.settings.stall_timeout_s, self.backend.progress, f"models.{self.key}: the engine")
        with log, watchdog:
            try:
                self.backend.generate(requests, self.settings.sampling, finished)
            except KeyboardInterrupt as exc:
                self.keep_unfinished(resumed)  # a stall too: stopped as on SIGTERM, the next run resumes
                if isinstance(exc, EngineStalled):
                    raise ProcexecError(exc.message) from None
                raise
            finally:
                self.generate_s += time.monotonic() - started
            self.store.flush()  # every record built, off the loop too: the last progress line counts them all

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
            todo = [p for p in [*first, *second] if p.key not in self.store]
            self.generate(todo, "attempts 1-2" if self.chain_reruns else "attempt 1")
            if self.truncation_rerun != "off":
                second = [r for r in map(self.rerun_for, first) if r is not None]
                self.generate([p for p in second if p.key not in self.store], "attempt 2")
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

"""``procexec status``: how far the study is, per model, read while the workflow runs.

Everything comes from files the jobs write anyway, and nothing is decoded: the
stores' indexes (``results/generations/{model}/store/*.idx``: one entry per
durable generation, with its attempt, token count, finish reason and commit
time), Snakemake's benchmark files of finished shards (GPU-hours) and
each shard's engine statistics (``{store}/stats/``: tokens per second of
generating, speculative acceptance, preemptions, start-up seconds per engine
start, one engine's KV pool; ``procexec.generation.engine_stats``).

``--verify`` also reads every record the counts include (and every partial record) and holds it to the
verdict ``infer`` applies before it reuses or continues one (``procexec.generation.resumable``: the frame's
CRC, the record's checks, its budget, the model's vocabulary as ``check-model`` recorded it): each that the
next ``infer`` will drop is named in one warning line and not counted.  It reads every generated token, so
it is not the default (benchmarks/bench_status_verify.py measures it).

Each model's GPU-hours are projected to completion from what it has done so far:
the GPU-hours spent (finished shards' benchmark files, or, while shards run, the
span of each shard's commits: whichever is larger) over the share of the suite
done.  Shards stride over (length, dataset, index), so every shard's share mixes
short and long procedures alike and the share is a fair clock.  A model over its
budget (``cluster.model_gpu_hours_budgets``), or a study over
``cluster.gpu_hours_budget``, is flagged.
"""

from __future__ import annotations

import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from procexec.benchmark.suite import expand_suite
from procexec.config.model import Config
from procexec.errors import ProcexecError
from procexec.generation.engine_stats import EngineStats, model_stats
from procexec.generation.resumable import dropped_entries
from procexec.generation.store import latest_entries, study_segments
from procexec.io.formats import format_count
from procexec.io.job_benchmarks import gpu_hours_of
from procexec.io.jsonl import read_json

RATE_WINDOW_S = 1800.0  # the ETA extrapolates the last half hour of commits
#: Preemptions per generation above which status names the model (each recomputes a whole sequence's prefill)
PREEMPTION_SHARE = 0.05


@dataclass
class ModelStatus:
    model: str
    abbrev: str
    done: int  # attempt-1 generations in the store (capped at the total)
    total: int  # examples of the suite
    reruns_done: int  # attempt-2 generations
    truncated: int  # generations that stopped on the token limit
    looping: dict[int, int | None]  # attempt -> generations ending in a repetition loop (None: not recorded)
    tokens: int  # generated tokens, all attempts
    gpu_hours: float  # finished shards (Snakemake benchmark files), or the shards' commit spans
    rate_per_hour: float | None  # attempt-1 generations per hour over the last half hour
    eta_hours: float | None
    projected_gpu_hours: float | None  # at completion, from the share done (None: nothing done yet)
    budget: float | None  # cluster.model_gpu_hours_budgets.<model>
    tokens_per_s: float | None  # decoded per second of generating, one shard's engine (inference.engine_stats)
    spec_acceptance: float | None  # speculative decoding: accepted / drafted tokens (None: no speculation seen)
    spec_mean_length: float | None  # tokens per verification step: 1 + accepted / drafts
    preemptions: int  # requests the engines' schedulers preempted (recomputed later), every run of every shard
    starts: int  # engine starts recorded (one per shard run that generated)
    startup_s: float | None  # per start: launch to ready (None: no start recorded)
    load_s: float | None  # of which loading the model (None: not logged, as by the in-process engine)
    warmup_s: float | None  # of which profiling, KV allocation, compile and graph capture (None: not logged)
    kv_capacity_tokens: int | None  # one engine's KV pool as last measured (None: not measured)
    kv_sequences: float | None  # sequences of the model's max_model_len that pool holds
    dropped: int | None = None  # stored records the next infer drops (--verify; None: not verified)

    @property
    def preempting(self) -> bool:
        """The engines preempted more than ``PREEMPTION_SHARE`` of the generations: each preemption drops a
        sequence's KV and recomputes it, so admission is above what the KV pool holds (docs/cluster.md)."""
        return self.preemptions > PREEMPTION_SHARE * max(self.done + self.reruns_done, 1)

    @property
    def over_budget(self) -> bool:
        return (
            self.budget is not None and self.projected_gpu_hours is not None and self.projected_gpu_hours > self.budget
        )

    @property
    def share(self) -> float:
        return self.done / self.total if self.total else 1.0


def model_status(
    config: Config, key: str, results: Path, now: float | None = None, verify: bool = False
) -> ModelStatus:
    model = config.models[key]
    suite = config.suite
    total = len(expand_suite(suite)) * len(suite.lengths) * suite.examples_per_length
    store = results / "generations" / key / "store"
    segments = study_segments(store, warn=_not_counted) if store.is_dir() else []
    entries = latest_entries(segments, partials=verify, warn=_not_counted)
    dropped = None
    if verify:
        vocabulary = checked_vocabulary(results / "models" / key / "check.json")
        gone = dropped_entries(store, entries, vocabulary, _not_counted)
        entries, dropped = [e for e in entries if e.key not in gone and not e.partial], len(gone)
    first = [e for e in entries if e.attempt == 1]
    done = min(len(first), total)
    now = time.time() if now is None else now
    recent = [e.committed for e in first if e.committed is not None and e.committed >= now - RATE_WINDOW_S]
    rate = None
    if len(recent) >= 2:
        span = max(now - min(recent), 60.0)
        rate = len(recent) / span * 3600
    eta = None if rate is None else (total - done) / rate
    if done >= total:
        eta = 0.0
    looping = {}
    for attempt in (1, 2):
        flags = [e.looping for e in entries if e.attempt == attempt]
        known = [f for f in flags if f is not None]
        looping[attempt] = sum(known) if known or not flags else None
    gpus = max(model.gpus, 1)
    shards = model.shards  # the current shards' benchmark files: never a stale shard of another count
    benchmarks = [results / "benchmarks" / "infer" / key / f"{i}-of-{shards}.tsv" for i in range(1, shards + 1)]
    hours = max(gpu_hours_of([f for f in benchmarks if f.is_file()], model.gpus), _commit_hours(entries) * gpus)
    projected = hours / (done / total) if done and hours else None
    budget = (config.cluster.model_gpu_hours_budgets or {}).get(key)
    engine = model_stats(store, warn=_warn) or EngineStats()  # summed over shards: one engine's rate
    return ModelStatus(
        key,
        model.abbrev,
        done,
        total,
        sum(1 for e in entries if e.attempt == 2),
        sum(1 for e in entries if e.finish_reason == "length"),
        looping,
        sum(e.tokens for e in entries),
        hours,
        rate,
        eta,
        projected,
        budget,
        engine.tokens_per_s,
        engine.acceptance_rate,
        engine.mean_acceptance_length,
        engine.preemptions,
        engine.starts,
        engine.per_start(engine.startup_s),
        engine.per_start(engine.load_s) or None,
        engine.per_start(engine.warmup_s) or None,
        engine.kv_capacity_tokens or None,
        engine.sequences_at(model.max_model_len),
        dropped,
    )


def checked_vocabulary(check_file: Path) -> int | None:
    """The vocabulary ``check-model`` recorded for the model (None, with one warning, when it recorded
    none: its token ids are then not checked, as ``infer`` checks none without a tokenizer)."""
    try:
        vocabulary = read_json(check_file, what="model check").get("vocabulary")
    except ProcexecError:
        vocabulary = None
    if type(vocabulary) is int and vocabulary > 0:
        return vocabulary
    _warn(f"{check_file}: no vocabulary recorded (run check-model, the workflow's check_model); token ids not checked")
    return None


def _warn(problem: str) -> None:
    """A store's file that status leaves out, named on stderr (the table or JSON on stdout stays whole)."""
    print(f"procexec status: warning: {problem}", file=sys.stderr, flush=True)


def _not_counted(problem: str) -> None:
    _warn(f"{problem}; not counted")


def _commit_hours(entries: list) -> float:
    """Hours the shards have been committing: per writer (one shard job), first to last commit, summed (a frame
    recovered without its entry has no commit time: left out)."""
    spans: dict[str, tuple[float, float]] = {}
    for e in entries:
        if e.committed is None:
            continue
        first, last = spans.get(e.writer, (e.committed, e.committed))
        spans[e.writer] = (min(first, e.committed), max(last, e.committed))
    return sum(last - first for first, last in spans.values()) / 3600


def study_status(config: Config, results: Path, verify: bool = False) -> list[ModelStatus]:
    return [model_status(config, key, results, verify=verify) for key in config.generated_models]


def format_table(rows: list[ModelStatus], study_budget: float | None = None) -> str:
    lines = [
        f"{'model':<24} {'done':>15} {'%':>6} {'reruns':>7} {'truncated':>9} {'looping 1/2':>11} {'tokens':>10} "
        f"{'GPU-h':>8} {'projected':>10} {'per hour':>9} {'ETA':>8} {'tok/s':>7} {'spec acc':>8} {'preempt':>7} "
        f"{'start s (load/warm)':>19} {'KV seqs':>7}"
    ]
    for r in rows:
        eta = "-" if r.eta_hours is None else f"{r.eta_hours:.1f} h"
        rate = "-" if r.rate_per_hour is None else f"{r.rate_per_hour:,.0f}"
        projected = "-" if r.projected_gpu_hours is None else f"{r.projected_gpu_hours:,.0f}"
        speed = "-" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}"
        spec = "-" if r.spec_acceptance is None else f"{100 * r.spec_acceptance:.0f}% x{r.spec_mean_length:.2f}"
        lines.append(
            f"{r.model:<24} {f'{r.done:,}/{r.total:,}':>15} {100 * r.share:>5.1f}% {r.reruns_done:>7,} "
            f"{r.truncated:>9,} {_loops(r.looping):>11} {format_count(r.tokens):>10} {r.gpu_hours:>8.1f} "
            f"{projected:>10} {rate:>9} {eta:>8} {speed:>7} {spec:>8} {r.preemptions:>7,} {_startup(r):>19} "
            f"{'-' if r.kv_sequences is None else f'{r.kv_sequences:,.1f}':>7}"
        )
    lines.append(
        f"{'all models':<24} {f'{sum(r.done for r in rows):,}/{sum(r.total for r in rows):,}':>15}"
        f" GPU-hours so far: {sum(r.gpu_hours for r in rows):.1f}"
    )
    verified = [r.dropped for r in rows if r.dropped is not None]
    if verified:
        lines.append(f"verified every stored record: the next infer drops {sum(verified):,} (named above; not counted)")
    lines.extend(
        f"PREEMPTING {r.model}: {r.preemptions:,} preemption(s) in {r.done + r.reruns_done:,} generations "
        f"(more than {PREEMPTION_SHARE:.0%}): lower models.{r.model}.max_concurrency, or "
        f"--max-num-seqs in its serve_args, towards the KV pool's {_kv_room(r)}"
        for r in rows
        if r.preempting
    )
    lines.extend(budget_lines(rows, study_budget))
    return "\n".join(lines)


def _kv_room(r: ModelStatus) -> str:
    if r.kv_capacity_tokens is None or r.kv_sequences is None:
        return "room (not measured)"
    return f"{r.kv_capacity_tokens:,} tokens per engine ({r.kv_sequences:,.1f} sequences of max_model_len)"


def projected_total(rows: list[ModelStatus]) -> float | None:
    """The study's projected GPU-hours (None until every model has done something)."""
    hours = [r.projected_gpu_hours for r in rows if r.projected_gpu_hours is not None]
    return sum(hours) if len(hours) == len(rows) else None


def budget_lines(rows: list[ModelStatus], study_budget: float | None) -> list[str]:
    """One flag line per model over its budget, and one for the study against its own."""
    lines = [
        f"OVER BUDGET {r.model}: projected {r.projected_gpu_hours:,.1f} GPU-hours exceeds "
        f"cluster.model_gpu_hours_budgets.{r.model} {r.budget:,.1f}"
        for r in rows
        if r.over_budget
    ]
    total = projected_total(rows)
    if study_budget is not None and total is not None:
        verdict = "OVER BUDGET: projected" if total > study_budget else "projected"
        verb = "exceeds" if total > study_budget else "is within"
        lines.append(f"{verdict} {total:,.1f} GPU-hours {verb} cluster.gpu_hours_budget {study_budget:,.1f}")
    return lines


def _startup(r: ModelStatus) -> str:
    """Seconds per engine start, and of them loading / warm-up where the server's log said."""
    if r.startup_s is None:
        return "-"
    phases = "/".join("?" if s is None else f"{s:,.0f}" for s in (r.load_s, r.warmup_s))
    return f"{r.startup_s:,.0f}" + ("" if phases == "?/?" else f" ({phases})")


def _loops(looping: dict[int, int | None]) -> str:
    return "/".join("?" if n is None else f"{n:,}" for n in (looping[1], looping[2]))


def to_json(rows: list[ModelStatus]) -> list[dict[str, Any]]:
    return [{**asdict(r), "share": r.share, "over_budget": r.over_budget, "preempting": r.preempting} for r in rows]

"""What a smoke or pilot stored for one model, as the cost model reads it: tokens per example and length,
truncations, loops, the decode rate over its runs, the start-up and the speculative acceptance."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from procexec.cluster.cost.output import PROMPT_TOKENS, Work
from procexec.cluster.study_stages import SPECULATIVE_STORE
from procexec.errors import ProcexecError
from procexec.generation.engine_stats import EngineStats, model_stats, shard_stats
from procexec.generation.store import Store, entries_of, study_segments, writer_stage
from procexec.records import ends_looping
from procexec.scoring.guard import guard_stop
from procexec.scoring.loops import detect_loop

#: A silence this long between one shard's commits is a shard not running (resumed later), never decoding: a
#: running shard commits every ``inference.store_commit_seconds`` (10) once a record has finished, and a pilot
#: runs hundreds of requests at once.
RUN_GAP_S = 600.0


class MeasuredExample(NamedTuple):
    """The tokens one example decoded: attempt 1, its reruns, of those the reruns that end in a loop (the
    loop's tail), and its reruns as the repetition guard would have cut them (``procexec.scoring.guard``)."""

    first: int
    rerun: int
    tail: int = 0
    guarded: int = 0


@dataclass
class Measured:
    """One model's measured examples, per procedure length."""

    examples: dict[int, list[MeasuredExample]]
    truncated: int  # attempt-1 generations cut by max_new_tokens
    reruns: int
    looping: int  # generations (any attempt) looping, as status and the score rows count them
    generations: int
    tokens_per_s: float | None  # decode rate of one engine, from the store's commit times
    context: float  # token-weighted mean in-flight context of what was measured
    budgets: frozenset[int] = frozenset()  # attempt 1's requested max_tokens, as its records' sampling says
    # speculative decoding's tokens per step where drafts were counted, by what drafted (speculative_label)
    acceptance_lengths: Mapping[str, float] = field(default_factory=dict)
    startup_s: float | None = None  # seconds per engine start its shards recorded (None: no start recorded)
    #: (tokens, seconds) of each run the rate is measured over (``read_measured``): its spread is the rate's
    rate_runs: tuple[tuple[float, float], ...] = ()
    unrated: int = 0  # generations without a commit time (recovered from a segment): left out of the rate
    loop_reruns: int = 0  # examples whose rerun ends in a loop (its tail: to the context, unguarded)
    guard: Mapping[str, int] | None = None  # the guard the reruns were cut with post hoc (None: not asked)

    @property
    def n(self) -> int:
        return sum(len(v) for v in self.examples.values())


def read_measured(
    store_dir: Path,
    prompt_tokens: int = PROMPT_TOKENS,
    pilot_only: bool = False,
    guard: Mapping[str, int] | None = None,
) -> Measured | None:
    """What a smoke/pilot stored for one model (None when the store is absent or empty).

    Read: the pilot's segments once a pilot ran (its sample of every cell, each example with its reruns,
    decoded in seconds however much the full study has stored since); otherwise every segment.  The smoke's
    generations share the store but not the study's budgets: left out, by segment (``writer_stage``) and by
    ``provenance.stage`` (stores from before the stages had writers of their own).  ``pilot_only``: the
    pilot's segments or nothing (the workflow's DAG build, which must not decode a whole study's store).
    Tokens: a continuation's record counts its attempt's tokens too (``provenance.continued_tokens``),
    which are subtracted.  Rate: per writer (one shard job), its commits split into runs wherever
    ``RUN_GAP_S`` pass without one (a shard resumed hours or days later: the time between its runs is
    no decoding), and per run the tokens committed after its first commit over its first to last
    commit; the runs' sums divided.  Loops: a rerun whose record ends in a loop is its example's tail; with
    ``guard``, each rerun is also cut where that repetition guard would have stopped it (``guard_stop`` over
    the tokens it decoded itself), for the projection with the guard on.
    """
    if not store_dir.is_dir():
        return None
    store = Store(store_dir, "procexec-cost-reader")
    if store.load(warn=_refuse_damaged) == 0:
        return None
    per_example: dict[str, dict[int, dict[str, Any]]] = {}
    commits: dict[str, list[tuple[float, int]]] = {}
    pieces: list[tuple[float, float, float]] = []
    looping = generations = unrated = 0
    seen: set[str] = set()
    budgets: set[int] = set()
    segments = study_segments(store_dir)
    pilot = [seg for seg in segments if writer_stage(seg.stem) == "pilot"]
    for seg in pilot if pilot or pilot_only else segments:
        for entry in entries_of(seg):
            if entry.key in seen:
                continue
            seen.add(entry.key)
            record = store.get(entry.key)
            if record is None or (record.get("provenance") or {}).get("stage") == "smoke":
                continue
            generations += 1
            continued = int((record.get("provenance") or {}).get("continued_tokens") or 0)
            new = int(record.get("num_generated_tokens") or 0) - continued
            if entry.looping is None:  # a record made before records carried their loop verdict: judged now
                ends = ends_looping(
                    detect_loop(record.get("token_ids"), str(record.get("text") or "")), record["finish_reason"]
                )
            else:
                ends = bool(entry.looping)
            looping += ends
            stop = None
            if guard is not None and int(record["attempt"]) > 1 and record.get("token_ids"):
                stop = guard_stop(record["token_ids"][continued:], guard)
            per_example.setdefault(str(record["id"]), {})[int(record["attempt"])] = {
                "length": int(record["length"]),
                "new": new,
                "finish": record["finish_reason"],
                "looping": ends,
                "guarded": new if stop is None else min(new, stop),
            }
            if entry.committed is None:  # recovered from a segment without its entry: no time to rate it by
                unrated += 1
            else:
                commits.setdefault(entry.writer, []).append((entry.committed, new))
            sampling = (record.get("provenance") or {}).get("sampling") or {}
            if int(record["attempt"]) == 1 and "max_tokens" in sampling:
                budgets.add(int(sampling.get("max_tokens_requested", sampling["max_tokens"])))
            pieces.append((1.0, float(new), float((record.get("prompt_tokens") or prompt_tokens) + continued)))
    examples: dict[int, list[MeasuredExample]] = {}
    truncated = reruns = loop_reruns = 0
    for attempts in per_example.values():
        if 1 not in attempts:
            continue
        first = attempts[1]
        later = [a for k, a in attempts.items() if k > 1]
        rerun = sum(a["new"] for a in later)
        tail = sum(a["new"] for a in later if a["looping"])
        truncated += first["finish"] == "length"
        reruns += bool(later)
        loop_reruns += tail > 0
        example = MeasuredExample(first["new"], rerun, tail, sum(a["guarded"] for a in later))
        examples.setdefault(first["length"], []).append(example)
    runs = []  # (tokens, seconds) of each run that committed over a span
    for run in (run for items in commits.values() for run in _runs(sorted(items))):
        start, end = run[0][0], run[-1][0]
        if end > start:
            runs.append((float(sum(n for t, n in run if t > start)), end - start))
    tokens, span = sum(n for n, _ in runs), sum(seconds for _, seconds in runs)
    return Measured(
        examples,
        truncated,
        reruns,
        looping,
        generations,
        tokens / span if span > 0 else None,
        Work.of(pieces).context,
        frozenset(budgets),
        measured_acceptance(store_dir),
        measured_startup(store_dir),
        rate_runs=tuple(runs),
        unrated=unrated,
        loop_reruns=loop_reruns,
        guard=guard,
    )


def measured_startup(store_dir: Path) -> float | None:
    """Seconds from launch to ready per engine start, as the model's shards recorded them
    (``procexec.generation.engine_stats``: every study stage's, the smoke's too: a start does not depend on the
    budgets); None where no start was recorded."""
    stats = model_stats(store_dir, warn=_refuse_damaged)
    return None if stats is None else stats.per_start(stats.startup_s)


def measured_acceptance(store_dir: Path) -> dict[str, float]:
    """The mean acceptance length of the drafts counted beside a model's store, by what drafted
    (``speculative_label``; "": a file from before it was recorded): its own shards' (a model that speculates)
    and the pilot's speculative half's (``pilot_speculative``: ``speculative-store`` beside it).  An
    acceptance says nothing of another method or depth: ``parallel_layout`` takes the model's own only."""
    drafted: dict[str, EngineStats] = {}
    for folder in (store_dir, store_dir.parent / SPECULATIVE_STORE):
        for _, stats in shard_stats(folder, warn=_refuse_damaged):
            if stats.drafts:
                drafted[stats.speculative] = drafted.get(stats.speculative, EngineStats()) + stats
    return {label: stats.mean_acceptance_length for label, stats in drafted.items() if stats.mean_acceptance_length}


def _runs(commits: list[tuple[float, int]]) -> list[list[tuple[float, int]]]:
    """One writer's (commit time, tokens), in time order, split where ``RUN_GAP_S`` pass without a commit."""
    runs = [commits[:1]]
    for before, item in zip(commits, commits[1:]):
        if item[0] - before[0] > RUN_GAP_S:
            runs.append([])
        runs[-1].append(item)
    return runs


def _refuse_damaged(problem: str) -> None:
    """A measurement is taken from a whole store: data a job would skip and make again is refused here."""
    raise ProcexecError(
        f"{problem}: a measurement needs the store whole (run the study stage again to repair it, "
        "or move the damaged files away)"
    )


def measured_tokens(examples: dict[int, list[MeasuredExample]], lengths: list[int]) -> list[list[float]]:
    """Per field of ``MeasuredExample`` (attempt 1, reruns, tails, guarded reruns), per configured length, the
    mean tokens of one example.

    Lengths without a measured example are interpolated linearly between measured ones (held
    constant beyond them).
    """
    measured = sorted(examples)
    means = [[sum(e[i] for e in examples[L]) / len(examples[L]) for L in measured] for i in range(4)]
    return [[float(np.interp(L, measured, column)) for L in lengths] for column in means]

"""A shard submitted longest procedures first against shortest first: its wall time and the tail it ends on.

Usage::

    python benchmarks/bench_shard_order.py [--work-dir /tmp/procexec-bench] [--model smollm2|tiny]
        [--lengths 5 95] [--examples-per-length 3] [--max-new-tokens 384] [--max-num-seqs 8]
        [--kv-cache-mib 64] [--max-context 0] [--repeats 1]

One shard (four datasets x the lengths x the examples per length) runs through
``procexec.generation.job.Job`` on the in-process CPU engine, the truncation rule
``continue`` as a job runs it, alternately in the job's order (``submission_order``:
longest procedures first) and in the order before issue 37 (``shortest_first``: the
shard's (length, dataset, index) order), each on a fresh store and a fresh engine.
SmolLM2-135M-Instruct writes step-like traces whose length grows with the
procedure's (docs: engine notes), so the long procedures are the long generations,
as a reasoning model's are; the tiny Llama's are all alike (it loops to its budget).

Printed per run and as medians: the shard's wall time (``Job.run``, engine start
included), the time in the engine (``generate_s``), and the tail: how long the shard
ran with fewer than a quarter of ``--max-num-seqs`` generations left unfinished
(submitted, or queued as an attempt 2, and not yet finished: the sequences the engine
could still be running), measured from each completion's time; then whether the two
orders' records are identical (token ids, text, keys, provenance but timings), which
they must be: only the engine's queue changes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

from bench_attempt_barrier import comparable, settings_for, shard_arguments, shard_inputs  # as issue 31 measured
from procexec.generation import job as job_module
from procexec.generation.backends import create_backend
from procexec.generation.job import Job
from procexec.generation.job_settings import JobSettings
from procexec.generation.submission import Submission


class TimedSubmission(Submission):
    """A submission that notes, at each completion, the time and the generations left unfinished."""

    timeline: list[tuple[float, int]] = []  # (monotonic time, unfinished after this completion)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.unfinished = len(self.requests)
        TimedSubmission.timeline.append((time.monotonic(), self.unfinished))

    def finished(self, completion):
        queued = super().finished(completion)
        self.unfinished += len(queued) - 1
        TimedSubmission.timeline.append((time.monotonic(), self.unfinished))
        return queued


def tail_seconds(timeline: list[tuple[float, int]], quarter: float) -> float:
    """Seconds from the last moment the unfinished generations dropped below ``quarter`` to the end."""
    end = timeline[-1][0]
    below = end
    for at, left in reversed(timeline):
        if left >= quarter:
            break
        below = at
    return end - below


def settings_with_batch(args: argparse.Namespace) -> JobSettings:
    """``bench_attempt_barrier``'s settings (budgets, KV pool) with the engine's batch capped at ``--max-num-seqs``."""
    settings = settings_for(args)
    kwargs = {**settings.model.engine_kwargs, "max_num_seqs": args.max_num_seqs}
    return dataclasses.replace(settings, model=settings.model.model_copy(update={"engine_kwargs": kwargs}))


def run_once(settings: JobSettings, manifest: Path, examples: list, store: Path, shortest_first: bool) -> dict:
    """One shard, on a fresh store and engine: its times, its tail, its records."""
    shutil.rmtree(store, ignore_errors=True)
    TimedSubmission.timeline = []
    backend = create_backend(settings, manifest)
    job = Job(settings, examples, store, "1-of-1", backend, progress_interval=None, shortest_first=shortest_first)
    result = job.run()
    records = result.records
    return {
        "wall_s": result.wall_time_s,
        "generate_s": job.generate_s,
        "decoded": result.decoded_tokens,
        "generations": len(records),
        "tail_s": tail_seconds(TimedSubmission.timeline, settings.model.engine_kwargs["max_num_seqs"] / 4),
        "records": comparable(records),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shard_arguments(
        parser, model="smollm2", lengths=[5, 95], examples_per_length=3, max_new_tokens=384, kv_cache_mib=1024
    )
    parser.add_argument("--max-num-seqs", type=int, default=8, help="the engine's batch")
    args = parser.parse_args()
    settings = settings_with_batch(args)
    manifest, examples = shard_inputs(args, settings)
    job_module.Submission = TimedSubmission  # type: ignore[misc]  # the job's submissions, timed
    runs: dict[str, list[dict]] = {"longest first": [], "shortest first": []}
    for round_ in range(args.repeats):
        order = ("longest first", "shortest first") if round_ % 2 == 0 else ("shortest first", "longest first")
        for label in order:
            started = time.monotonic()
            run = run_once(settings, manifest, examples, args.work_dir / "store-order", label == "shortest first")
            runs[label].append(run)
            print(
                f"  round {round_ + 1} {label:14s}: shard {run['wall_s']:6.1f} s (engine {run['generate_s']:6.1f} s),"
                f" tail {run['tail_s']:6.1f} s, {run['decoded']} tokens decoded in {run['generations']} generations "
                f"[{time.monotonic() - started:.0f} s]",
                file=sys.stderr,
            )
    summary: dict[str, object] = {
        "model": settings.model_key,
        "examples": len(examples),
        "lengths": args.lengths,
        "max_new_tokens": args.max_new_tokens,
        "max_num_seqs": args.max_num_seqs,
        "kv_cache_mib": args.kv_cache_mib or "default",
        "max_context": settings.max_context,
        "omp_threads": os.environ.get("OMP_NUM_THREADS", "the job's cores"),
        "load_average": os.getloadavg(),
        "repeats": args.repeats,
    }
    for label, done in runs.items():
        summary[label] = {
            "shard_wall_s": round(statistics.median(r["wall_s"] for r in done), 2),
            "engine_s": round(statistics.median(r["generate_s"] for r in done), 2),
            "tail_s": round(statistics.median(r["tail_s"] for r in done), 2),
            "decoded_tokens": done[0]["decoded"],
        }
    first = runs["longest first"][0]["records"]
    summary["records_identical"] = all(r["records"] == first for done in runs.values() for r in done)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

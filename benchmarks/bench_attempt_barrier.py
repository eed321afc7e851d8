"""A shard's wall time with and without the barrier between attempts, and its continuations' cached prefill.

Usage::

    python benchmarks/bench_attempt_barrier.py [--work-dir /tmp/procexec-bench] [--model tiny|smollm2]
        [--lengths 5 15] [--examples-per-length 4] [--max-new-tokens 64] [--kv-cache-mib 4] [--max-context 1024]
        [--repeats 1]

One shard of four datasets runs through ``procexec.generation.job.Job`` on the
in-process CPU engine (the truncation rule ``continue``, prefix caching on, as a
job runs), alternately with ``attempt_barrier`` (attempt 2 after all of attempt 1,
the order before issue 31) and without (each attempt 2 queued as its attempt 1
finishes), each on a fresh store and a fresh engine.  The tiny Llama loops, so
most attempts 1 end truncated and get a continuation; a small attempt-1 budget
does the same for SmolLM2.  ``--kv-cache-mib`` caps the engine's KV pool, as a
GPU's fills with a shard's long sequences: the prefix cache then keeps only
recent blocks, which a continuation queued at once still finds and one queued
after the whole of attempt 1 mostly does not.

Printed per run and as medians: the shard's wall time (``Job.run``, engine start
included), the time in the engine (``generate_s``), and over the continuations
the prefill tokens their prefix (prompt + attempt 1) has and how many of them
vLLM served from the prefix cache (``RequestOutput.num_cached_tokens``); then
whether the two orders' records are identical (token ids, text, keys,
provenance but timings and cache figures), which they must be.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import yaml

from bench_inference import DATASETS, TINY  # the four datasets and the tiny Llama bench_inference runs
from procexec.benchmark.suite import DatasetSpec, generate_dataset
from procexec.config import prepare
from procexec.generation.backends import create_backend
from procexec.generation.job import Job
from procexec.generation.job_settings import JobSettings
from procexec.preparation.prepare import prepare_model

ROOT = Path(__file__).resolve().parents[1]
MODELS = {"tiny": "tiny", "smollm2": "smollm2-135m-instruct"}
#: Provenance that differs between two runs of the same generations: timings, and what the prefix cache served.
RUN_FACTS = ("wall_time_s", "created_utc", "engine_load_s", "num_cached_tokens")


def settings_for(args: argparse.Namespace) -> JobSettings:
    """The model's job settings: the shipped config's inference section, attempt 1's budget and the KV cap."""
    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    raw["models"]["tiny"] = TINY
    key = MODELS[args.model]
    entry = raw["models"][key]
    if args.max_context:
        entry.update(max_context=args.max_context, max_model_len=args.max_context)
    if args.kv_cache_mib:
        entry["engine_kwargs"] = {**entry.get("engine_kwargs", {}), "kv_cache_memory_bytes": args.kv_cache_mib << 20}
    raw["inference"].update(max_new_tokens=args.max_new_tokens, truncation_rerun="continue")
    raw["run_models"] = [key]
    return JobSettings.from_config(prepare(raw), key)


def run_once(settings: JobSettings, manifest: Path, examples: list, store: Path, barrier: bool) -> dict:
    """One shard, on a fresh store and engine: its times, its continuations' prefill, its records."""
    shutil.rmtree(store, ignore_errors=True)
    backend = create_backend(settings, manifest)
    job = Job(settings, examples, store, "1-of-1", backend, progress_interval=None, attempt_barrier=barrier)
    result = job.run()
    records = result.records
    seconds = [r for r in records if r.attempt == 2]
    return {
        "wall_s": result.wall_time_s,
        "generate_s": job.generate_s,
        "decoded": result.decoded_tokens,
        "continuations": len(seconds),
        "prefix_tokens": sum(r.prompt_tokens + r.provenance["continued_tokens"] for r in seconds),
        "cached_tokens": sum(r.provenance["num_cached_tokens"] for r in seconds),
        "records": comparable(records),
    }


def comparable(records: list) -> list[dict]:
    """Records as two runs of the same generations must agree on them: without the run's own facts."""
    return [
        {**r.to_json(), "provenance": {k: v for k, v in r.provenance.items() if k not in RUN_FACTS}} for r in records
    ]


def shard_arguments(parser: argparse.ArgumentParser, **defaults: object) -> None:
    """The options of a one-shard benchmark (``defaults``: model, lengths, examples_per_length, max_new_tokens,
    kv_cache_mib)."""
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/procexec-bench"))
    parser.add_argument("--model", choices=sorted(MODELS), default=defaults["model"])
    parser.add_argument("--lengths", type=int, nargs="+", default=defaults["lengths"])
    parser.add_argument("--examples-per-length", type=int, default=defaults["examples_per_length"])
    parser.add_argument("--max-new-tokens", type=int, default=defaults["max_new_tokens"], help="attempt 1's budget")
    parser.add_argument(
        "--kv-cache-mib", type=int, default=defaults["kv_cache_mib"], help="the engine's KV pool (0: the CPU default)"
    )
    parser.add_argument("--max-context", type=int, default=0, help="attempt 2's context (0: the model entry's)")
    parser.add_argument("--repeats", type=int, default=1)


def shard_inputs(args: argparse.Namespace, settings: JobSettings) -> tuple[Path, list]:
    """The model's manifest (prepared once under ``--work-dir``) and the shard's examples."""
    manifest = args.work_dir / "models" / settings.model_key / "manifest.json"
    if not manifest.exists():
        prepare_model(settings.model, manifest)
    examples = [
        e
        for d in DATASETS
        for e in generate_dataset(DatasetSpec.from_id(d), tuple(args.lengths), args.examples_per_length, seed=1)
    ]
    return manifest, examples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    shard_arguments(parser, model="tiny", lengths=[5, 15], examples_per_length=4, max_new_tokens=64, kv_cache_mib=0)
    args = parser.parse_args()
    settings = settings_for(args)
    manifest, examples = shard_inputs(args, settings)
    runs: dict[str, list[dict]] = {"barrier": [], "no barrier": []}
    for round_ in range(args.repeats):
        order = ("barrier", "no barrier") if round_ % 2 == 0 else ("no barrier", "barrier")
        for label in order:
            started = time.monotonic()
            run = run_once(settings, manifest, examples, args.work_dir / "store-barrier", label == "barrier")
            runs[label].append(run)
            print(
                f"  round {round_ + 1} {label:10s}: shard {run['wall_s']:6.1f} s (engine {run['generate_s']:6.1f} s), "
                f"{run['decoded']} tokens decoded, {run['continuations']} continuations: "
                f"{run['cached_tokens']} of {run['prefix_tokens']} prefix tokens from the prefix cache "
                f"[{time.monotonic() - started:.0f} s]",
                file=sys.stderr,
            )
    summary: dict[str, object] = {
        "model": settings.model_key,
        "examples": len(examples),
        "max_new_tokens": args.max_new_tokens,
        "kv_cache_mib": args.kv_cache_mib or "default",
        "max_context": settings.max_context,
        "omp_threads": os.environ.get("OMP_NUM_THREADS", "the job's cores"),
        "repeats": args.repeats,
    }
    for label, done in runs.items():
        summary[label] = {
            "shard_wall_s": round(statistics.median(r["wall_s"] for r in done), 2),
            "engine_s": round(statistics.median(r["generate_s"] for r in done), 2),
            "continuations": done[0]["continuations"],
            "prefix_tokens": done[0]["prefix_tokens"],
            "cached_prefill_tokens": done[0]["cached_tokens"],
        }
    first = runs["barrier"][0]["records"]
    summary["wall_ratio_no_barrier_vs_barrier"] = round(
        summary["no barrier"]["shard_wall_s"] / summary["barrier"]["shard_wall_s"],
        3,  # type: ignore[index]
    )
    summary["records_identical"] = all(r["records"] == first for done in runs.values() for r in done)
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()

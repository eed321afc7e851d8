"""Benchmark: score the whole suite (55 datasets x 1,000 examples) of ~8 KB simulated generations.

Setup (not timed, cached under --work-dir): examples, references and SIMULATED
generations (procexec.scoring.simulator; not a model) for every dataset of config.yaml.
Timed: ``score_file`` on every dataset in a process pool (as ``procexec score``
does per file, including gzip + JSON decoding and the parquet write), then
``aggregate`` with 1,000 bootstrap resamples.  Prints wall time and peak RSS.

    /work/venv/bin/python benchmarks/bench_scoring.py [--processes 2] [--examples-per-length 100]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from procexec import config as config_module
from procexec.analysis.aggregate import aggregate
from procexec.benchmark.executor import execute
from procexec.benchmark.suite import DatasetSpec, expand_suite, generate_dataset
from procexec.io.jsonl import write_jsonl
from procexec.io.parquet import write_parquet
from procexec.scoring.files import score_file
from procexec.scoring.simulator import simulate

ROOT = Path(__file__).resolve().parents[1]


def _prepare(job: tuple[str, Path, list[int], int, int]) -> int:
    dataset, work, lengths, per_length, seed = job
    gens = work / "generations" / f"{dataset}.jsonl.gz"
    if gens.exists():
        return 0
    examples = generate_dataset(
        DatasetSpec.from_id(dataset), lengths=lengths, examples_per_length=per_length, seed=seed
    )
    refs = [execute(e) for e in examples]
    write_jsonl(work / "datasets" / f"{dataset}.jsonl", (e.to_json() for e in examples))
    write_jsonl(work / "references" / f"{dataset}.jsonl", (r.to_json() for r in refs))
    tmp = gens.with_suffix(".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=1) as handle:
        for e, r in zip(examples, refs):
            handle.write(json.dumps(simulate(e, r, seed=seed).to_json(), separators=(",", ":")) + "\n")
    os.replace(tmp, gens)
    return len(examples)


def _score(job: tuple[str, Path]) -> int:
    dataset, work = job
    table = score_file(
        work / "generations" / f"{dataset}.jsonl.gz",
        work / "references" / f"{dataset}.jsonl",
        work / "datasets" / f"{dataset}.jsonl",
    )
    write_parquet(table, work / "scores" / f"{dataset}.parquet")
    return table.num_rows


def _cpu_s(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _rss_mb(who: int) -> float:
    return resource.getrusage(who).ru_maxrss / 1024  # Linux: KiB


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(ROOT / "config.yaml"))
    parser.add_argument("--examples-per-length", type=int, help="default: the config's (100)")
    parser.add_argument("--processes", type=int, default=os.cpu_count())
    parser.add_argument("--work-dir", default="/tmp/procexec-bench-scoring")
    parser.add_argument("--resamples", type=int, default=1000)
    args = parser.parse_args()

    suite = config_module.load(args.config).suite
    datasets = [spec.id for spec in expand_suite(suite)]
    per_length = args.examples_per_length or suite.examples_per_length
    work = Path(args.work_dir) / f"n{per_length}"
    for sub in ("datasets", "references", "generations", "scores"):
        (work / sub).mkdir(parents=True, exist_ok=True)

    started = time.perf_counter()
    with Pool(args.processes) as pool:
        made = sum(pool.imap_unordered(_prepare, [(d, work, suite.lengths, per_length, suite.seed) for d in datasets]))
    print(f"setup: {made} generations simulated in {time.perf_counter() - started:.1f} s (cached in {work})")
    size = sum(p.stat().st_size for p in (work / "generations").glob("*.jsonl.gz"))

    before = _cpu_s(resource.RUSAGE_CHILDREN)
    load = os.getloadavg()[0]
    started = time.perf_counter()
    with Pool(args.processes) as pool:
        rows = sum(pool.imap_unordered(_score, [(d, work) for d in datasets]))
    score_wall = time.perf_counter() - started
    score_cpu = _cpu_s(resource.RUSAGE_CHILDREN) - before
    children_rss = _rss_mb(resource.RUSAGE_CHILDREN)

    started = time.perf_counter()
    table = pa.concat_tables([pq.read_table(work / "scores" / f"{d}.parquet") for d in datasets])
    metrics = aggregate(table.to_pandas(), resamples=args.resamples, seed=0)
    aggregate_wall = time.perf_counter() - started

    print(f"datasets: {len(datasets)}, generations scored: {rows}, gzip input: {size / 1e6:.0f} MB")
    print(f"score: {score_wall:.1f} s wall with {args.processes} processes (load average {load:.1f} at start)")
    print(
        f"score: {score_cpu:.1f} s CPU in workers ({1000 * score_cpu / rows:.2f} ms/example; wall on idle cores ~ {score_cpu / args.processes:.1f} s)"
    )
    print(f"aggregate: {len(metrics)} metric rows, {args.resamples} resamples, {aggregate_wall:.1f} s wall")
    print(f"peak RSS: largest worker {children_rss:.0f} MB, main process {_rss_mb(resource.RUSAGE_SELF):.0f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Time generating + executing the full suite, and compare with the paper's Appendix A executor.

    python benchmarks/bench_suite.py [--config config.yaml] [--workers 2]

Prints wall time for generate+execute+write of every dataset (process pool,
one task per dataset), then times execution alone for the same examples with
our executor and with a faithful re-implementation of the paper's Appendix A
code, which uses ``eval`` -- allowed here only, to measure what we replace.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from procexec import config as config_module
from procexec.benchmark.executor import execute, format_trace, run_appendix_a
from procexec.benchmark.suite import expand_suite, generate_dataset
from procexec.io.jsonl import write_jsonl


def _one_dataset(job):
    spec, params, out_dir = job
    examples = generate_dataset(spec, params.lengths, params.examples_per_length, params.seed)
    write_jsonl(Path(out_dir) / "datasets" / f"{spec.id}.jsonl", (e.to_json() for e in examples))
    write_jsonl(Path(out_dir) / "references" / f"{spec.id}.jsonl", (execute(e).to_json() for e in examples))
    return len(examples)


# ---- The paper's Appendix A executor, verbatim in behaviour. EVAL: BENCHMARK ONLY. ----
def paper_exec_algo(prompt, inputs):
    lines = prompt.strip().split("\n")
    vars_dict = {}
    vars_dict["S1"] = inputs[0]
    vars_dict["S2"] = inputs[1]
    for line in lines:
        line = line.strip()
        if "=" not in line:
            continue
        try:
            expr_part = line.split(":")[-1].strip()
            left, right = expr_part.split("=")
            left = left.strip()
            right = right.strip()
            first_var = right.split()[0].strip()
            task = right.split()[1].strip()
            second_var = right.split()[2].strip()
            value = eval(f"vars_dict['{first_var}'] {task} vars_dict['{second_var}']")  # noqa: S307 -- benchmark only
            vars_dict[left] = value
        except Exception:
            pass
    return [str(v) for v in vars_dict.values()]


# ---------------------------------------------------------------------------------------


def _time_executors(examples):
    """Like for like: the trace as strings under Appendix A semantics, ours vs the paper's code.

    Also times our full reference record (both semantics, edge cases, record
    building), which does more than the paper's function.
    """
    timings = {}
    start = time.perf_counter()
    ours = [format_trace(run_appendix_a(e.procedure, e.x, e.y)[0]) for e in examples]
    timings["ours"] = time.perf_counter() - start
    start = time.perf_counter()
    paper = [paper_exec_algo(e.procedure, [e.x, e.y]) for e in examples]
    timings["paper"] = time.perf_counter() - start
    start = time.perf_counter()
    for e in examples:
        execute(e)
    timings["full"] = time.perf_counter() - start
    agree = sum(a == b for a, b in zip(ours, paper))
    return timings, agree


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(Path(__file__).resolve().parents[1] / "config.yaml"))
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--compare-fraction",
        type=int,
        default=5,
        help="compare executors on every Nth example (eval is slow); default %(default)s",
    )
    args = parser.parse_args()
    config = config_module.load(args.config)
    params = config.suite
    specs = expand_suite(params, subset=False)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        with ProcessPoolExecutor(args.workers) as pool:
            # Longest datasets (mul/mixed ints) first keeps both workers busy to the end.
            total = sum(pool.map(_one_dataset, [(s, params, tmp) for s in specs], chunksize=1))
        wall = time.perf_counter() - start
    print(
        f"full suite: {len(specs)} datasets, {total} examples generated + executed + written "
        f"in {wall:.2f} s wall with {args.workers} worker(s) ({total / wall:,.0f} examples/s)"
    )

    examples = [
        e
        for s in specs
        for e in generate_dataset(s, params.lengths, params.examples_per_length, params.seed)[:: args.compare_fraction]
    ]
    t, agree = _time_executors(examples)
    print(
        f"executor only, {len(examples)} examples, 1 process: Appendix A trace as strings: ours {t['ours']:.2f} s, "
        f"the paper's eval code {t['paper']:.2f} s -> ours is {t['paper'] / t['ours']:.1f}x faster; "
        f"traces identical on {agree}/{len(examples)}"
    )
    print(
        f"our full reference record (both semantics, edge cases): {t['full']:.2f} s "
        f"({t['paper'] / t['full']:.1f}x faster than the paper's code)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What ``procexec status --verify`` costs beside the index-only default: seconds per store, and per million
stored tokens, extrapolated to one model of the full study.

Usage::

    python benchmarks/bench_status_verify.py [--work-dir /tmp/procexec-bench-status] [--records 2000]
        [--tokens 3000] [--repeats 3]

A store of ``--records`` finished generations of ``--tokens`` tokens each (ids, per-token offsets and text,
as a job writes them) is written once through ``Store.put``; then ``model_status`` runs ``--repeats`` times
reading the index only and as many times with ``verify`` (every frame read, its CRC checked, decompressed,
decoded, its record checked, its ids held to the vocabulary).  Printed: the median wall and CPU seconds of
each, the verified tokens per CPU second, and what that rate gives for one model's store of the full study
(config.yaml's suite: datasets x lengths x examples_per_length generations of ``--tokens`` tokens).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import yaml

from procexec.benchmark.suite import expand_suite
from procexec.cluster.status import model_status
from procexec.config import prepare
from procexec.generation.store import Store

ROOT = Path(__file__).resolve().parents[1]
KEY = "qw-4"
VOCABULARY = 151_669  # Qwen3's tokenizer (len(tokenizer)); the ids drawn below stay inside it


def write_store(store: Path, records: int, tokens: int) -> None:
    rng = random.Random(0)
    writer = Store(store, "1-of-1", commit_records=256)
    writer.load()
    for n in range(records):
        ids = [rng.randrange(VOCABULARY) for _ in range(tokens)]
        writer.put(
            f"{n:064x}",
            {
                "id": f"add_int_1-10_k1:5:{n}",
                "model": KEY,
                "dataset": "add_int_1-10_k1",
                "length": 5,
                "index": n,
                "attempt": 1,
                "text": "x" * (4 * tokens),
                "num_generated_tokens": tokens,
                "finish_reason": "stop",
                "token_ids": ids,
                "token_offsets": list(range(0, 4 * tokens, 4)),
                "prompt_sha256": "0" * 64,
                "prompt_tokens": 300,
                "provenance": {"loop": None, "sampling": {"max_tokens": 32768}},
            },
        )
    writer.close()


def timed(run) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/procexec-bench-status"))
    parser.add_argument("--records", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    config = prepare(yaml.safe_load((ROOT / "config.yaml").read_text()))
    results = args.work_dir / f"{args.records}x{args.tokens}"
    store = results / "generations" / KEY / "store"
    if not store.is_dir():
        write_store(store, args.records, args.tokens)
    check = results / "models" / KEY / "check.json"
    check.parent.mkdir(parents=True, exist_ok=True)
    check.write_text(json.dumps({"model": KEY, "vocabulary": VOCABULARY}))
    size = sum(f.stat().st_size for f in store.iterdir() if f.is_file())

    figures = {}
    for verify in (False, True):
        runs = [timed(lambda v=verify: model_status(config, KEY, results, verify=v)) for _ in range(args.repeats)]
        figures[verify] = (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
    row = model_status(config, KEY, results, verify=True)
    assert row.done == args.records and row.dropped == 0, (row.done, row.dropped)

    stored = args.records * args.tokens
    rate = stored / figures[True][1]
    suite = config.suite
    full = len(expand_suite(suite)) * len(suite.lengths) * suite.examples_per_length
    print(f"store: {args.records:,} records x {args.tokens:,} tokens = {stored / 1e6:.1f}M tokens, {size / 1e6:.0f} MB")
    for verify, (wall, cpu) in figures.items():
        print(f"status{' --verify' if verify else ''}: {wall:.2f} s wall, {cpu:.2f} s CPU (median of {args.repeats})")
    print(f"--verify reads {rate / 1e6:.2f}M tokens per CPU second")
    print(
        f"one model of the full study ({full:,} generations x {args.tokens:,} tokens = "
        f"{full * args.tokens / 1e6:,.0f}M tokens): --verify ~{full * args.tokens / rate / 60:,.1f} CPU minutes"
    )


if __name__ == "__main__":
    main()

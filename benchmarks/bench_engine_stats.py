"""What vLLM's statistics cost the in-process engine: seconds per 1,000 generated tokens with them off and on.

Usage::

    python benchmarks/bench_engine_stats.py [--work-dir /tmp/procexec-bench] [--repeats 5] [--prompts 64]

The job builds ``vllm.LLM`` with ``disable_log_stats=False``: only then does vLLM count preemptions and
speculative drafts (``LLM.get_metrics``), which each shard's statistics keep.  The price is the frontend's
per-token bookkeeping (iteration statistics, Prometheus histograms).  Here the tiny Llama (bench_inference's)
runs on vLLM's CPU engine with the CPU settings, in one process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the
frontend's work is paid in full; on a GPU it runs beside the engine core's own process.  Two engines, one per
setting, take the same prompts (``ignore_eos``: every round the same tokens), alternated over ``--repeats``
rounds after a warm-up; per setting the median round's process CPU seconds and wall seconds per 1,000
tokens, and on / off.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import yaml

from bench_inference import TINY  # the test suite's tiny Llama, with room for longer traces
from procexec.config import prepare
from procexec.engine.arguments import engine_settings, prepare_device
from procexec.preparation.prepare import prepare_model

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/procexec-bench"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=400)
    args = parser.parse_args()

    raw = yaml.safe_load((ROOT / "config.yaml").read_text())
    raw["models"]["tiny"] = TINY
    model = prepare(raw).models["tiny"]
    manifest = args.work_dir / "models" / "tiny" / "manifest.json"
    if not manifest.exists():
        prepare_model(model, manifest)
    settings = engine_settings(model, prepare_device(), str(manifest.parent / "hf"))

    import vllm

    prompts = [{"prompt_token_ids": [3 + (i * 7 + j) % 400 for j in range(32)]} for i in range(args.prompts)]
    params = vllm.SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    engines = {on: vllm.LLM(**settings, disable_log_stats=not on) for on in (False, True)}
    for llm in engines.values():
        llm.generate(prompts[:2], params, use_tqdm=False)
    rounds: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    tokens = len(prompts) * args.max_tokens
    for _ in range(args.repeats):
        for on, llm in engines.items():
            cpu, wall = time.process_time(), time.monotonic()
            outs = llm.generate(prompts, params, use_tqdm=False)
            assert sum(len(o.outputs[0].token_ids) for o in outs) == tokens
            rounds[on].append((1000 * (time.process_time() - cpu) / tokens, 1000 * (time.monotonic() - wall) / tokens))
    cpu = {on: statistics.median(c for c, _ in r) for on, r in rounds.items()}
    wall = {on: statistics.median(w for _, w in r) for on, r in rounds.items()}
    print(
        json.dumps(
            {
                "tokens_per_round": tokens,
                "repeats": args.repeats,
                "cpu_s_per_1k_tokens": {"stats_off": round(cpu[False], 4), "stats_on": round(cpu[True], 4)},
                "wall_s_per_1k_tokens": {"stats_off": round(wall[False], 4), "stats_on": round(wall[True], 4)},
                "cpu_on_over_off": round(cpu[True] / cpu[False], 3),
                "wall_on_over_off": round(wall[True] / wall[False], 3),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

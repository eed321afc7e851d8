#!/usr/bin/env python3
"""What vLLM's repetition guard costs the engine per step, by ``max_pattern_size``.

    python benchmarks/bench_repetition_guard.py [--requests 128] [--output-tokens 8192]

vLLM 0.32 checks every running request that carries ``repetition_detection``
after every step it decodes (``vllm/v1/core/sched/utils.py``: ``check_stop`` ->
``check_sequence_repetition``), in pure Python on the engine core's thread: one
pass per pattern length from ``min_pattern_size`` to ``max_pattern_size``, each
ending at its first mismatch on a tail that does not repeat (the common case:
a rerun still reasoning; a tail that repeats stops the request).  So the cost
per request per step grows linearly with ``max_pattern_size`` (once a request
has decoded ``max_pattern_size x min_count`` tokens) and is paid for every
running guarded request.  This prints microseconds per check and milliseconds
per engine step with ``--requests`` guarded requests running (the server models
admit 64-128 per engine; a decode step on the GPU takes tens of milliseconds).  Why ``inference.rerun_repetition_guard.max_pattern_size``
is bounded (docs/generation.md).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any


def per_check_us(check: Callable[[list[int], Any], bool], params: Any, tail: list[int], repeat: int) -> float:
    started = time.perf_counter()
    for _ in range(repeat):
        check(tail, params)
    return 1e6 * (time.perf_counter() - started) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=128, help="guarded requests running per engine")
    parser.add_argument("--output-tokens", type=int, default=8192, help="tokens each has decoded so far")
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    from vllm.sampling_params import RepetitionDetectionParams
    from vllm.v1.core.sched.utils import check_sequence_repetition

    rng = random.Random(0)
    fresh = [rng.randrange(100_000) for _ in range(args.output_tokens)]
    print(
        f"vLLM check_sequence_repetition, min_count 4, {args.output_tokens} tokens decoded; "
        f"ms per step = us per check x {args.requests} guarded requests"
    )
    print(f"{'max_pattern_size':>16} {'us/check':>10} {'ms/step':>9}")
    for size in (16, 64, 128, 256, 512, 1024, 4096):
        params = RepetitionDetectionParams(max_pattern_size=size, min_pattern_size=1, min_count=4)
        us = per_check_us(check_sequence_repetition, params, fresh, args.repeat)
        print(f"{size:>16} {us:>10.1f} {us * args.requests / 1000:>9.2f}")


if __name__ == "__main__":
    main()

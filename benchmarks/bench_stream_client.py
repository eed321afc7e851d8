#!/usr/bin/env python3
"""Client CPU seconds per 1,000 streamed tokens: ``replies.Stream`` reading a vLLM completions stream.

    python benchmarks/bench_stream_client.py [--tokens 32768] [--before f7bc2a4]

Feeds ``Stream`` the events a vLLM 0.32 server sends for one generation of
``--tokens`` tokens (``/v1/completions``, ``return_token_ids``: one event per
``stream_interval`` tokens, each with its text and token ids) and prints the
process CPU time per 1,000 tokens at growing lengths, for:

* before: ``replies.py`` as of ``--before`` (read from the git history), which
  copied the whole id list on every event (quadratic);
* after: the checkout's ``replies.py`` (ids accumulated in place), at a stream
  interval of 1 (vLLM's default) and of the job's server (``STREAM_INTERVAL``).

Linear cost shows as a per-1,000-token figure that does not grow with the length.
HTTP reading (httpx's ``iter_lines``) is not included: it is the same for both.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]
REPLIES = "src/procexec/generation/backends/replies.py"


def replies_at(commit: str) -> ModuleType:
    """``replies.py`` as it was at ``commit``, imported from a scratch copy."""
    source = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{commit}:{REPLIES}"], check=True, capture_output=True, text=True
    ).stdout
    path = Path(tempfile.mkdtemp(prefix="bench-stream-")) / f"replies_{commit}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(f"replies_{commit}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations through it
    spec.loader.exec_module(module)
    return module


def events(tokens: int, interval: int) -> list[str]:
    """The ``data:`` lines of one completions stream: ``tokens`` ids, ``interval`` per event, then usage and DONE."""
    lines = []
    for start in range(0, tokens, interval):
        ids = [(1000 + i) % 49152 for i in range(start, min(tokens, start + interval))]
        last = start + interval >= tokens
        choice = {
            "index": 0,
            "text": "ab" * len(ids),
            "logprobs": None,
            "token_ids": ids,
            "finish_reason": "length" if last else None,
            "stop_reason": None,
            "prompt_token_ids": None,
        }
        lines.append(
            "data: "
            + json.dumps(
                {
                    "id": "cmpl-bench",
                    "object": "text_completion",
                    "created": 0,
                    "model": "m",
                    "choices": [choice],
                    "usage": None,
                }
            )
        )
    lines.append(
        "data: "
        + json.dumps(
            {
                "id": "cmpl-bench",
                "object": "text_completion",
                "created": 0,
                "model": "m",
                "choices": [],
                "usage": {"prompt_tokens": 100, "completion_tokens": tokens},
            }
        )
    )
    lines.append("data: [DONE]")
    return lines


def cpu_seconds(replies: ModuleType, lines: list[str], tokens: int) -> float:
    """CPU time to read one stream and put its reply together (checked: every id arrived)."""
    stream = replies.Stream(chat=False, where="bench")
    started = time.process_time()
    for line in lines:
        stream.feed(line)
    reply = stream.reply()
    spent = time.process_time() - started
    if len(reply["choices"][0]["token_ids"]) != tokens:
        raise SystemExit(f"bench_stream_client: {tokens} ids streamed, {len(reply['choices'][0]['token_ids'])} read")
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=32768, help="the longest stream (default 32768)")
    parser.add_argument("--before", default="f7bc2a4", help="the commit whose replies.py copied the ids per event")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    from procexec.engine.server_launch import STREAM_INTERVAL
    from procexec.generation.backends import replies

    before = replies_at(args.before)
    lengths = [n for n in (4096, 8192, 16384, 32768, 65536) if n < args.tokens] + [args.tokens]
    runs = [
        ("before (one copy of the ids per event), interval 1", before, 1),
        ("after (in place), interval 1", replies, 1),
        (f"after (in place), interval {STREAM_INTERVAL} (the job's server)", replies, STREAM_INTERVAL),
    ]
    print(f"client CPU seconds per 1,000 streamed tokens (replies.Stream; before = {args.before}:{REPLIES})")
    print(f"{'':58}" + "".join(f"{n:>10,}" for n in lengths) + "   total s at " + f"{args.tokens:,}")
    for name, module, interval in runs:
        figures = [cpu_seconds(module, events(n, interval), n) for n in lengths]
        print(
            f"{name:58}" + "".join(f"{1000 * s / n:>10.4f}" for s, n in zip(figures, lengths)) + f"   {figures[-1]:.3f}"
        )


if __name__ == "__main__":
    main()

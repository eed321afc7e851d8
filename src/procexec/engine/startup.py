"""How a procexec process collects garbage while it starts: rarely.

Importing vLLM, torch and transformers allocates millions of objects, nearly all of them kept for the life of
the process.  CPython's default thresholds (700, 10, 10) run a young collection every 700 net allocations and
a full one every hundred of those; during ``from vllm import LLM`` these collections took 15-20 % of the CPU
(8.6-10 CPU s with the defaults, 7.2-7.9 with the thresholds below, on the two-core development machine).
Every ``procexec`` command and every process of a job's vLLM server (``procexec.engine.serve``, its spawned
API and engine processes too) starts this way.  Nothing here changes what is collected, only how often the
collector looks: cycles are freed a few thousand allocations later.  vLLM freezes its engine's heap after the
start (``gc.freeze``), as the in-process backend does before loading a model.
"""

from __future__ import annotations

import gc

#: A young collection every 50,000 net allocations, a full one only after 100 middle ones.
STARTUP_GC_THRESHOLDS = (50_000, 20, 100)


def collect_rarely() -> None:
    """Raise the collector's thresholds for this process (before it imports vLLM, torch or transformers)."""
    gc.set_threshold(*STARTUP_GC_THRESHOLDS)

"""Each shard's decode rate, speculative acceptance, preemptions and start-up, kept beside the store for
``procexec status`` and ``procexec cost --measured``.

A job adds what it decoded (tokens, seconds spent generating), how its engine
started (seconds from launch to ready; from a server's log, of which loading
weights and warming up) and, read from the engine's Prometheus metrics (a job
server's ``/metrics``; the in-process engine's ``LLM.get_metrics``): the
speculative decoding counters (``vllm:spec_decode_num_drafts``,
``..._draft_tokens``, ``..._accepted_tokens``; ``vllm/v1/spec_decode/metrics.py``,
0.32), the preemptions (``vllm:num_preemptions``: requests the scheduler took
out of the batch, their KV freed and recomputed later, when the pool could not
grow every running sequence; ``vllm/v1/metrics/loggers.py``) and one engine's
KV pool in tokens (``vllm:cache_config_info``'s ``kv_cache_size_tokens``, what
vLLM logs as "KV cache size: N tokens"), to ``{store}/stats/{writer}.json``.
A resumed shard adds to its file, so the figures cover every run of the shard
(the KV pool: the last measured).  The acceptance rate is accepted / drafted
tokens; the mean acceptance length, 1 + accepted / drafts, is the tokens one
weight-read step yields (``procexec cost``'s speculative gain).  The file says what
drafted (``speculative``: ``speculative_label`` of the run's ``speculative_config``),
since an acceptance measured with one method and depth says nothing of another.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from procexec.errors import ProcexecError
from procexec.io.files import atomic_write
from procexec.io.jsonl import read_json

#: vLLM's Prometheus counters (a server's text exposition adds ``_total``), by the field they add to.
COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:num_preemptions": "preemptions",
}
#: vLLM's info gauge of the KV cache settings, one label set per engine (``CacheConfig.metrics_info``, 0.32).
CACHE_INFO = "vllm:cache_config_info"
#: What vLLM 0.32 logs as an engine starts, by the phase (the slowest rank counts: ranks load at once).
#: Loading: ``gpu_model_runner.py``'s "Model loading took X GiB memory and S seconds" on a GPU, else the
#: weight loader's "Loading weights took S seconds" (``default_loader.py``, the only one on the CPU).
#: Warm-up: ``v1/engine/core.py``'s "init engine (profile, create kv cache, warmup model) took S s": memory
#: profiling, the KV pool, torch.compile and CUDA-graph capture (DeepGEMM's JIT warm-up included).
LOAD_LINES = (
    re.compile(r"Model loading took \S+ GiB memory and ([0-9.]+) seconds"),
    re.compile(r"Loading weights took ([0-9.]+) seconds"),
)
WARMUP_LINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
#: The fields that are seconds; every other is a whole count.
SECONDS = frozenset({"generate_s", "startup_s", "load_s", "warmup_s"})
#: The fields every statistics file has; those added later read as 0 (or "") from an older file.
FIRST_FIELDS = frozenset({"decoded_tokens", "generate_s", "drafts", "draft_tokens", "accepted_tokens"})
#: The speculative decoding counters: figures of one speculative configuration only.
DRAFT_COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")

_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")  # name{labels} value [timestamp]
_KV_TOKENS = re.compile(r'[{,]kv_cache_size_tokens="(\d+)"')


@dataclass
class EngineStats:
    decoded_tokens: int = 0
    generate_s: float = 0.0  # time spent in the engine's generate calls (loading excluded)
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    preemptions: int = 0  # times the scheduler took a running request out (its KV freed, recomputed later)
    starts: int = 0  # engines started (an in-process engine built, a job server up): one per run that generated
    startup_s: float = 0.0  # over those starts: launch to ready (the engine built; the server answering /health)
    load_s: float = 0.0  # of which loading the model, where vLLM's log says (a job server)
    warmup_s: float = 0.0  # of which profiling, KV allocation, compilation and graph capture (a job server)
    kv_capacity_tokens: int = 0  # one engine's KV pool, as last measured (0: never measured)
    # continuations whose engine says what its prefix cache served (in process): the tokens they were sent
    # before decoding (prompt + attempt 1), and how many of those vLLM's prefix cache served (num_cached_tokens)
    continuation_prefill_tokens: int = 0
    cached_prefill_tokens: int = 0
    # what drafted (speculative_label of the run's speculative_config; "": no speculation, or not recorded)
    speculative: str = ""

    def __add__(self, other: EngineStats) -> EngineStats:
        """Counts and seconds add up; the KV pool is the later figure (``other``'s, when it has one).  Drafts of
        two speculative configurations are not one acceptance: the later run's (``other``'s) are kept."""
        mixed = self.drafts and other.drafts and self.speculative != other.speculative
        added = {
            f.name: (0 if mixed and f.name in DRAFT_COUNTERS else getattr(self, f.name)) + getattr(other, f.name)
            for f in fields(self)
            if f.name not in ("speculative", "kv_capacity_tokens")
        }
        return EngineStats(
            **added,
            kv_capacity_tokens=other.kv_capacity_tokens or self.kv_capacity_tokens,
            speculative=other.speculative or self.speculative,
        )

    @property
    def tokens_per_s(self) -> float | None:
        return self.decoded_tokens / self.generate_s if self.generate_s > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted_tokens / self.drafts if self.drafts else None

    def per_start(self, seconds: float) -> float | None:
        """``seconds`` (startup_s, load_s or warmup_s) per engine start (None: no start recorded)."""
        return seconds / self.starts if self.starts else None

    def sequences_at(self, context: int) -> float | None:
        """Sequences of ``context`` tokens one engine's KV pool holds at once (None: the pool was not measured):
        what vLLM logs as "Maximum concurrency for N tokens per request"."""
        return self.kv_capacity_tokens / context if self.kv_capacity_tokens and context > 0 else None


def metric_totals(metrics_text: str, names: Iterable[str]) -> dict[str, float]:
    """The samples of ``names`` in a Prometheus text exposition, each summed over its label sets (0 if absent)."""
    totals = dict.fromkeys(names, 0.0)
    for line in metrics_text.splitlines():
        sample = _SAMPLE.match(line)
        if sample is None or sample.group(1) not in totals:
            continue
        try:
            value = float(sample.group(2))
        except ValueError:
            continue
        if math.isfinite(value):
            totals[sample.group(1)] += value
    return totals


def engine_counters(totals: Mapping[str, float]) -> EngineStats:
    """The fields ``COUNTERS`` fill, from vLLM's counter totals by name (absent: 0)."""
    counts: dict[str, Any] = {field: int(totals.get(name, 0)) for name, field in COUNTERS.items()}
    return EngineStats(**counts)


def server_counters(metrics_text: str) -> EngineStats:
    """The counters of a server's Prometheus text exposition, each summed over its engines."""
    totals = metric_totals(metrics_text, [f"{name}_total" for name in COUNTERS])
    return engine_counters({name.removesuffix("_total"): value for name, value in totals.items()})


def kv_capacity_tokens(metrics_text: str) -> int:
    """One engine's KV pool in tokens from a server's ``vllm:cache_config_info`` (the smallest over its
    data-parallel engines; 0 when not stated)."""
    sizes = [
        int(match.group(1))
        for line in metrics_text.splitlines()
        if line.startswith(CACHE_INFO + "{") and (match := _KV_TOKENS.search(line))
    ]
    return min(sizes, default=0)


def startup_phases(log_text: str) -> tuple[float, float]:
    """(loading, warm-up) seconds of an engine's start, from what vLLM logged (0 where it logged nothing)."""

    def longest(pattern: re.Pattern[str]) -> float:
        return max((float(m.group(1)) for m in pattern.finditer(log_text)), default=0.0)

    load = next((s for s in map(longest, LOAD_LINES) if s > 0), 0.0)
    return load, longest(WARMUP_LINE)


def startup_line(stats: EngineStats, max_model_len: int) -> str:
    """How an engine started, for the job's log: its start-up and, where measured, its KV pool in sequences of
    ``max_model_len`` (the ``max_num_seqs`` above which admitted sequences cannot all reach their full context)."""
    phases = ", ".join(f"{name} {s:.1f} s" for name, s in (("loading", stats.load_s), ("warm-up", stats.warmup_s)) if s)
    line = f"engine ready after {stats.startup_s:.1f} s" + (f" ({phases})" if phases else "")
    sequences = stats.sequences_at(max_model_len)
    if sequences is None:
        return line
    return (
        f"{line}; KV cache of one engine: {stats.kv_capacity_tokens:,} tokens = {sequences:.2f} sequences of "
        f"max_model_len {max_model_len:,}: a max_num_seqs above {max(int(sequences), 1):,} admits more than can "
        "all reach it (the scheduler then preempts and recomputes)"
    )


def speculative_label(speculative_config: Mapping[str, object] | None) -> str:
    """What drafts, as the statistics files record it: ``METHOD k=K`` ("" without speculative decoding)."""
    if not speculative_config:
        return ""
    return f"{speculative_config.get('method') or 'draft_model'} k={speculative_config.get('num_speculative_tokens')}"


def stats_path(store_dir: Path, writer: str) -> Path:
    return store_dir / "stats" / f"{writer}.json"


def read_stats(path: Path) -> EngineStats:
    """One shard's file (refused in one line when it is not one, or its figures cannot all be true)."""
    obj = read_json(path, what="shard's engine statistics")
    names = {f.name for f in fields(EngineStats)}
    if (
        not isinstance(obj, dict)
        or not FIRST_FIELDS <= set(obj) <= names
        or not isinstance(obj.get("speculative", ""), str)
        or not all(
            isinstance(value, (int, float))
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value >= 0
            and (n in SECONDS or float(value).is_integer())
            for n, value in obj.items()
            if n != "speculative"
        )
    ):
        raise ProcexecError(
            f"{path}: not a shard's engine statistics (the fields {', '.join(sorted(names))}, those since "
            f"{', '.join(sorted(names - FIRST_FIELDS))} optional, each a finite number >= 0, the counts whole, "
            "speculative a string)"
        )
    values: dict[str, Any] = {
        n: value if n in SECONDS or n == "speculative" else int(value) for n, value in obj.items()
    }
    stats = EngineStats(**values)
    problem = _inconsistency(stats)
    if problem:
        raise ProcexecError(f"{path}: impossible engine statistics ({problem})")
    return stats


def _inconsistency(stats: EngineStats) -> str | None:
    """What in a shard's figures cannot be (None: nothing): every rate they give must be a true one."""
    if stats.accepted_tokens > stats.draft_tokens:
        return f"accepted_tokens {stats.accepted_tokens} > draft_tokens {stats.draft_tokens}"
    if stats.drafts > stats.draft_tokens:
        return f"drafts {stats.drafts} > draft_tokens {stats.draft_tokens} (a draft proposes at least one token)"
    if stats.decoded_tokens and not (stats.generate_s > 0 and math.isfinite(stats.decoded_tokens / stats.generate_s)):
        return f"{stats.decoded_tokens} tokens decoded in {stats.generate_s} s"
    if not stats.starts and (stats.startup_s or stats.load_s or stats.warmup_s):
        return f"start-up seconds ({stats.startup_s}) without a start"
    if stats.cached_prefill_tokens > stats.continuation_prefill_tokens:
        return (
            f"cached_prefill_tokens {stats.cached_prefill_tokens} > continuation_prefill_tokens "
            f"{stats.continuation_prefill_tokens} (the cache serves part of a prefix at most)"
        )
    return None


def add_stats(store_dir: Path, writer: str, stats: EngineStats) -> None:
    """Add one run's figures to its shard's file (atomic; a file today's reader refuses is replaced)."""
    path = stats_path(store_dir, writer)
    try:
        total = read_stats(path) + stats if path.exists() else stats
    except ProcexecError:
        total = stats
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_write(path) as handle:
        handle.write(json.dumps(asdict(total), sort_keys=True) + "\n")


def shard_stats(store_dir: Path, warn: Callable[[str], None]) -> list[tuple[Path, EngineStats]]:
    """Each shard's file beside a store and its figures.  A file the reader refuses is left out and told to
    ``warn`` (its shard's next run replaces it)."""
    files = sorted((store_dir / "stats").glob("*.json")) if store_dir.is_dir() else []
    read = []
    for path in files:
        try:
            read.append((path, read_stats(path)))
        except ProcexecError as exc:
            warn(f"{exc}; left out of the engine figures")
    return read


def model_stats(store_dir: Path, warn: Callable[[str], None]) -> EngineStats | None:
    """Every shard's figures of one model, summed (None: no shard wrote any readable file)."""
    read = [stats for _, stats in shard_stats(store_dir, warn)]
    return sum(read, EngineStats()) if read else None

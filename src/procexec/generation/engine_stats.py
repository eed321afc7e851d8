"""Each shard's decode rate and speculative-decoding acceptance, kept beside the store for ``procexec status``.

A job adds what it decoded (tokens, seconds spent generating) and, from a vLLM
server it started, the speculative decoding counters of vLLM's Prometheus
``/metrics`` (``vllm:spec_decode_num_drafts``, ``..._draft_tokens``,
``..._accepted_tokens``; ``vllm/v1/spec_decode/metrics.py``, 0.32) to
``{store}/stats/{writer}.json``.  A resumed shard adds to its file, so the
figures cover every run of the shard.  The acceptance rate is accepted /
drafted tokens; the mean acceptance length, 1 + accepted / drafts, is the
tokens one weight-read step yields (``procexec cost``'s speculative gain).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from procexec.errors import ProcexecError
from procexec.io.files import atomic_write
from procexec.io.jsonl import read_json

#: vLLM's Prometheus counters read from a server, by the field they add to.
SPEC_COUNTERS = {
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted_tokens",
}


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(\S+)")  # name{labels} value [timestamp]


@dataclass
class EngineStats:
    decoded_tokens: int = 0
    generate_s: float = 0.0  # time spent in the engine's generate calls (loading excluded)
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0

    def __add__(self, other: EngineStats) -> EngineStats:
        return EngineStats(**{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)})

    @property
    def tokens_per_s(self) -> float | None:
        return self.decoded_tokens / self.generate_s if self.generate_s > 0 else None

    @property
    def acceptance_rate(self) -> float | None:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else None

    @property
    def mean_acceptance_length(self) -> float | None:
        return 1 + self.accepted_tokens / self.drafts if self.drafts else None


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


def spec_counters(metrics_text: str) -> EngineStats:
    """The speculative decoding counters of a Prometheus text exposition, summed over their label sets."""
    totals = metric_totals(metrics_text, SPEC_COUNTERS)
    return EngineStats(**{field: int(totals[name]) for name, field in SPEC_COUNTERS.items()})


def stats_path(store_dir: Path, writer: str) -> Path:
    return store_dir / "stats" / f"{writer}.json"


def read_stats(path: Path) -> EngineStats:
    """One shard's file (refused in one line when it is not one, or its figures cannot all be true)."""
    obj = read_json(path, what="shard's engine statistics")
    names = {f.name for f in fields(EngineStats)}
    if (
        not isinstance(obj, dict)
        or set(obj) != names
        or not all(
            isinstance(obj[n], (int, float))
            and not isinstance(obj[n], bool)
            and math.isfinite(obj[n])
            and obj[n] >= 0
            and (n == "generate_s" or float(obj[n]).is_integer())
            for n in names
        )
    ):
        raise ProcexecError(
            f"{path}: not a shard's engine statistics (the fields {', '.join(sorted(names))}, "
            "each a finite number >= 0, the counts whole)"
        )
    stats = EngineStats(**{n: obj[n] if n == "generate_s" else int(obj[n]) for n in names})
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


def model_stats(store_dir: Path, warn: Callable[[str], None]) -> EngineStats | None:
    """Every shard's figures of one model, summed (None: no shard wrote any readable file).

    A file the reader refuses is left out and told to ``warn`` (its shard's next run replaces it)."""
    files = sorted((store_dir / "stats").glob("*.json")) if store_dir.is_dir() else []
    read = []
    for path in files:
        try:
            read.append(read_stats(path))
        except ProcexecError as exc:
            warn(f"{exc}; left out of the decode rate and acceptance")
    return sum(read, EngineStats()) if read else None

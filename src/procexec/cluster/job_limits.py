"""What an inference job is allowed, from the study's projection and what the model's shards measured.

``procexec infer`` asks here (the cluster layer, where ``procexec cost``'s models live) and hands the answers to
the job's settings (``procexec.generation.job_settings.JobSettings``):

* the job server's start ceiling (``start_ceiling_s``): how long its start may take in all, whatever progress
  it shows.  The stall limit (``server_start_timeout_s``) stops a start that shows none; a hang that keeps
  something moving (docs/inference.md, "The job's own server") meets this.
"""

from __future__ import annotations

from pathlib import Path

from procexec.cluster.cost import load_architecture, startup_seconds
from procexec.config.model import Config, VllmServerModel
from procexec.generation.engine_stats import shard_stats

#: A start may take this many times the slowest start the model's shards recorded (else the stated one) ...
START_CEILING_FACTOR = 3.0
#: ... and never less than this: a model without a stated start (a CPU model's is 0) gets half an hour.
START_CEILING_FLOOR_S = 1800.0


def slowest_recorded_start(store: Path) -> float | None:
    """The longest seconds per start any shard of the store recorded (``{store}/stats/``: every stage's, the
    smoke's first, cold one too); None before any start was recorded.  Unreadable files are skipped silently
    (``procexec status`` names them)."""
    per_start = [s.startup_s / s.starts for _, s in shard_stats(store, lambda _: None) if s.starts]
    return max(per_start) if per_start else None


def start_ceiling_s(config: Config, key: str, store: Path) -> float | None:
    """The job server's start ceiling: the model's ``server_start_ceiling_s``; else ``START_CEILING_FACTOR``
    times the slowest start its shards recorded, or without one the start-up ``procexec cost`` states (the
    checkpoint read from the shared filesystem plus the stated warm-up), at least ``START_CEILING_FLOOR_S``.
    None for a model without a job server."""
    model = config.models[key]
    if not isinstance(model, VllmServerModel):
        return None
    if model.server_start_ceiling_s is not None:
        return float(model.server_start_ceiling_s)
    basis = slowest_recorded_start(store)
    if basis is None:
        basis = startup_seconds(model, load_architecture())
    return max(START_CEILING_FLOOR_S, START_CEILING_FACTOR * basis)

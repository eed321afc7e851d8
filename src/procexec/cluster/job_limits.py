"""What a generation job is allowed, from the study's projection and what the model's shards measured.

``procexec infer`` asks here (the cluster layer, where ``procexec cost``'s models live) and hands the answers to
the job's settings (``procexec.generation.job_settings.JobSettings``):

* the job server's start ceiling (``start_ceiling_s``): how long its start may take in all, whatever progress
  it shows.  The stall limit (``server_start_timeout_s``) stops a start that shows none; a hang that keeps
  something moving (docs/generation.md, "The job's own server") meets this;
* the context its admission is sized for (``admission_context``): the mean in-flight context of the study's
  generations, so that the requests a job server admits fit its engines' KV pools (docs/cluster.md,
  "Admission").
"""

from __future__ import annotations

from pathlib import Path

from procexec.benchmark.suite import expand_suite
from procexec.cluster.cost.catalog import load_architecture
from procexec.cluster.cost.measured import read_measured
from procexec.cluster.cost.projection import project_model
from procexec.cluster.cost.runtime import startup_seconds
from procexec.config.model import Config, VllmServerModel
from procexec.errors import ProcexecError
from procexec.generation.engine_stats import shard_stats

#: A start may take this many times the slowest start the model's shards recorded (else the stated one) ...
START_CEILING_FACTOR = 3.0
#: ... and never less than this: a model without a stated start (a CPU model's is 0) gets half an hour.
START_CEILING_FLOOR_S = 1800.0


def slowest_recorded_start(store: Path) -> float | None:
    """The longest seconds per start any shard of the store recorded (``{store}/stats/``: every study stage's, the
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


def admission_context(config: Config, key: str, store: Path) -> float | None:
    """The token-weighted mean context of the model's generations in flight (attempt 1 and the reruns together),
    as ``procexec cost`` projects it for ``config``'s stage: measured from the pilot's records once a pilot
    stored them (``read_measured``, the pilot's segments only), else the stated output model.  A job server admits
    the requests its engines' KV pools hold at this context.  None for a model without a job server."""
    if not isinstance(config.models[key], VllmServerModel):
        return None
    try:
        measured = read_measured(store, pilot_only=True)
    except ProcexecError:
        measured = None  # records of other budgets (the smoke's config against a pilot's store): the stated model
    projection = project_model(config, key, len(expand_suite(config.suite)), measured, resamples=0)
    tokens = projection.attempt1_tokens + projection.rerun_tokens
    if tokens <= 0:
        return None
    return (
        projection.attempt1_tokens * projection.context_attempt1 + projection.rerun_tokens * projection.context_rerun
    ) / tokens

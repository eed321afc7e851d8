"""A job's start-up and a shard's SLURM runtime, from the stated decode (the workflow's reader)."""

from __future__ import annotations

from procexec.cluster.cost.catalog import Catalog, load_architecture
from procexec.cluster.cost.output import PROMPT_TOKENS, stated_phases
from procexec.cluster.cost.throughput import deployment_of
from procexec.config.model import Inference, ModelBase


def shard_runtime_minutes(
    model: ModelBase,
    inference: Inference,
    lengths: list[int],
    examples_per_length: int,
    datasets: int,
    shards: int,
    cap: int,
    prompt_tokens: int = PROMPT_TOKENS,
    catalog: Catalog | None = None,
) -> int:
    """SLURM runtime of one shard: its share of the stated decode at the bandwidth model's rate.

    The same tokens, contexts, rate and start-up as ``procexec cost`` (attempt 1, the reruns and the loops'
    tails each at its own in-flight context, on the model's layout; ``startup_seconds``), through
    ``runtime_minutes`` (``cap``: the partition's limit; a shard the limit stops resumes on the next run).
    The loops' tails run to the context even where a repetition guard would cut them (the pilot runs without
    it): a runtime too long, never a shard cut short.
    """
    catalog = catalog or load_architecture()
    deployment = deployment_of(model, catalog)
    phases = stated_phases(model, inference, lengths, prompt_tokens)
    share = examples_per_length * datasets / shards
    decode = share * phases.seconds(deployment, catalog)
    return runtime_minutes(decode, startup_seconds(model, catalog), cap)


def runtime_minutes(decode_seconds: float, startup_s: float, cap: int) -> int:
    """A shard's SLURM runtime for ``decode_seconds`` of decoding after ``startup_s`` of start-up (the stated
    or measured ``startup_seconds``: DS-685's checkpoint alone reads for longer than a fixed allowance):
    1.5 x both, at least 30 minutes and at most ``cap``."""
    return int(min(cap, max(30, round(1.5 * (startup_s + decode_seconds) / 60))))


def startup_seconds(
    model: ModelBase,
    catalog: Catalog,
    measured: float | None = None,
    filesystem_bytes_per_s: float | None = None,
) -> float:
    """One job's start-up before it decodes: ``measured`` (a smoke's load and warm-up) when known, else the
    checkpoint read from the shared filesystem at ``filesystem_bytes_per_s`` (default: the middle of the stated
    range) plus the stated warm-up (architecture.yaml).  A CPU model's start-up is not GPU time: 0."""
    if measured is not None:
        return measured
    if model.gpus == 0:
        return 0.0
    hardware = catalog.hardware
    arch = catalog.models.get(model.abbrev)
    weights = arch.weight_bytes if arch is not None else float(model.checkpoint_gb or 0) * 1e9
    warmup = hardware.warmup_s if arch is None or arch.warmup_s is None else arch.warmup_s
    rate = filesystem_bytes_per_s or sum(hardware.filesystem_bytes_per_s) / 2
    return weights / rate + warmup

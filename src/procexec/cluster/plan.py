"""``procexec plan``: per model, its layout on the selected GPU, the KV room it leaves, and its GPU-hours.

The layouts are ``prepare``'s (``procexec.cluster.layouts``: planned from memory where a model entry leaves them
out, pinned where it states them); the sequences of KV room are the capacity model's (the same as ``check-model``
and ``cost``); the GPU-hours are ``procexec cost``'s stated projection on the same GPU, beside the paper-style
baseline on it (every model one tensor-parallel in-process engine over its GPUs, truncated generations
regenerated).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from procexec.benchmark.suite import expand_suite
from procexec.cluster.cost.catalog import catalog_for
from procexec.cluster.cost.projection import project_model
from procexec.cluster.cost.throughput import deployment_of, gpu_capacity
from procexec.cluster.layouts import Plan
from procexec.config.hardware import hardware_label, selected_gpu
from procexec.config.model import Config


@dataclass(frozen=True)
class PlanRow:
    """One model's plan on the GPU, with what its engines hold and what the study costs on it."""

    plan: Plan
    abbrev: str
    mean_context: float  # attempt 1's mean in-flight context (procexec cost's)
    sequences_at_mean: int | None  # per engine (None: a CPU model)
    gpu_hours: float
    gpu_hours_interval: tuple[float, float]
    paper_gpu_hours: float
    shards: int

    @property
    def engines(self) -> int:
        return self.plan.layout.dp

    def to_json(self) -> dict[str, Any]:
        return {
            **self.plan.to_json(),
            "abbrev": self.abbrev,
            "shards": self.shards,
            "mean_context": self.mean_context,
            "sequences_at_mean_context": self.sequences_at_mean,
            "sequences_at_mean_context_per_job": None
            if self.sequences_at_mean is None
            else self.sequences_at_mean * self.engines,
            "sequences_at_max_context_per_job": None
            if self.plan.sequences_at_max is None
            else self.plan.sequences_at_max * self.engines,
            "gpu_hours": self.gpu_hours,
            "gpu_hours_interval": list(self.gpu_hours_interval),
            "paper_gpu_hours": self.paper_gpu_hours,
            "paper_ratio": self.gpu_hours / self.paper_gpu_hours if self.paper_gpu_hours else None,
        }


def plan_rows(config: Config) -> list[PlanRow]:
    """Every generated run model's plan on ``config``'s GPU (``prepare`` resolved the layouts)."""
    catalog = catalog_for(config)
    n_datasets = len(expand_suite(config.suite))
    rows = []
    for key in config.generated_models:
        model = config.models[key]
        projection = project_model(config, key, n_datasets, catalog=catalog, resamples=1)
        deployment = deployment_of(model, catalog)
        at_mean = None
        if deployment.arch is not None:
            room = gpu_capacity(deployment.arch, catalog.hardware, deployment.layout)
            at_mean = math.floor(max(room.sequences(projection.context_attempt1), 0.0))
        rows.append(
            PlanRow(
                config.plans[key],
                model.abbrev,
                projection.context_attempt1,
                at_mean,
                projection.gpu_hours,
                projection.gpu_hours_interval,
                projection.paper_gpu_hours,
                model.shards,
            )
        )
    return rows


def plan_report(config: Config, rows: list[PlanRow]) -> dict[str, Any]:
    """``procexec plan --json``: the GPU (its numbers and their sources), each model's row, the totals."""
    gpu = selected_gpu(config.cluster)
    total = sum(r.gpu_hours for r in rows)
    paper = sum(r.paper_gpu_hours for r in rows)
    return {
        "hardware": hardware_label(config.cluster),
        "gpu": gpu.model_dump(),
        "models": [r.to_json() for r in rows],
        "gpu_hours": total,
        "gpu_hours_interval": [sum(r.gpu_hours_interval[i] for r in rows) for i in (0, 1)],
        "paper_gpu_hours": paper,
        "paper_ratio": total / paper if paper else None,
        "fits": all(r.plan.fits for r in rows),
        "runs": all(r.plan.runs for r in rows),
    }


def format_plan(config: Config, rows: list[PlanRow]) -> str:
    """The table ``procexec plan`` prints."""
    gpu = selected_gpu(config.cluster)
    name = hardware_label(config.cluster)
    width = max((len(r.plan.layout.describe()) for r in rows), default=6)
    lines = [
        f"{name}: {gpu.name}, {gpu.memory_gb:g} GB at {gpu.hbm_tb_per_s:g} TB/s, {gpu.gpus_per_node} per node "
        f"(procexec/data/hardware.yaml; layouts: procexec/data/layouts.yaml)",
        f"{'model':<8} {'layout':<{width}} {'nodes':>5} {'GPUs':>4} {'how':<7} {'ctx':>7} {'seq@ctx':>7} "
        f"{'seq@max':>7} {'GPU-h':>8} {'paper GPU-h':>11} {'ratio':>5}  fits",
    ]
    for r in rows:
        plan = r.plan
        mean = "-" if r.sequences_at_mean is None else f"{r.sequences_at_mean * r.engines:,}"
        most = "-" if plan.sequences_at_max is None else f"{plan.sequences_at_max * r.engines:,}"
        ratio = f"{r.gpu_hours / r.paper_gpu_hours:.2f}" if r.paper_gpu_hours else "-"
        verdict = ("yes" if plan.fits else "NO") + ("" if plan.runs else ", no kernels")
        lines.append(
            f"{r.abbrev:<8} {plan.layout.describe():<{width}} {plan.layout.nodes:>5} {plan.layout.gpus:>4} "
            f"{'pinned' if plan.pinned else 'planned':<7} {r.mean_context:>7,.0f} {mean:>7} {most:>7} "
            f"{r.gpu_hours:>8,.0f} {r.paper_gpu_hours:>11,.0f} {ratio:>5}  {verdict}"
        )
    total, paper = sum(r.gpu_hours for r in rows), sum(r.paper_gpu_hours for r in rows)
    lines.append(
        f"all: {total:,.0f} {name.upper() if isinstance(config.cluster.hardware, str) else name} GPU-hours, "
        f"paper-style {paper:,.0f} on the same GPUs (ratio {total / paper if paper else float('nan'):.2f})"
    )
    lines.append(
        "seq@ctx, seq@max: sequences one job's KV pools hold at attempt 1's mean in-flight context (ctx) and at "
        "max_context; GPU-h: procexec cost's stated projection on this GPU; paper GPU-h: every model one "
        "tensor-parallel in-process engine over its GPUs, truncated generations regenerated"
    )
    for r in rows:
        if not r.plan.fits or not r.plan.runs:
            lines.append(f"{r.abbrev}: {r.plan.why}")
    return "\n".join(lines)

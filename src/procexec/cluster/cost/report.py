"""A projection against its budgets, and the table ``procexec cost`` prints (with the haircuts it took)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from procexec.cluster.cost.catalog import GIB, Catalog
from procexec.cluster.cost.output import LOOP_SHARE, LOOP_SHARE_RANGE, REASONING, TOKEN_VOLUME_RANGE
from procexec.cluster.cost.projection import STATED_EFFICIENCY_RANGE, Projection
from procexec.config.guard import CANDIDATE_GUARD
from procexec.config.model import Config


@dataclass(frozen=True)
class BudgetCheck:
    """A projection against its budget: the study's (``cluster.gpu_hours_budget``) or one model's
    (``cluster.model_gpu_hours_budgets``)."""

    scope: str  # "study" or the model's key
    budget: float
    gpu_hours: float
    interval: tuple[float, float]
    over: bool  # the projection's point exceeds the budget
    upper_over: bool  # its interval's upper end does
    line: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def budget_check(scope: str, budget: float, total: float, interval: tuple[float, float], key: str) -> BudgetCheck:
    """Whether a projection (point, upper end) exceeds ``budget`` (config key ``key``), in one line."""
    lo, hi = interval
    over, upper_over = total > budget, hi > budget
    verb = "exceeds" if over else "is within, but its upper end exceeds," if upper_over else "is within"
    what = "" if scope == "study" else f"{scope}: "
    line = f"{what}projected {_hours(total)} GPU-hours ({_hours(lo)}-{_hours(hi)}) {verb} {key} {_hours(budget)}"
    return BudgetCheck(scope, budget, total, interval, over, upper_over, line)


def _hours(value: float) -> str:
    """GPU-hours for a line that compares them: whole hours from 100 on (or when whole), a tenth below (a budget
    of 1.5 must not read as 2 beside a projection of 1.7)."""
    return f"{value:,.0f}" if value >= 100 or float(value).is_integer() else f"{value:,.1f}"


def paper_ratio(rows: list[Projection]) -> float:
    """The study's stated GPU-hours over the paper-style layout's (both under the stated token model)."""
    return sum(r.paper_ratio * r.paper_gpu_hours for r in rows) / sum(r.paper_gpu_hours for r in rows)


def budget_checks(config: Config, rows: list[Projection]) -> list[BudgetCheck]:
    """Each model with a budget against it (``cluster.model_gpu_hours_budgets``), then the study's sum
    against ``cluster.gpu_hours_budget``; empty without budgets."""
    cluster = config.cluster
    per_model = cluster.model_gpu_hours_budgets or {}
    checks = [
        budget_check(
            r.model,
            float(per_model[r.model]),
            r.gpu_hours,
            r.gpu_hours_interval,
            f"cluster.model_gpu_hours_budgets.{r.model}",
        )
        for r in rows
        if r.model in per_model
    ]
    if cluster.gpu_hours_budget is not None:
        interval = (sum(r.gpu_hours_interval[0] for r in rows), sum(r.gpu_hours_interval[1] for r in rows))
        checks.append(
            budget_check(
                "study",
                float(cluster.gpu_hours_budget),
                sum(r.gpu_hours for r in rows),
                interval,
                "cluster.gpu_hours_budget",
            )
        )
    return checks


def haircuts(catalog: Catalog, rows: list[Projection]) -> dict[str, Any]:
    """The stated haircuts a projection took (architecture.yaml, or ``procexec cost``'s overrides), for its rows."""
    hw = catalog.hardware
    own = {r.abbrev: catalog.models[r.abbrev] for r in rows if r.abbrev in catalog.models}
    return {
        "runtime_overhead_gib": hw.runtime_overhead_bytes / GIB,
        "runtime_overhead_gib_by_model": {
            k: a.runtime_overhead_bytes / GIB for k, a in own.items() if a.runtime_overhead_bytes is not None
        },
        "ep_step_overhead": hw.ep_step_overhead,
        "filesystem_gb_per_s": [r / 1e9 for r in hw.filesystem_bytes_per_s],
        "warmup_s": hw.warmup_s,
        "warmup_s_by_model": {k: a.warmup_s for k, a in own.items() if a.warmup_s is not None},
        "job_starts": "one per shard",
        "tokens_factor": [TOKEN_VOLUME_RANGE[0][0], 1.0, TOKEN_VOLUME_RANGE[1][0]],
        "reasoning_truncation_at_95": [TOKEN_VOLUME_RANGE[0][1], REASONING.truncation_at_95, TOKEN_VOLUME_RANGE[1][1]],
        "efficiency": [STATED_EFFICIENCY_RANGE[1], hw.efficiency, STATED_EFFICIENCY_RANGE[0]],
        "loop_share": [LOOP_SHARE_RANGE[0], LOOP_SHARE, LOOP_SHARE_RANGE[1]],
    }


def format_haircuts(cuts: dict[str, Any]) -> list[str]:
    """The ``haircuts`` block under the table: each stated parameter with the point and the interval's ends."""

    def by_model(values: dict[str, float], unit: str) -> str:
        return "".join(f", {k} {v:,.0f}{unit}" for k, v in values.items())

    slow, fast = cuts["filesystem_gb_per_s"]
    tokens, truncation, efficiency = cuts["tokens_factor"], cuts["reasoning_truncation_at_95"], cuts["efficiency"]
    loops = cuts["loop_share"]
    return [
        "haircuts (architecture.yaml; --runtime-overhead-gib, --ep-overhead):",
        f"  runtime memory per GPU out of the KV pool: {cuts['runtime_overhead_gib']:g} GiB"
        + by_model(cuts["runtime_overhead_gib_by_model"], " GiB"),
        f"  expert parallel all-to-all: +{cuts['ep_step_overhead']:.0%} decode step time",
        f"  start-up, {cuts['job_starts']}: checkpoint at {(slow + fast) / 2:g} GB/s ({fast:g}-{slow:g} in the "
        f"interval) + warm-up {cuts['warmup_s']:,.0f} s" + by_model(cuts["warmup_s_by_model"], " s"),
        f"  interval, low-high: tokens per generation x{tokens[0]:g}-x{tokens[2]:g} (point x{tokens[1]:g}), "
        f"reasoning truncation at 95 steps {truncation[0]:.0%}-{truncation[2]:.0%} (point {truncation[1]:.0%}), "
        f"decode efficiency {efficiency[0]:g}-{efficiency[2]:g} (point {efficiency[1]:g}), start-up at "
        f"{fast:g}-{slow:g} GB/s, examples looping {loops[0]:.0%}-{loops[2]:.0%} (point {loops[1]:.0%})",
    ]


def format_loops(rows: list[Projection]) -> list[str]:
    """The loops' lines: each model's tails (reruns that end in a loop, decoded to max_context as the paper's rule
    has it) within its GPU-hours, and the study with and without the repetition guard."""
    if not rows:
        return []
    tails = ", ".join(f"{r.abbrev} {_hours(r.loop_gpu_hours)}" for r in rows if r.loop_gpu_hours)
    lo = sum(r.loop_gpu_hours_interval[0] for r in rows)
    hi = sum(r.loop_gpu_hours_interval[1] for r in rows)
    stated = [r for r in rows if r.basis == "stated"]
    share = (
        f"the stated {LOOP_SHARE:.0%} of examples (at most a model's truncations; {LOOP_SHARE_RANGE[0]:.0%}-"
        f"{LOOP_SHARE_RANGE[1]:.0%} in the interval)"
        if stated
        else "the pilot's looping reruns"
    )
    lines = [
        f"loop tails: {share} end in a repetition loop whose rerun runs to max_context (within GPU-h): "
        f"{tails or 'none'}; all {_hours(sum(r.loop_gpu_hours for r in rows))} GPU-hours ({_hours(lo)}-{_hours(hi)})"
    ]
    for r in rows:
        if r.basis == "measured":
            m = r.measured
            tail_hours = "-" if m["pilot_tail_gpu_hours"] is None else _hours(m["pilot_tail_gpu_hours"])
            lines.append(
                f"  {r.abbrev}: {m['loop_reruns']:,} of {m['examples']:,} examples looping ({r.loop_share:.2%}), "
                f"pilot tails {m['pilot_tail_tokens']:,} tokens, {tail_hours} GPU-hours; the full stage "
                f"{_hours(r.unguarded_gpu_hours)} GPU-hours unguarded, {_hours(r.guarded_gpu_hours)} guarded"
            )
    guarded = [r.abbrev for r in rows if r.guarded]
    as_run = f"guarded as configured: {', '.join(guarded)}" if guarded else "none guarded as configured"
    candidate = ", ".join(f"{k} {v}" for k, v in CANDIDATE_GUARD.items())
    lines.append(
        f"  with the repetition guard (each model's, else the candidate: {candidate}): "
        f"{_hours(sum(r.guarded_gpu_hours for r in rows))} GPU-hours; without it: "
        f"{_hours(sum(r.unguarded_gpu_hours for r in rows))} ({as_run})"
    )
    return lines


def format_projection(
    rows: list[Projection],
    budgets: Sequence[BudgetCheck] = (),
    paper: bool = False,
    cuts: dict[str, Any] | None = None,
    levers: Sequence[str] = (),
    gpu: str = "H200",
) -> str:
    """The table; ``paper``: each model's paper-style GPU-hours and the ratio beside it (``--baseline paper``);
    ``cuts``: the haircuts block (``haircuts``); ``levers``: the levers block (``procexec.cluster.cost.levers``);
    ``gpu``: whose GPU-hours (``cluster.hardware``)."""
    width = max((len(r.layout) for r in rows), default=6)
    head = (
        f"{'model':<8} {'GPUs':>4} {'layout':<{width}} {'gain':>5} {'seq/eng':>7} {'basis':<8} {'attempt1':>9} "
        f"{'reruns':>8} "
        f"{'ctx1':>7} {'ctx2':>7} {'tok/s':>7} {'start':>6} {'GPU-h':>8} {'GPU-h interval':>17} {'wall h':>7}"
    )
    lines = [head + (f" {'paper GPU-h':>11} {'ratio':>5}" if paper else "")]
    for r in rows:
        gain = "-" if r.layout_gain is None else f"x{r.layout_gain:.2f}"
        basis = r.basis if r.rate_basis == "architecture.yaml" else f"{r.basis}*"
        seqs = "-" if r.sequences_per_engine is None else f"{r.sequences_per_engine:,}"
        lines.append(
            f"{r.abbrev:<8} {r.gpus:>4} {r.layout:<{width}} {gain:>5} {seqs:>7} {basis:<8} "
            f"{r.attempt1_tokens / 1e9:>8.2f}G {r.rerun_tokens / 1e9:>7.2f}G {r.context_attempt1:>7,.0f} "
            f"{r.context_rerun:>7,.0f} {r.tokens_per_s:>7,.0f} {r.startup_gpu_hours:>6,.0f} {r.gpu_hours:>8,.0f} "
            f"{r.gpu_hours_interval[0]:>8,.0f}-{r.gpu_hours_interval[1]:<8,.0f} {r.wall_hours:>7,.1f}"
            + (f" {r.paper_gpu_hours:>11,.0f} {r.paper_ratio:>5.2f}" if paper else "")
        )
    total = sum(r.gpu_hours for r in rows)
    lo = sum(r.gpu_hours_interval[0] for r in rows)
    hi = sum(r.gpu_hours_interval[1] for r in rows)
    lines.append(
        f"all: {sum(r.attempt1_tokens for r in rows) / 1e9:.2f}G attempt-1 + "
        f"{sum(r.rerun_tokens for r in rows) / 1e9:.2f}G rerun + {sum(r.loop_tokens for r in rows) / 1e9:.2f}G "
        f"loop-tail tokens; {total:,.0f} {gpu} GPU-hours "
        f"({lo:,.0f}-{hi:,.0f}); wall (every model's shards at once, longest model): "
        f"{max((r.wall_hours for r in rows), default=0):,.1f} h"
    )
    lines.append(
        "gain: GPU-hours with tensor parallel over the same GPUs, no data parallel, no speculation, "
        "over those of the layout; seq/eng: sequences of max_context one engine's KV pool holds "
        "(as check-model computes it); start: GPU-hours of the shards' start-ups, within GPU-h"
    )
    lines.extend(format_loops(rows))
    if cuts is not None:
        lines.extend(format_haircuts(cuts))
    if paper:
        baseline = sum(r.paper_gpu_hours for r in rows)
        lines.append(
            f"paper: {baseline:,.0f} GPU-hours with every model tensor-parallel in-process, truncated "
            f"generations regenerated and loops to max_context ({sum(r.paper_loop_gpu_hours for r in rows):,.0f} "
            f"in their tails), under the same stated token model; ratio {paper_ratio(rows):.2f}"
        )
        lines.extend(levers)
    starts = [f"{r.abbrev} {r.startup_s:,.0f} s" for r in rows if r.measured.get("measured_startup_s") is not None]
    if starts:
        lines.append(
            f"start-up measured (per engine start, the shards' statistics; in place of the stated one): "
            f"{', '.join(starts)}"
        )
    unrated = [f"{r.abbrev} {r.measured['rate_left_out']:,}" for r in rows if r.measured.get("rate_left_out")]
    if unrated:
        lines.append(
            "rate measured without the generations recovered from a segment past its index (no commit time): "
            + ", ".join(unrated)
        )
    fallback = sorted({f"{r.abbrev} ({r.rate_basis})" for r in rows if r.rate_basis != "architecture.yaml"})
    if fallback:
        lines.append(f"*: rate without architecture numbers: {', '.join(fallback)} (docs/cluster.md)")
    lines.extend(b.line for b in budgets)
    return "\n".join(lines)

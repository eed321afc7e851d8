"""One model's projection of the full study (stated, or fitted to a pilot's store) and the paper-style
baseline beside it."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from procexec.benchmark.suite import expand_suite
from procexec.cluster.cost.catalog import Catalog, catalog_for
from procexec.cluster.cost.measured import Measured, measured_tokens, read_measured
from procexec.cluster.cost.output import (
    LOOP_SHARE_RANGE,
    TOKEN_VOLUME_RANGE,
    OutputModel,
    Phases,
    Work,
    attempt1_budget,
    output_model,
    stated_phases,
    varied_output,
)
from procexec.cluster.cost.runtime import startup_seconds
from procexec.cluster.cost.throughput import Layout, decode_rate, deployment_of, gpu_capacity
from procexec.config.guard import evaluated_guard
from procexec.config.model import Config, Inference, ModelBase
from procexec.errors import ProcexecError

STATED_EFFICIENCY_RANGE = (0.5, 0.9)  # the interval of a projection without measurements
BOOTSTRAP_RESAMPLES = 1000


@dataclass
class Projection:
    model: str
    abbrev: str
    gpus: int
    shards: int
    layout: str  # the parallel layout assumed (Layout.describe)
    rate_basis: str  # "architecture.yaml" | "fallback" | "cpu" (Deployment.basis)
    basis: str  # "stated" | "measured"
    examples: int  # of the full study
    attempt1_tokens: float
    rerun_tokens: float  # reruns that end on their own
    loop_tokens: float  # the loops' tails (reruns that end in a loop) under the paper's rule: to the context
    tokens_interval: tuple[float, float]
    context_attempt1: float
    context_rerun: float
    context_loop: float
    tokens_per_s: float  # the projection's rate, all of the model's GPUs of one shard together
    gpu_hours: float
    gpu_hours_interval: tuple[float, float]
    loop_share: float  # examples looping: the stated share (over all lengths), or the pilot's
    loop_gpu_hours: float  # those tails' GPU-hours (within unguarded_gpu_hours)
    loop_gpu_hours_interval: tuple[float, float]  # stated: at LOOP_SHARE_RANGE's ends; measured: the bootstrap
    guard: dict[str, int]  # the repetition guard this model's reruns carry, or the one evaluated (guard_source)
    guard_source: str  # the config key that sets it, or "candidate" (procexec.config.guard.CANDIDATE_GUARD)
    guarded: bool  # the config runs this model's reruns guarded (gpu_hours is then guarded_gpu_hours)
    unguarded_gpu_hours: float  # the paper's rule: every loop's tail to the context
    guarded_gpu_hours: float  # the loops' tails cut where ``guard`` stops them
    layout_gain: float | None  # GPU-hours on plain TP over the same GPUs / on this layout (None: a CPU model)
    paper_gpu_hours: float  # the paper-style layout's (paper_baseline_hours), under the stated token model
    paper_loop_gpu_hours: float  # its loops' tails, regenerated to the context (within paper_gpu_hours)
    paper_ratio: float  # this config's stated GPU-hours over paper_gpu_hours
    sequences_per_engine: int | None  # of max_context, in one engine's KV pool (gpu_capacity); None: a CPU model
    startup_s: float  # one job's start-up (startup_seconds), once per shard
    startup_gpu_hours: float  # within gpu_hours
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> float:
        return self.attempt1_tokens + self.rerun_tokens + self.loop_tokens

    @property
    def wall_hours(self) -> float:
        """With all of the model's shards running at once."""
        return self.gpu_hours / max(self.gpus, 1) / self.shards

    def to_json(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items()}
        out.update(
            tokens=self.tokens,
            wall_hours=self.wall_hours,
            wall_hours_interval=tuple(h / max(self.gpus, 1) / self.shards for h in self.gpu_hours_interval),
        )
        return out


def guard_tokens(guard: dict[str, int]) -> int:
    """The most tokens of a loop the guard lets through before it stops it (stated: ``min_count`` periods of its
    longest pattern; a loop of a longer period is never stopped, which the stated model leaves out and a
    pilot's ``guard_stop`` measures)."""
    return guard["min_count"] * guard["max_pattern_size"]


def project_model(
    config: Config,
    key: str,
    n_datasets: int,
    measured: Measured | None = None,
    catalog: Catalog | None = None,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = 0,
) -> Projection:
    """One model's projection for the full study (``config``'s suite, rerun policy and budgets).

    GPU-hours count every GPU of the model (a CPU model: its one engine): the decode, and one start-up per
    shard.  The interval's low end takes the low token volume and no loops (``TOKEN_VOLUME_RANGE``,
    ``LOOP_SHARE_RANGE``), the high decode efficiency and the fast filesystem, its high end the other ends
    (measured: the bootstrap over the examples and the rate's runs, with the start-up's range).  The loops'
    tails run to the context unless the config guards this model's reruns; both figures are kept
    (``unguarded_gpu_hours``, ``guarded_gpu_hours``).  ``layout_gain`` compares the decode of the layout with
    tensor parallel over the same GPUs, no data parallel, no speculation (the stated tokens).
    """
    suite, inference = config.suite, config.inference
    model = config.models[key]
    catalog = catalog or catalog_for(config)
    deployment = deployment_of(model, catalog, measured.acceptance_lengths if measured else None)
    gpus, shards = model.gpus, model.shards
    lengths = suite.lengths
    per_length = suite.examples_per_length * n_datasets
    examples = per_length * len(lengths)
    guard, guard_source = evaluated_guard(model, inference)
    guarded = guard_source != "candidate"
    cut = guard_tokens(guard)
    unguarded = stated_phases(model, inference, lengths)
    phases = stated_phases(model, inference, lengths, guard_tokens=cut) if guarded else unguarded
    per_gpu = max(gpus, 1) / 3600  # engine seconds -> GPU-hours

    def hours(
        efficiency: float | None = None,
        layout: Layout | None = None,
        output: OutputModel | None = None,
        tail_cut: int | None = cut if guarded else None,
    ) -> float:
        own = phases if output is None and tail_cut == (cut if guarded else None) else None
        work = own or stated_phases(model, inference, lengths, output=output, guard_tokens=tail_cut)
        return per_length * work.seconds(deployment, catalog, efficiency, layout) * per_gpu

    def tail_hours(work: Phases, layout: Layout | None = None) -> float:
        return (
            per_length * Phases(Work(0, 0), Work(0, 0), work.tail).seconds(deployment, catalog, layout=layout) * per_gpu
        )

    measured_start = None if measured is None else measured.startup_s

    def startup_hours(filesystem_bytes_per_s: float | None = None) -> float:
        return startup_seconds(model, catalog, measured_start, filesystem_bytes_per_s) * shards * per_gpu

    slow_fs, fast_fs = catalog.hardware.filesystem_bytes_per_s
    gain = None if deployment.arch is None else hours(layout=Layout(tp=max(gpus, 1))) / hours()
    paper_decode, paper_tails = paper_baseline_hours(model, inference, lengths, catalog)
    paper = paper_decode * per_length + startup_hours()
    common: dict[str, Any] = dict(
        model=key,
        abbrev=model.abbrev,
        gpus=gpus,
        shards=shards,
        layout=deployment.layout.describe() if deployment.arch is not None else "CPU",
        rate_basis=deployment.basis,
        examples=examples,
        context_attempt1=phases.first.context,
        context_rerun=phases.rerun.context,
        context_loop=unguarded.tail.context,
        guard=guard,
        guard_source=guard_source,
        guarded=guarded,
        layout_gain=gain,
        paper_gpu_hours=paper,
        paper_loop_gpu_hours=paper_tails * per_length,
        paper_ratio=(hours() + startup_hours()) / paper,
        sequences_per_engine=None
        if deployment.arch is None
        else gpu_capacity(deployment.arch, catalog.hardware, deployment.layout).per_engine(model.max_context),
        startup_s=startup_seconds(model, catalog, measured_start),
        startup_gpu_hours=startup_hours(),
    )
    if measured is None or measured.n == 0:
        out = output_model(model)
        low, high = (varied_output(out, *ends, share) for ends, share in zip(TOKEN_VOLUME_RANGE, LOOP_SHARE_RANGE))
        volume_low, volume_high = (
            stated_phases(model, inference, lengths, output=o, guard_tokens=cut if guarded else None).tokens
            * per_length
            for o in (low, high)
        )
        lo_e: float | None
        hi_e: float | None
        lo_e, hi_e = STATED_EFFICIENCY_RANGE
        if deployment.arch is None:  # a CPU model's rate is one figure
            lo_e = hi_e = None
        decode = hours()
        loop_low, loop_high = (
            tail_hours(stated_phases(model, inference, lengths, output=replace(out, loop_share=share)))
            for share in LOOP_SHARE_RANGE
        )
        return Projection(
            **common,
            basis="stated",
            attempt1_tokens=phases.first.tokens * per_length,
            rerun_tokens=phases.rerun.tokens * per_length,
            loop_tokens=unguarded.tail.tokens * per_length,
            tokens_interval=(volume_low, volume_high),
            tokens_per_s=phases.tokens * per_length / (decode / per_gpu),
            gpu_hours=decode + startup_hours(),
            gpu_hours_interval=(
                hours(hi_e, output=low) + startup_hours(fast_fs),
                hours(lo_e, output=high) + startup_hours(slow_fs),
            ),
            loop_share=sum(out.looping(int(L)) for L in lengths) / len(lengths),
            loop_gpu_hours=tail_hours(unguarded),
            loop_gpu_hours_interval=(loop_low, loop_high),
            unguarded_gpu_hours=hours(tail_cut=None) + startup_hours(),
            guarded_gpu_hours=hours(tail_cut=cut) + startup_hours(),
        )

    # measured: per length means (interpolated), the rate scaled from the measured context to the study's
    m1, m2, m_tail, m_guarded = measured_tokens(measured.examples, lengths)
    t1, t2, tail = sum(m1) * per_length, sum(m2) * per_length, sum(m_tail) * per_length
    t2_guarded = sum(m_guarded) * per_length
    rate = decode_rate(deployment, catalog, phases.first.context)
    if measured.tokens_per_s is not None:
        rate = measured.tokens_per_s * rate / decode_rate(deployment, catalog, measured.context)

    def hours_of(tokens: float) -> float:
        return tokens / rate * per_gpu

    rng = np.random.default_rng(seed)
    totals, tails = [], []
    reruns_as_run = 3 if guarded else 1  # the configured reruns: guarded or to the context
    for _ in range(resamples):
        sample = {L: [v[i] for i in rng.integers(0, len(v), len(v))] for L, v in measured.examples.items()}
        columns = measured_tokens(sample, lengths)
        totals.append((sum(columns[0]) + sum(columns[reruns_as_run])) * per_length)
        tails.append(sum(columns[2]) * per_length)
    lo, hi = (float(q) for q in np.quantile(totals, [0.025, 0.975]))
    tail_lo, tail_hi = (float(q) for q in np.quantile(tails, [0.025, 0.975]))
    decode_lo, decode_hi, rate_interval = hours_of(lo), hours_of(hi), None
    # the rate's spread: its runs resampled beside the examples (two runs measure a rate: tokens_per_s is set)
    if len(measured.rate_runs) > 1 and measured.tokens_per_s is not None:
        runs = np.array(measured.rate_runs)
        picks = np.random.default_rng([seed, 1]).integers(0, len(runs), (resamples, len(runs)))
        rates = runs[picks, 0].sum(axis=1) / runs[picks, 1].sum(axis=1) * (rate / measured.tokens_per_s)
        decode_lo, decode_hi = (float(q) for q in np.quantile(np.array(totals) / rates * per_gpu, [0.025, 0.975]))
        rate_interval = tuple(float(q) for q in np.quantile(rates, [0.025, 0.975]))
    pilot_tails = sum(e.tail for v in measured.examples.values() for e in v)
    share = {
        "examples": measured.n,
        "generations": measured.generations,
        "truncated_share": measured.truncated / measured.n,
        "rerun_share": measured.reruns / measured.n,
        "loop_share": measured.looping / max(measured.generations, 1),
        "loop_reruns": measured.loop_reruns,
        "pilot_tail_tokens": pilot_tails,
        # what the pilot's own tails took, at its measured rate (None: no rate measured)
        "pilot_tail_gpu_hours": None
        if measured.tokens_per_s is None
        else pilot_tails / measured.tokens_per_s * per_gpu,
        "guard_cut_tokens": sum(e.rerun - e.guarded for v in measured.examples.values() for e in v),
        "measured_tokens_per_s": measured.tokens_per_s,
        "rate_left_out": measured.unrated,  # generations without a commit time, not in the measured rate
        "tokens_per_s_interval": rate_interval,  # the study's rate over resampled runs (None: one run measured)
        "measured_context": measured.context,
        "measured_startup_s": measured.startup_s,  # per engine start (None: none recorded, the stated one used)
    }
    as_run = t2_guarded if guarded else t2
    return Projection(
        **common,
        basis="measured",
        attempt1_tokens=t1,
        rerun_tokens=t2 - tail,
        loop_tokens=tail,
        tokens_interval=(lo, hi),
        tokens_per_s=rate,
        gpu_hours=hours_of(t1 + as_run) + startup_hours(),
        gpu_hours_interval=(decode_lo + startup_hours(fast_fs), decode_hi + startup_hours(slow_fs)),
        loop_share=measured.loop_reruns / measured.n,
        loop_gpu_hours=hours_of(tail),
        loop_gpu_hours_interval=(hours_of(tail_lo), hours_of(tail_hi)),
        unguarded_gpu_hours=hours_of(t1 + t2) + startup_hours(),
        guarded_gpu_hours=hours_of(t1 + t2_guarded) + startup_hours(),
        measured=share,
    )


def paper_baseline_hours(
    model: ModelBase, inference: Inference, lengths: list[int], catalog: Catalog
) -> tuple[float, float]:
    """Decode GPU-hours of one example per length as the paper ran it, and of those its loops' tails: the
    model's GPUs as one tensor-parallel in-process engine (no data or expert parallel, no speculation, the
    engine's default batch), every truncated generation regenerated from scratch and every loop to the
    context, under the same stated token model and haircuts as the projection (``project_model`` adds the
    same start-ups)."""
    deployment = deployment_of(model, catalog)
    paper_layout = Layout(tp=max(model.gpus, 1))
    phases = stated_phases(model, inference.model_copy(update={"truncation_rerun": "regenerate"}), lengths)
    tail = Phases(Work(0, 0), Work(0, 0), phases.tail)
    per_gpu = max(model.gpus, 1) / 3600
    return (
        phases.seconds(deployment, catalog, layout=paper_layout) * per_gpu,
        tail.seconds(deployment, catalog, layout=paper_layout) * per_gpu,
    )


def project_study(
    config: Config,
    results: str | Path | None = None,
    seed: int = 0,
    resamples: int = BOOTSTRAP_RESAMPLES,
    catalog: Catalog | None = None,
) -> list[Projection]:
    """Every run model's projection but an imported one's (``Config.generated_models``); with ``results``, fitted
    from ``results/generations/<model>/store`` (``read_measured``); ``catalog``: architecture.yaml's, or one with
    other haircuts (``with_haircuts``), on the config's GPU (``cluster.hardware``) unless given."""
    n_datasets = len(expand_suite(config.suite))
    catalog = catalog or catalog_for(config)
    if results is not None and not Path(results).is_dir():
        raise ProcexecError(f"--measured {results}: not a directory (expected a results folder with generations/)")
    measured = {
        key: None
        if results is None
        else read_measured(
            Path(results) / "generations" / key / "store",
            guard=evaluated_guard(config.models[key], config.inference)[0],
        )
        for key in config.generated_models
    }
    if results is not None and not any(m is not None and m.n for m in measured.values()):
        raise ProcexecError(
            f"--measured {results}: no generations of any run model "
            f"({', '.join(config.generated_models)}) under {Path(results) / 'generations'}/<model>/store: "
            "nothing was measured there (name a smoke or pilot's results folder, or leave out "
            "--measured for the stated projection)"
        )
    for key, m in measured.items():
        budget = attempt1_budget(config.models[key], config.inference)
        if m is not None and m.budgets - {budget}:
            raise ProcexecError(
                f"--measured {results}: {key}'s measured attempt-1 generations were made with max_tokens "
                f"{', '.join(map(str, sorted(m.budgets)))} (their records' sampling), the config gives {budget} "
                f"(models.{key}.max_new_tokens, else inference.max_new_tokens): their token counts and truncations "
                "do not fit this budget; measure a pilot run with this config"
            )
    return [
        project_model(config, key, n_datasets, measured[key], catalog, resamples, seed)
        for key in config.generated_models
    ]

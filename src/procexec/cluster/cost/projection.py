"""One model's projection of the full study (stated, or fitted to a pilot's store) and the paper-style
baseline beside it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from procexec.benchmark.suite import expand_suite
from procexec.cluster.cost.catalog import Catalog, catalog_for
from procexec.cluster.cost.measured import Measured, measured_tokens, read_measured
from procexec.cluster.cost.output import (
    TOKEN_VOLUME_RANGE,
    OutputModel,
    attempt1_budget,
    output_model,
    stated_phases,
    varied_output,
)
from procexec.cluster.cost.runtime import startup_seconds
from procexec.cluster.cost.throughput import Layout, decode_rate, engine_of, gpu_capacity
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
    rate_basis: str  # "architecture.yaml" | "fallback" | "cpu" (Engine.basis)
    basis: str  # "stated" | "measured"
    examples: int  # of the full study
    attempt1_tokens: float
    rerun_tokens: float
    tokens_interval: tuple[float, float]
    context_attempt1: float
    context_rerun: float
    tokens_per_s: float  # the projection's rate, all of the model's GPUs of one shard together
    gpu_hours: float
    gpu_hours_interval: tuple[float, float]
    layout_gain: float | None  # GPU-hours on plain TP over the same GPUs / on this layout (None: a CPU model)
    paper_gpu_hours: float  # the paper-style layout's (paper_baseline_hours), under the stated token model
    paper_ratio: float  # this config's stated GPU-hours over paper_gpu_hours
    sequences_per_engine: int | None  # of max_context, in one engine's KV pool (gpu_capacity); None: a CPU model
    startup_s: float  # one job's start-up (startup_seconds), once per shard
    startup_gpu_hours: float  # within gpu_hours
    measured: dict[str, Any] = field(default_factory=dict)

    @property
    def tokens(self) -> float:
        return self.attempt1_tokens + self.rerun_tokens

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
    shard.  The interval's low end takes the low token volume (``TOKEN_VOLUME_RANGE``), the high decode
    efficiency and the fast filesystem, its high end the other ends (measured: the bootstrap over the examples and
    the rate's runs, with the start-up's range).  ``layout_gain`` compares the decode of the layout with
    tensor parallel over the same GPUs, no data parallel, no speculation (the stated tokens).
    """
    suite, inference = config.suite, config.inference
    model = config.models[key]
    catalog = catalog or catalog_for(config)
    engine = engine_of(model, catalog, measured.acceptance_lengths if measured else None)
    gpus, shards = model.gpus, model.shards
    lengths = suite.lengths
    per_length = suite.examples_per_length * n_datasets
    examples = per_length * len(lengths)
    first, rerun = stated_phases(model, inference, lengths)
    per_gpu = max(gpus, 1) / 3600  # engine seconds -> GPU-hours

    def hours(
        efficiency: float | None = None, layout: Layout | None = None, output: OutputModel | None = None
    ) -> float:
        f, r = (first, rerun) if output is None else stated_phases(model, inference, lengths, output=output)
        return (
            per_length
            * (f.seconds(engine, catalog, efficiency, layout) + r.seconds(engine, catalog, efficiency, layout))
            * per_gpu
        )

    measured_start = None if measured is None else measured.startup_s

    def startup_hours(filesystem_bytes_per_s: float | None = None) -> float:
        return startup_seconds(model, catalog, measured_start, filesystem_bytes_per_s) * shards * per_gpu

    slow_fs, fast_fs = catalog.hardware.filesystem_bytes_per_s
    gain = None if engine.arch is None else hours(layout=Layout(tp=max(gpus, 1))) / hours()
    paper = paper_baseline_hours(model, inference, lengths, catalog) * per_length + startup_hours()
    common = dict(
        model=key,
        abbrev=model.abbrev,
        gpus=gpus,
        shards=shards,
        layout=engine.layout.describe() if engine.arch is not None else "CPU",
        rate_basis=engine.basis,
        examples=examples,
        context_attempt1=first.context,
        context_rerun=rerun.context,
        layout_gain=gain,
        paper_gpu_hours=paper,
        paper_ratio=(hours() + startup_hours()) / paper,
        sequences_per_engine=None
        if engine.arch is None
        else gpu_capacity(engine.arch, catalog.hardware, engine.layout).per_engine(model.max_context),
        startup_s=startup_seconds(model, catalog, measured_start),
        startup_gpu_hours=startup_hours(),
    )
    if measured is None or measured.n == 0:
        t1, t2 = first.tokens * per_length, rerun.tokens * per_length
        decode = hours()
        low, high = (varied_output(output_model(model), *ends) for ends in TOKEN_VOLUME_RANGE)
        volume = tuple(
            sum(w.tokens for w in stated_phases(model, inference, lengths, output=out)) * per_length
            for out in (low, high)
        )
        lo_e, hi_e = STATED_EFFICIENCY_RANGE
        if engine.arch is None:  # a CPU model's rate is one figure
            lo_e = hi_e = None
        return Projection(
            **common,
            basis="stated",
            attempt1_tokens=t1,
            rerun_tokens=t2,
            tokens_interval=volume,
            tokens_per_s=(t1 + t2) / (decode / per_gpu),
            gpu_hours=decode + startup_hours(),
            gpu_hours_interval=(
                hours(hi_e, output=low) + startup_hours(fast_fs),
                hours(lo_e, output=high) + startup_hours(slow_fs),
            ),
        )

    # measured: per length means (interpolated), the rate scaled from the measured context to the study's
    m1, m2 = measured_tokens(measured.examples, lengths)
    t1, t2 = sum(m1) * per_length, sum(m2) * per_length
    rate = decode_rate(engine, catalog, first.context)
    if measured.tokens_per_s is not None:
        rate = measured.tokens_per_s * rate / decode_rate(engine, catalog, measured.context)

    def hours_of(tokens: float) -> float:
        return tokens / rate * per_gpu

    rng = np.random.default_rng(seed)
    totals = []
    for _ in range(resamples):
        sample = {L: [v[i] for i in rng.integers(0, len(v), len(v))] for L, v in measured.examples.items()}
        f, r = measured_tokens(sample, lengths)
        totals.append((sum(f) + sum(r)) * per_length)
    lo, hi = (float(q) for q in np.quantile(totals, [0.025, 0.975]))
    decode_lo, decode_hi, rate_interval = hours_of(lo), hours_of(hi), None
    if len(measured.rate_runs) > 1:  # the rate's spread: its runs resampled beside the examples
        runs = np.array(measured.rate_runs)
        picks = np.random.default_rng([seed, 1]).integers(0, len(runs), (resamples, len(runs)))
        rates = runs[picks, 0].sum(axis=1) / runs[picks, 1].sum(axis=1) * (rate / measured.tokens_per_s)
        decode_lo, decode_hi = (float(q) for q in np.quantile(np.array(totals) / rates * per_gpu, [0.025, 0.975]))
        rate_interval = tuple(float(q) for q in np.quantile(rates, [0.025, 0.975]))
    share = {
        "examples": measured.n,
        "generations": measured.generations,
        "truncated_share": measured.truncated / measured.n,
        "rerun_share": measured.reruns / measured.n,
        "loop_share": measured.looping / max(measured.generations, 1),
        "measured_tokens_per_s": measured.tokens_per_s,
        "tokens_per_s_interval": rate_interval,  # the study's rate over resampled runs (None: one run measured)
        "measured_context": measured.context,
        "measured_startup_s": measured.startup_s,  # per engine start (None: none recorded, the stated one used)
    }
    return Projection(
        **common,
        basis="measured",
        attempt1_tokens=t1,
        rerun_tokens=t2,
        tokens_interval=(lo, hi),
        tokens_per_s=rate,
        gpu_hours=hours_of(t1 + t2) + startup_hours(),
        gpu_hours_interval=(decode_lo + startup_hours(fast_fs), decode_hi + startup_hours(slow_fs)),
        measured=share,
    )


def paper_baseline_hours(model: ModelBase, inference: Inference, lengths: list[int], catalog: Catalog) -> float:
    """Decode GPU-hours of one example per length as the paper ran it: the model's GPUs as one tensor-parallel
    in-process engine (no data or expert parallel, no speculation, the engine's default batch) and every
    truncated generation regenerated from scratch, under the same stated token model and haircuts as the
    projection (``project_model`` adds the same start-ups)."""
    engine = engine_of(model, catalog)
    paper_layout = Layout(tp=max(model.gpus, 1))
    first, rerun = stated_phases(model, inference.model_copy(update={"truncation_rerun": "regenerate"}), lengths)
    seconds = first.seconds(engine, catalog, layout=paper_layout) + rerun.seconds(engine, catalog, layout=paper_layout)
    return seconds * max(model.gpus, 1) / 3600


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
        key: None if results is None else read_measured(Path(results) / "generations" / key / "store")
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

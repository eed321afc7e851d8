"""The levers that cut the study's GPU-hours, each projected alone, and those that keep greedy outputs in
distribution projected together (``procexec cost --baseline paper``; docs/cluster.md, "Levers").

A lever *keeps greedy token ids bitwise* when the engine computes exactly what it computed without it, *in
distribution* when only the numerics' order changes (batch composition, the shape of a verification step: a
greedy argmax may flip where two logits tie within rounding, as between any two batch orders), and *changes
records* when it changes what is decoded or kept (a guard's cut).  Every projection here is the stated one, on
both sides of the ratio.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from procexec.benchmark.suite import expand_suite
from procexec.cluster.cost.catalog import Catalog
from procexec.cluster.cost.output import PROMPT_TOKENS, Work, attempt1_budget, output_model
from procexec.cluster.cost.projection import Projection, project_study
from procexec.cluster.cost.throughput import decode_rate, deployment_of
from procexec.config.guard import evaluated_guard
from procexec.config.model import Config, ModelBase, RepetitionGuard
from procexec.config.speculative import PILOT_NGRAM

#: A higher ``gpu_memory_utilization`` than vLLM's default (architecture.yaml: 0.92): a larger KV pool, larger
#: batches.  0.95 leaves 7 GB of an H200 outside vLLM's budget; where check-model on the GPU shows the room
#: (its KV pool against the runtime's own memory), the lever applies.
MEMORY_UTILIZATION = 0.95


@dataclass(frozen=True)
class Lever:
    name: str
    keeps: str  # "bitwise" | "in distribution" | "changes records"
    gpu_hours: float  # the study's stated GPU-hours with this lever alone
    saved: float  # against the config as written
    confirms: str  # what the pilot measures of it

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def drafter_config(model: ModelBase, catalog: Catalog) -> dict[str, Any]:
    """The speculative_config the lever runs ``model`` with: its own drafter (architecture.yaml ``drafter``:
    DS-685's MTP module, KK-1T's EAGLE3 head), else n-gram drafting as the pilot's speculative half runs it."""
    arch = catalog.models.get(model.abbrev)
    return dict(arch.drafter) if arch is not None and arch.drafter else dict(PILOT_NGRAM)


def with_models(config: Config, update: dict[str, dict[str, Any]]) -> Config:
    """``config`` with each named model's fields updated."""
    models = {key: m.model_copy(update=update[key]) if key in update else m for key, m in config.models.items()}
    return config.model_copy(update={"models": models})


def speculating(config: Config, catalog: Catalog) -> Config:
    """Every generated GPU model that drafts nothing drafting with ``drafter_config``."""
    return with_models(
        config,
        {
            key: {"speculative_config": drafter_config(config.models[key], catalog)}
            for key in config.generated_models
            if config.models[key].gpus > 0 and config.models[key].speculative_config is None
        },
    )


def guarding(config: Config) -> Config:
    """Every generated model's reruns guarded (its configured guard, else the candidate the pilot evaluates)."""
    return with_models(
        config,
        {
            key: {
                "rerun_repetition_guard": RepetitionGuard.model_validate(
                    evaluated_guard(config.models[key], config.inference)[0]
                )
            }
            for key in config.generated_models
        },
    )


def drain_hours(config: Config, model: ModelBase, n_datasets: int, catalog: Catalog, longest_first: bool) -> float:
    """GPU-hours a model's shards idle at their ends: each shard's GPUs all held while its last long generation
    decodes alone (the projection's rate assumes full batches throughout, so this is outside it).

    The last generation to finish is the longest of the last wave submitted (the sequences in flight at
    once): shortest first, the longest procedures, of which ``looping(L)`` run to the context; longest first,
    the shortest ones.  A wave expects a loop when ``looping(L)`` x its size >= 1, else a truncated rerun when
    ``truncation(L)`` x its size >= 1, else a generation of the mean length.  It decodes at one sequence on one
    engine (the other engines of the shard, under data parallel, step with nothing to do).
    """
    deployment = deployment_of(model, catalog)
    if deployment.arch is None:
        return 0.0
    suite, inference = config.suite, config.inference
    length = max(suite.lengths) if not longest_first else min(suite.lengths)
    per_shard = suite.examples_per_length * n_datasets // model.shards
    wave = min(float(deployment.layout.max_seqs or catalog.hardware.max_num_seqs) * deployment.layout.dp, per_shard)
    out = output_model(model)
    max_new = attempt1_budget(model, inference)
    room = model.max_context - PROMPT_TOKENS
    reruns = inference.truncation_rerun != "off" and room > max_new
    if reruns and out.looping(length) * wave >= 1:
        tokens = float(room)
    elif reruns and out.truncation(length) * wave >= 1:
        tokens = max_new + min(out.rerun_extra, room - max_new)
    else:
        tokens = min(out.mean_tokens(length), max_new)
    alone = replace(deployment.layout, max_seqs=1)
    work = Work.of([(1.0, tokens, PROMPT_TOKENS)])
    seconds = work.tokens / (decode_rate(deployment, catalog, work.context, layout=alone) / alone.dp)
    return seconds * model.shards * model.gpus / 3600


@dataclass(frozen=True)
class LeverReport:
    levers: list[Lever]
    gpu_hours: float  # the config as written
    in_distribution_gpu_hours: float  # with every lever that keeps greedy outputs in distribution
    paper_gpu_hours: float

    @property
    def ratio(self) -> float:
        return self.gpu_hours / self.paper_gpu_hours

    @property
    def in_distribution_ratio(self) -> float:
        return self.in_distribution_gpu_hours / self.paper_gpu_hours

    def to_json(self) -> dict[str, Any]:
        """Beside the baseline's own figures (``--json``'s ``baseline``): the levers, and the study and its
        ratio with the in-distribution ones."""
        return {
            "levers": [lever.to_json() for lever in self.levers],
            "in_distribution_gpu_hours": self.in_distribution_gpu_hours,
            "in_distribution_ratio": self.in_distribution_ratio,
        }


def lever_report(config: Config, catalog: Catalog, rows: list[Projection]) -> LeverReport:
    """Each lever's stated GPU-hours against ``rows`` (the config's stated projection), and the in-distribution
    levers together: drafting, a larger KV pool (the order of a shard's submissions is the job's own, longest
    first: its saving is the drain's, outside the projection)."""
    base = sum(r.gpu_hours for r in rows)
    n_datasets = len(expand_suite(config.suite))
    roomy = replace(catalog, hardware=replace(catalog.hardware, gpu_memory_utilization=MEMORY_UTILIZATION))

    def study(changed: Config, cat: Catalog = catalog) -> float:
        return sum(r.gpu_hours for r in project_study(changed, catalog=cat))

    models = [config.models[key] for key in config.generated_models]
    drains = [sum(drain_hours(config, m, n_datasets, catalog, order) for m in models) for order in (False, True)]
    speculative = study(speculating(config, catalog))
    memory = study(config, roomy)
    guarded = study(guarding(config))
    levers = [
        Lever(
            "speculative decoding (architecture.yaml drafter: DS-685 MTP, KK-1T EAGLE3; else n-gram)",
            "in distribution",
            speculative,
            base - speculative,
            "the speculative half of the pilot (pilot_speculative): identical ids, acceptance, decode rate",
        ),
        Lever(
            f"gpu_memory_utilization {MEMORY_UTILIZATION}",
            "in distribution",
            memory,
            base - memory,
            "check-model's KV pool on the GPU; the pilot's shards' KV capacity (procexec status)",
        ),
        Lever(
            "longest procedures first in each shard (the job's order; saving: the drain's)",
            "in distribution",
            base,
            drains[0] - drains[1],
            "benchmarks/bench_shard_order.py; the shards' stats (decode rate over the run)",
        ),
        Lever(
            "rerun_repetition_guard (each model's, else the candidate)",
            "changes records",
            guarded,
            base - guarded,
            "the pilot's Loops section: guard points, cut scores, escapes",
        ),
    ]
    together = study(speculating(config, catalog), roomy)
    return LeverReport(levers, base, together, sum(r.paper_gpu_hours for r in rows))


def format_levers(report: LeverReport) -> list[str]:
    """The levers block of ``procexec cost --baseline paper``."""
    lines = ["levers (stated projection, each alone; docs/cluster.md, 'Levers'):"]
    for lever in report.levers:
        lines.append(f"  {lever.name} [{lever.keeps}]: saves {lever.saved:,.0f} GPU-hours")
    lines.append(
        f"  in distribution together: {report.in_distribution_gpu_hours:,.0f} GPU-hours, ratio "
        f"{report.in_distribution_ratio:.2f} (as written: {report.gpu_hours:,.0f}, ratio {report.ratio:.2f})"
    )
    return lines

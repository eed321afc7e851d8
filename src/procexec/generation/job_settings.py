"""What a generation job reads of the config, read and checked once (as inspect_ai's ``GenerateConfig``).

The job, its store and its backend get these typed settings instead of the
whole config, so what a job depends on is listed in one place and a bad value
fails here, before any backend is built (no tokenizer, no GPU work).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from procexec.config.guard import configured_guard
from procexec.config.model import Config, ModelBase, VllmServerModel, plain
from procexec.errors import ProcexecError
from procexec.generation.backend import Sampling


def model_entry(config: Config, key: str) -> ModelBase:
    """A model this study stages, checks or runs (what every command that does so asks for)."""
    if key not in config.models:
        raise ProcexecError(f"unknown model key '{key}' (known: {', '.join(sorted(config.models))})")
    if not config.models[key].generates_here:
        raise ProcexecError(
            f"model '{key}' is imported (backend imported): nothing is staged, checked or run for it; its "
            "generations come from its harness's logs (procexec import-harness)"
        )
    return config.models[key]


@dataclass(frozen=True)
class JobSettings:
    """One model's job settings (a prepared config's ``models.KEY`` and ``inference``)."""

    model_key: str
    model: ModelBase  # the typed entry: the backend's settings and the records' model fields
    sampling: Sampling
    max_new_tokens: int  # attempt 1's budget: the model's own, else inference.max_new_tokens
    max_context: int  # an attempt 2's budget (prompt included)
    truncation_rerun: str  # continue | regenerate | off
    template_date: dt.date  # the clock chat templates read
    # vLLM's repetition detection on attempt 2 (docs/decisions.md): the model's, else inference's; null when
    # neither is set, and in the pilot, which reruns unguarded and measures what the guard would change
    rerun_repetition_guard: dict[str, int] | None
    store_commit_records: int
    store_commit_seconds: float
    stall_timeout_s: float | None  # the watchdog's limit (procexec.generation.watchdog); None: not watched
    stage: str  # the study stage that generates (smoke | pilot | full)
    cache_dir: str | None = None  # cluster.cache_dir: the shared compile caches (procexec.engine.caches)
    # a job server's start ceiling: the model's server_start_ceiling_s; None: none, unless `procexec infer` derives
    # one (procexec.cluster.job_limits)
    server_start_ceiling_s: float | None = None
    # a job server's admission: the study's mean in-flight context (procexec.cluster.job_limits); None: max_concurrency
    admission_context: float | None = None

    @classmethod
    def from_config(cls, config: Config, model_key: str) -> JobSettings:
        """The settings of model ``model_key`` in a prepared config; refuses what the config check cannot see."""
        model = model_entry(config, model_key)
        inference = config.inference
        guard, where = configured_guard(model, inference)
        if guard and guard.min_pattern_size > guard.max_pattern_size:
            raise ProcexecError(
                f"{where}: min_pattern_size {guard.min_pattern_size} exceeds max_pattern_size {guard.max_pattern_size}"
            )
        if (config.stage or "full") == "pilot":  # the paper's rule: the pilot measures what a guard would change
            guard = None
        return cls(
            model_key=model_key,
            model=model,
            sampling=Sampling(float(inference.temperature), float(inference.top_p)),
            max_new_tokens=inference.max_new_tokens if model.max_new_tokens is None else model.max_new_tokens,
            max_context=model.max_context,
            truncation_rerun=inference.truncation_rerun,
            template_date=inference.template_date,
            rerun_repetition_guard=plain(guard),
            store_commit_records=inference.store_commit_records,
            store_commit_seconds=float(inference.store_commit_seconds),
            stall_timeout_s=None if inference.stall_timeout_s is None else float(inference.stall_timeout_s),
            stage=config.stage or "full",
            cache_dir=config.cluster.cache_dir,
            server_start_ceiling_s=(
                float(model.server_start_ceiling_s)
                if isinstance(model, VllmServerModel) and model.server_start_ceiling_s is not None
                else None
            ),
        )

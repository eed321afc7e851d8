"""The study stages: ``smoke``, ``pilot``, ``full`` (config ``stage``; docs/workflow.md, "Study stages").

A study stage is the same workflow on a smaller suite, so each is a pure rewrite of the
merged config that the jobs then read as any other:

* ``smoke``: per model one job on a handful of examples (the first
  ``smoke.datasets`` datasets, ``smoke.lengths``, ``smoke.examples_per_length``)
  with budgets small enough that a truncation and its rerun happen
  (``smoke.max_new_tokens``; reruns up to ``smoke.max_context``).  The engine
  settings stay the model's own, so the smoke proves they start.
* ``pilot``: the first ``pilot_examples_per_length`` examples of every dataset x
  length cell, with the study's own budgets and rerun rule.  Examples are pure
  functions of (dataset, length, index) and the store is keyed by prompt and
  settings, so the full run finds the pilot's generations in the store and
  generates only the rest.
* ``full``: the config as written.

With ``pilot_speculative`` the pilot runs each vLLM model's slice twice: as
configured, and with that ``speculative_config`` (``true``: n-gram drafting,
``PILOT_NGRAM``; ``drafter``: a model's own MTP module where it has one, as
DS-685 has) into a store of its own, so that the report can show per model
what drafting accepts, what it speeds and whether the token ids stay those of
plain greedy (``procexec.generation.speculative``; docs/decisions.md).

Study stages other than ``full`` write under ``results/<stage>/`` (and ``logs/<stage>/``),
so they never overwrite the study's outputs; what they share with it is what is
the same for every study stage: staged models, rendered prompts, each model's
generation store and, for the pilot (the models' contexts are the study's), the
model checks.  Rewriting is idempotent (a staged config staged again
is unchanged), so the commands may apply it to a config the workflow wrote.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from procexec.benchmark.suite import expand_suite
from procexec.config import prepare
from procexec.config.model import Config, ModelBase
from procexec.config.speculative import PILOT_NGRAM
from procexec.errors import ProcexecError

#: What ``smoke`` runs unless ``smoke:`` in the config says otherwise (lengths: the suite's shortest and longest).
SMOKE_DEFAULTS: dict[str, Any] = {
    "datasets": 2,
    "examples_per_length": 2,
    "max_new_tokens": 256,  # a reasoning model's trace is longer: attempt 1 is truncated ...
    "max_context": 4096,  # ... and rerun with the rest of this context (prompts are ~600-1,000 tokens)
}
PILOT_EXAMPLES_PER_LENGTH = 2  # 1,100 examples per model: 2% of the paper's study
#: The pilot's speculative half's store, beside the model's own (``generations/KEY/``; rules/speculative.smk).
SPECULATIVE_STORE = "speculative-store"


def stage_of(config: Config) -> str:
    return config.stage or "full"


def smoke_settings(config: Config) -> dict[str, Any]:
    """The smoke stage's sizes: ``smoke:`` over the defaults (a size stated as null is the default's)."""
    lengths = config.suite.lengths
    stated = config.smoke.model_dump(exclude_none=True) if config.smoke else {}
    return {**SMOKE_DEFAULTS, "lengths": sorted({lengths[0], lengths[-1]}), **stated}


def staged(raw: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """The raw (merged, not defaulted) config of the stage it names; ``full`` returns it unchanged.

    Validates first (one ``ProcexecError`` line per problem), so the rewrite reads a well-formed config.
    """
    config = prepare(raw, source)
    stage = stage_of(config)
    if stage == "full":
        return raw
    out = copy.deepcopy(raw)
    suite = out["suite"]
    if stage == "pilot":
        k = config.pilot_examples_per_length or PILOT_EXAMPLES_PER_LENGTH  # null: the default, as absent
        suite["examples_per_length"] = min(k, suite["examples_per_length"])
    else:
        smoke = smoke_settings(config)
        suite["datasets"] = [spec.id for spec in expand_suite(config.suite)][: smoke["datasets"]]
        suite["lengths"] = smoke["lengths"]
        suite["examples_per_length"] = smoke["examples_per_length"]
        out["inference"]["max_new_tokens"] = smoke["max_new_tokens"]
    for key in config.run_models:
        if not config.models[key].generates_here:  # an imported model's logs are read as they are
            continue
        fields = out["models"][key]  # the entry as the YAML states it (the stage's rewrite)
        fields["shards"] = 1  # a few minutes (smoke) or ~2% of the model's work (pilot): one job each
        if stage == "smoke":
            fields.pop("max_new_tokens", None)
            fields["max_context"] = min(smoke["max_context"], config.models[key].max_model_len)
    out["run_models"] = list(config.run_models)
    return out


def pilot_speculation(config: Config, key: str) -> dict[str, Any] | None:
    """The ``speculative_config`` of model ``key``'s pilot second half (None: not a pilot, or no second half
    asked): ``pilot_speculative`` itself, n-gram drafting for ``true``, and for ``drafter`` the model's own MTP
    module where architecture.yaml names one (``drafter``: DS-685's), n-gram elsewhere."""
    if stage_of(config) != "pilot" or not config.pilot_speculative:
        return None
    if config.pilot_speculative == "drafter":
        return built_in_drafter(config.models[key])
    return dict(PILOT_NGRAM) if config.pilot_speculative is True else dict(config.pilot_speculative)


def built_in_drafter(model: ModelBase) -> dict[str, Any]:
    """The model's own MTP drafter (architecture.yaml ``drafter``; its weights are the checkpoint's, so nothing
    more is staged), else n-gram drafting.  A drafter of separate weights (KK-1T's EAGLE3 head) would need
    staging of its own: the pilot drafts n-gram for it, and ``procexec cost``'s levers state it."""
    from procexec.cluster.cost.catalog import load_architecture

    arch = load_architecture().models.get(model.abbrev)
    if arch is not None and arch.drafter and arch.drafter.get("method") == "mtp":
        return dict(arch.drafter)
    return dict(PILOT_NGRAM)


def speculative_models(config: Config) -> list[str]:
    """The models the pilot also runs speculatively: vLLM in the job, and plain as configured (a model whose
    own entry speculates has no plain half to compare with)."""
    if stage_of(config) != "pilot" or not config.pilot_speculative:
        return []
    return [
        key
        for key in config.run_models
        if config.models[key].runs_in_job and config.models[key].speculative_config is None
    ]


def speculative_half(config: Config, key: str) -> ModelBase:
    """Model ``key`` as the pilot's speculative half runs it (``procexec infer --speculative``)."""
    if key not in speculative_models(config):
        raise ProcexecError(
            f"--speculative: model '{key}' has no speculative half (it needs stage: pilot, pilot_speculative set, "
            "a vLLM backend and no speculative_config of its own)"
        )
    return config.models[key].model_copy(update={"speculative_config": pilot_speculation(config, key)})


def results_dir(config: Config) -> Path:
    """Where a stage's outputs go: ``results`` for the full study, ``results/<stage>`` for the others."""
    stage = stage_of(config)
    return Path("results") if stage == "full" else Path("results", stage)


def logs_dir(config: Config) -> Path:
    stage = stage_of(config)
    return Path("logs") if stage == "full" else Path("logs", stage)


def checks_dirs(config: Config) -> tuple[Path, Path]:
    """Where the model checks (``check-model``) this stage's jobs read are written (outputs, logs): the full
    study's for the pilot, which keeps the models' contexts (a pilot's checks are the full study's, done once);
    the smoke's own, whose ``max_context`` is its own."""
    stage = config.model_copy(update={"stage": "smoke" if stage_of(config) == "smoke" else "full"})
    return results_dir(stage), logs_dir(stage)

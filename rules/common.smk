# The workflow's view of the study: procexec.cluster.workflow.Study (plain Python,
# unit-tested) built once from Snakemake's merged config, and the thin functions the
# rules call.  No rules live here (snakemake --lint).  Rerun semantics: the module's
# docstring and docs/workflow.md.

import sys
from pathlib import Path

from procexec.cluster.workflow import (
    AGGREGATE_RESAMPLES,
    AGGREGATE_SEED,
    ANALYSIS_ENV,
    INFERENCE_ENV,
    SCORE_FORMAT,
    Study,
    alternatives,
    dir_of,
    ids_of,
    missing_environments,
    placement_line,
    write_merged_config,
)
from procexec.benchmark.table4 import TABLE4_SEMANTICS
from procexec.errors import ProcexecError
from procexec.records import DATASET_ID, MODEL_KEY

# Config sources for messages, in merge order: workflow.configfiles lists the
# --configfile overlays first and config.yaml (via Snakemake's source cache) last.
_SOURCES = [Path(f).name for f in workflow.configfiles]
try:
    STUDY = Study.from_config(
        config, " + ".join(_SOURCES[-1:] + _SOURCES[:-1]) or "config"
    )
except ProcexecError as exc:
    stop(exc)  # rules/preflight.smk: one line, exit 2
if (
    not workflow.remote_exec
):  # once, on the submit host: the full stage within its GPU-hour budget
    _refusal = STUDY.budget_refusal()
    if _refusal:
        stop(_refusal)
for _env in missing_environments(workflow.basedir):
    stop(f"rules/{_env}: the conda environment file is missing from the checkout")

# The commands read the merged config from this file; it is written when the workflow
# starts running jobs (Snakefile's onstart), never while parsing (-n, --lint).
CONFIG_FILE = STUDY.config_file
# The stage's outputs and logs (results/ and logs/ for the full study; results/<stage>/ otherwise).
RESULTS = STUDY.results
LOGS = STUDY.logs
DATASETS = STUDY.datasets
PROMPT_EXAMPLE = STUDY.prompt_example
VLLM_MODELS = STUDY.in_process_models
ENDPOINT_MODELS = STUDY.endpoint_models
SUITE_SETTINGS = STUDY.suite_settings()


# Before any rule is defined (they apply to rules defined after them).
wildcard_constraints:
    dataset=DATASET_ID.pattern,
    model=MODEL_KEY.pattern,
    shard=r"[0-9]+",
    nshards=r"[0-9]+",


if STUDY.local_cpu_rules():
    workflow.localrules(*STUDY.local_cpu_rules())


def cpu_group(rule):
    return STUDY.cpu_group(rule)


def model_settings(model):
    return STUDY.model_settings(model)


def model_prompt_settings(model):
    return STUDY.prompt_settings(model)


def model_source_settings(model):
    return STUDY.source_settings(model)


def model_check_settings(model):
    return STUDY.check_settings(model)


def report_settings(shown=()):
    return STUDY.report_settings(shown)


def dataset_files(_wildcards=None):
    return STUDY.dataset_files()


def reference_files(_wildcards=None):
    return STUDY.reference_files()


def shard_files(wildcards):
    return STUDY.shard_files(wildcards.model)


def generation_files(_wildcards=None):
    return STUDY.generation_files()


def infer_benchmark_files(_wildcards=None):
    return STUDY.infer_benchmark_files()


def prompt_files(_wildcards=None):
    return STUDY.prompt_files()


def score_files(_wildcards=None):
    return STUDY.score_files()


def model_gpus(wildcards):
    return STUDY.gpus(wildcards.model)


def model_gpu_type(wildcards):
    return STUDY.gpu_type(wildcards.model)


def infer_threads(wildcards):
    return STUDY.infer_threads(wildcards.model)


def infer_mem_mb(wildcards, input):
    return STUDY.infer_mem_mb(wildcards.model, input.manifest)


def infer_runtime(wildcards):
    return STUDY.infer_runtime(wildcards.model, int(wildcards.nshards))


def report_placement():
    """One line: which rules run on the submit host, which become cluster jobs (main process only)."""
    if workflow.remote_exec:
        return
    rules = [
        (r.name, r.group is None and r.name in workflow._localrules)
        for r in workflow.rules
    ]
    print(placement_line(rules), file=sys.stderr)

# The workflow's view of the study: procexec.cluster.workflow.Study (plain Python,
# unit-tested) built once from Snakemake's merged config as STUDY, whose methods the
# rules call for their inputs, parameters and resources.  No rules live here
# (snakemake --lint).  Rerun semantics: the module's docstring and docs/workflow.md.

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
from procexec.cluster.study_stages import checks_dirs
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
# On the submit host the full stage within its budget and the nodes' memory; the
# pilot's measurement read once (a damaged one is one line, not an exception inside an
# input function).  check-config runs the same checks (Study.checked).
try:
    STUDY.check_start(submit_host=not workflow.remote_exec)
except ProcexecError as exc:
    stop(exc)
for _env in missing_environments(workflow.basedir):
    stop(f"rules/{_env}: the conda environment file is missing from the checkout")

# The commands read the merged config from this file; it is written when the workflow
# starts running jobs (Snakefile's onstart), never while parsing (-n, --lint).
CONFIG_FILE = STUDY.config_file
# The stage's outputs and logs (results/ and logs/ for the full study; results/<stage>/ otherwise).
RESULTS = STUDY.results
LOGS = STUDY.logs
# The model checks this stage reads: the full study's for the pilot (the same contexts), the smoke's own.
CHECKS, CHECK_LOGS = checks_dirs(STUDY.config)
DATASETS = STUDY.datasets
PROMPT_EXAMPLE = STUDY.prompt_example
VLLM_MODELS = STUDY.in_process_models
ENDPOINT_MODELS = STUDY.endpoint_models
IMPORTED_MODELS = STUDY.imported_models
SUITE_SETTINGS = STUDY.suite_settings()


# What a generation job asks SLURM for (rules infer and infer_speculative), from the model's
# layout on cluster.hardware (procexec.cluster.layouts; docs/cluster.md): GPUs, CPUs per GPU,
# host memory by checkpoint, runtime by its share of the work.  A layout wider than one node
# is one job over its nodes: --nodes, one task per node, the GPUs per node (--gres), and a
# shell that runs as it is (the plugin's `mpi` path) and starts the head's step itself
# (params head_step); the other nodes' steps are the job's (procexec.engine.multinode).
INFER_RESOURCES = dict(
    gpu=lambda wildcards: STUDY.job_gpus(wildcards.model),
    gpu_model=lambda wildcards: STUDY.gpu_type(wildcards.model),
    nodes=lambda wildcards: STUDY.nodes(wildcards.model),
    gres=lambda wildcards: STUDY.gres(wildcards.model),
    tasks=lambda wildcards: STUDY.tasks(wildcards.model),
    tasks_per_gpu=lambda wildcards: STUDY.tasks_per_gpu(wildcards.model),
    mpi=lambda wildcards: STUDY.mpi(wildcards.model),
    mem_mb=lambda wildcards, input: STUDY.infer_mem_mb(wildcards.model, input.manifest),
    runtime=lambda wildcards: STUDY.infer_runtime(
        wildcards.model, int(wildcards.nshards)
    ),
    # SIGTERM two minutes before the time limit: the job keeps what finished and exits
    slurm_extra="--signal=TERM@120",
)


# Before any rule is defined (they apply to rules defined after them).
wildcard_constraints:
    dataset=DATASET_ID.pattern,
    model=MODEL_KEY.pattern,
    shard=r"[0-9]+",
    nshards=r"[0-9]+",


# Snakemake's localrules, the rules that run on the submit host whatever the profile: the
# targets; model staging and its checks (the hub and the shared filesystem, before any GPU
# is held); an endpoint model's job (requests only); the CPU rules the study stage keeps there.
# Under a cluster profile every other rule is a cluster job.  One list, which
# report_placement() reads too.
LOCAL_RULES = [
    "all",
    "release",
    "prepare_model",
    "show_prompt",
    "check_model",
    "infer_endpoint",
    *STUDY.local_cpu_rules(),
]
workflow.localrules(*LOCAL_RULES)


def report_placement():
    """One line: which rules run on the submit host, which become cluster jobs (main process only)."""
    if workflow.remote_exec:
        return
    rules = [
        (r.name, r.group is None and r.name in LOCAL_RULES) for r in workflow.rules
    ]
    print(placement_line(rules), file=sys.stderr)

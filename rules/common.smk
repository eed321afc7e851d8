# Shared definitions used by the rules/*.smk files -- the validated config, dataset and
# model ids, the per-rule "settings" parameters that decide reruns, input
# functions and resources.  No rules live here (snakemake --lint).
#
# Rerun semantics (see docs/workflow.md):
#   * all rules are `shell:` rules calling a stable `procexec ...` command, so
#     editing package code never reruns anything (Snakemake compares the
#     unformatted command text, not the code it calls);
#   * each rule's `params.settings` is a canonical JSON string of ONLY the
#     settings its output depends on (compared by repr by Snakemake);
#   * the merged config file the commands read is passed as a pathlib.Path,
#     which Snakemake does not record as a parameter, so its name may change
#     with the content without rerunning anything.

import hashlib
import json
import os
import re
import sys
from pathlib import Path

from procexec.config import check_endpoint_keys, expand_suite, prepare
from procexec.cluster.cost import shard_runtime_minutes
from procexec.errors import ProcexecError
from procexec.inference.settings import (
    canonical_sha256,
    output_settings,
    prompt_settings,
    source_settings,
)
from procexec.inference.staging import lock_generation
from procexec.records import DATASET_ID, MODEL_KEY

# Dataset ids as procexec.benchmark.suite.DatasetSpec.id writes them; model keys as the schema allows.
DATASET_RE = DATASET_ID.pattern
MODEL_RE = MODEL_KEY.pattern


# Conda environments (paths relative to rules/; used with --software-deployment-method
# conda).  GPU rules (prepare_model, infer) use the inference environment.
ANALYSIS_ENV = "../envs/analysis.yaml"
INFERENCE_ENV = next(
    (
        f"../envs/{name}"
        for name in ("inference-cuda.yaml", "inference.yaml")
        if Path(workflow.basedir, "envs", name).exists()
    ),
    ANALYSIS_ENV,
)

# Bootstrap settings of `procexec aggregate` (part of its params).
AGGREGATE_RESAMPLES = 1000
AGGREGATE_SEED = 0


def canonical(obj):
    """Repr-stable text for params: sorted keys, no whitespace variation."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def validated_config(raw, sources):
    """procexec.config.prepare on Snakemake's merged config; a bad key stops the workflow (stop: preflight.smk)."""
    try:
        return prepare(raw, " + ".join(sources) or "config")
    except ProcexecError as exc:
        stop(exc)


def write_merged_config(raw):
    """Write the merged (not yet defaulted) config once per content; return its path.

    The `procexec` commands take `--config FILE`; Snakemake's merged config
    (config.yaml + every --configfile) exists only in memory, so it is written
    to results/config/<sha>.json (JSON is YAML).  The name follows the content,
    so concurrent runs with different configs never see each other's file.
    """
    text = json.dumps(raw, sort_keys=True, indent=1) + "\n"
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path("results", "config", f"{digest}.json")
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def setup_workflow(raw, sources):
    """Validate, then derive everything the rules need.  Returns (prepared config, config path)."""
    prepared = validated_config(raw, sources)
    if not expand_suite(prepared["suite"]):
        stop("suite: the suite expands to no dataset (suite.datasets, suite.families)")
    try:
        check_endpoint_keys(
            prepared
        )  # an endpoint's API key must be there before any job
    except ProcexecError as exc:
        stop(exc)
    return prepared, write_merged_config(raw)


# Config sources for messages, in merge order: workflow.configfiles lists the
# --configfile overlays first and config.yaml (via Snakemake's source cache) last.
_SOURCES = [Path(f).name for f in workflow.configfiles]
PCFG, CONFIG_FILE = setup_workflow(config, _SOURCES[-1:] + _SOURCES[:-1])

DATASETS = [spec.id for spec in expand_suite(PCFG["suite"])]
# The example whose prompt each model renders on the submit host (rule show_prompt).
PROMPT_EXAMPLE = f"{DATASETS[0]}:{PCFG['suite']['lengths'][0]}:0"
MODELS = PCFG["models"]
RUN_MODELS = list(PCFG["run_models"])
# Rule infer runs the in-process vLLM backend; infer_endpoint the `backend: openai` models.
VLLM_MODELS = [m for m in MODELS if MODELS[m]["backend"] == "vllm"]
ENDPOINT_MODELS = [m for m in MODELS if MODELS[m]["backend"] == "openai"]


def alternatives(keys):
    """A wildcard constraint matching exactly these keys (and nothing when there are none)."""
    return "|".join(re.escape(k) for k in keys) or "(?!)"


# Before any rule is defined (they apply to rules defined after them).
wildcard_constraints:
    dataset=DATASET_RE,
    model=MODEL_RE,
    shard=r"[0-9]+",
    nshards=r"[0-9]+",


# What a dataset file depends on: the suite's seed and sizes (its id carries the rest).
SUITE_SETTINGS = canonical(
    {
        "seed": PCFG["suite"]["seed"],
        "lengths": PCFG["suite"]["lengths"],
        "examples_per_length": PCFG["suite"]["examples_per_length"],
    }
)


def model_settings(model):
    """What decides ONE model's generations (procexec.inference.settings, also the store key's source).

    Adding another model or changing another model's entry leaves this text,
    and so this model's jobs, untouched.
    """
    settings = output_settings(MODELS[model], PCFG["inference"])
    digest = canonical_sha256({**settings, "lock": LOCK_GENERATIONS.get(model)})
    return f"{model}:sha256={digest}"


def lock_generations():
    """model key -> how often its hub lock was moved on purpose (`procexec lock-models --update`).

    A rerun parameter of prepare_model and infer: the first staging writes the lock
    without changing it, a deliberate move reruns exactly that model.
    """
    lock = Path(PCFG["model_lock"])
    generations = {}
    for key in RUN_MODELS:
        if MODELS[key]["source"] == "hf":
            try:
                generations[key] = lock_generation(lock, MODELS[key])
            except ProcexecError as exc:
                stop(exc)
    return generations


LOCK_GENERATIONS = lock_generations()


def model_prompt_settings(model):
    """What the rendered prompt of rule show_prompt depends on (a subset of model_settings)."""
    settings = prompt_settings(MODELS[model], PCFG["inference"])
    return canonical({**settings, "lock": LOCK_GENERATIONS.get(model)})


def model_source_settings(model):
    """What the prepared model folder/manifest depends on (source, files, lock moves)."""
    return canonical(
        {**source_settings(MODELS[model]), "lock": LOCK_GENERATIONS.get(model)}
    )


def report_settings(shown=()):
    """Model metadata shown by figures/tables/report (run_models only), plus ``shown`` fields, and the suite."""
    keys = ("abbrev", "name", "hf_id", "params", "group", *shown)
    return canonical(
        {
            "run_models": RUN_MODELS,
            "models": {m: {k: MODELS[m].get(k) for k in keys} for m in RUN_MODELS},
            "suite": PCFG["suite"],
        }
    )


def shard_ids(model):
    """Shard names "I-of-N", I = 1..N as `procexec infer --shard` counts them."""
    n = MODELS[model]["shards"]
    return [f"{i}-of-{n}" for i in range(1, n + 1)]


def dataset_files(_wildcards=None):
    return expand("results/datasets/{dataset}.jsonl", dataset=DATASETS)


def reference_files(_wildcards=None):
    return expand("results/references/{dataset}.jsonl", dataset=DATASETS)


def shard_files(wildcards):
    return expand(
        "results/generations/{model}/shards/{shard}.jsonl.gz",
        model=wildcards.model,
        shard=shard_ids(wildcards.model),
    )


def generation_files(_wildcards=None):
    return expand(
        "results/generations/{model}/{dataset}.jsonl.gz",
        model=RUN_MODELS,
        dataset=DATASETS,
    )


def infer_benchmark_files(_wildcards=None):
    """The per-shard benchmark files of every run model (the report sums them into GPU-hours)."""
    return [
        f"results/benchmarks/infer/{model}/{shard}.tsv"
        for model in RUN_MODELS
        for shard in shard_ids(model)
    ]


def prompt_files(_wildcards=None):
    return expand("results/prompts/{model}.json", model=RUN_MODELS)


def score_files(_wildcards=None):
    return expand(
        "results/scores/{model}/{dataset}.parquet",
        model=RUN_MODELS,
        dataset=DATASETS,
    )


def ids_of(paths, suffix):
    """Dataset ids from input file paths (a derived param: not a rerun trigger)."""
    return " ".join(Path(p).name.removesuffix(suffix) for p in paths)


def dir_of(paths):
    return str(Path(paths[0]).parent)


# --------------------------------------------------------------------------- where jobs run
#
# Site settings (config `cluster:`, docs/cluster.md).  Resources are not rerun triggers.
CLUSTER = PCFG["cluster"]
# CPU rules run on the submit host (the whole CPU side of the study takes minutes), or,
# with cluster.cpu_jobs: grouped, as two group jobs on the cluster (suite, analysis).
CPU_RULES = {
    "generate": "suite",
    "execute": "suite",
    "card": "suite",
    "table4": "suite",
    "collect": "analysis",
    "score": "analysis",
    "aggregate": "analysis",
    "figures": "analysis",
    "tables": "analysis",
    "report": "analysis",
}
if CLUSTER["cpu_jobs"] == "submit-host":
    workflow.localrules(*CPU_RULES)


def report_placement():
    """One line: which rules run on the submit host, which become cluster jobs (main process only)."""
    if workflow.remote_exec:
        return
    local = sorted(
        r.name
        for r in workflow.rules
        if r.group is None and r.name in workflow._localrules
    )
    cluster = sorted(r.name for r in workflow.rules if r.name not in local)
    print(
        f"procexec workflow: submit host: {', '.join(local)}; cluster jobs: {', '.join(cluster)}",
        file=sys.stderr,
    )


def cpu_group(rule):
    """The rule's group job under cpu_jobs: grouped (None: it runs on the submit host)."""
    return None if CLUSTER["cpu_jobs"] == "submit-host" else CPU_RULES[rule]


def model_gpus(wildcards):
    return int(MODELS[wildcards.model]["gpus"])


def model_gpu_type(wildcards):
    # The slurm plugin adds --gpus=<type>:<n> to any job with a gpu_model: none for CPU models,
    # none where the site names no type (--gpus=<n>).
    return (CLUSTER["gpu_type"] or "") if model_gpus(wildcards) > 0 else ""


def infer_threads(wildcards):
    # CPU models run vLLM's CPU engine on 2 cores; GPU jobs get cpus_per_gpu per GPU
    # (tokenisation, detokenisation, the store's writer).
    gpus = model_gpus(wildcards)
    return 2 if gpus == 0 else CLUSTER["cpus_per_gpu"] * gpus


def infer_mem_mb(wildcards, input):
    """Host memory scaled with the checkpoint: the staged files' size, or checkpoint_gb before staging."""
    model = MODELS[wildcards.model]
    manifest = Path(input.manifest)
    size = model.get("checkpoint_gb", 1) * 1e9
    try:  # the staged size once prepare_model ran (its manifest is checked where it is used)
        files = json.loads(manifest.read_text()).get("files", {})
        size = sum(f["size"] for f in files.values() if isinstance(f, dict)) or size
    except (OSError, ValueError, AttributeError, TypeError, KeyError):
        pass
    gb = max(CLUSTER["min_mem_gb"], CLUSTER["mem_per_checkpoint"] * size / 1e9)
    return int(gb * 1000)


def infer_runtime(wildcards):
    """Minutes for one shard: its share of the expected decode (procexec.cluster.cost), within the partition limit."""
    suite = PCFG["suite"]
    return shard_runtime_minutes(
        MODELS[wildcards.model],
        PCFG["inference"],
        suite["lengths"],
        suite["examples_per_length"],
        len(DATASETS),
        int(wildcards.nshards),
        CLUSTER["max_runtime_minutes"],
    )


def model_check_settings(model):
    """What check_model's output depends on: the engine fields, max_model_len, max_context, the lock.

    A subset of infer's model_settings, never more: a rerun here makes check.json newer
    than the shards, which reruns infer.  (gpus, tensor_parallel_size and checkpoint_gb
    change only the estimate of sequences that fit: no rerun; run check-model by hand.)
    """
    from procexec.inference.settings import MODEL_FIELD_ROLES

    entry = MODELS[model]
    fields = [n for n, role in MODEL_FIELD_ROLES.items() if role == "engine"]
    settings = {n: entry.get(n) for n in [*fields, "max_model_len", "max_context"]}
    return canonical({**settings, "lock": LOCK_GENERATIONS.get(model)})

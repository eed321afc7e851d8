"""What the Snakemake workflow derives from the config: ids, rerun settings, file lists, resources.

``rules/common.smk`` builds one ``Study`` from Snakemake's merged config and
hands its methods to the rules; everything here is plain Python, unit-tested
without Snakemake (``tests/cluster/test_workflow_study.py``).

Rerun semantics (docs/workflow.md):

* every rule is a ``shell:`` rule calling a stable ``procexec ...`` command, so
  editing package code never reruns anything (Snakemake compares the command
  text, not the code it calls);
* each rule's ``params.settings`` is canonical text of ONLY the settings its
  output depends on (``*_settings`` below; Snakemake compares params by repr);
* resources (GPUs, memory, runtime) are never params: changing them reruns nothing;
* the merged config the commands read is passed as a ``pathlib.Path``, which
  Snakemake does not record as a parameter, so its name may change with its
  content without rerunning anything.  It is written by the workflow's
  ``onstart`` handler (``write_merged_config``), never while the Snakefile is
  parsed: a dry run or ``--lint`` writes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from procexec.benchmark.suite import expand_suite
from procexec.cluster.cost.catalog import catalog_for
from procexec.cluster.cost.measured import read_measured
from procexec.cluster.cost.projection import Projection, project_model
from procexec.cluster.cost.report import budget_checks
from procexec.cluster.cost.runtime import runtime_minutes, shard_runtime_minutes
from procexec.cluster.layouts import NodeLayout, kernel_refusal, node_layout, planned
from procexec.cluster.study_stages import logs_dir, pilot_speculation, results_dir, speculative_models, stage_of, staged
from procexec.config import check_endpoint_keys, harness_log_files, lm_eval_results_file, prepare, read_merged
from procexec.config.guard import configured_guard, evaluated_guard
from procexec.config.hardware import Gpu, gres_type, selected_gpu
from procexec.config.keys import (
    MODEL_FIELD_ROLES,
    OPTIONAL_MODEL_FIELDS,
    canonical_sha256,
    output_settings,
    prompt_settings,
    source_settings,
)
from procexec.config.model import Cluster, Config, ImportedModel, ModelBase
from procexec.errors import ProcexecError
from procexec.preparation.prepare import Manifest
from procexec.preparation.staging import lock_generation
from procexec.scoring.score import SCORE_COLUMNS
from procexec.scoring.truncation import TRUNCATION_CHECK_VERSION

#: Conda environments of the rules, relative to rules/ (``--software-deployment-method conda``).
ANALYSIS_ENV = "../envs/analysis.yaml"
INFERENCE_ENV = "../envs/inference-cuda.yaml"  # the GPU rules (prepare_model, show_prompt, check_model, infer)

#: Bootstrap settings of ``procexec aggregate`` (part of its params).
AGGREGATE_RESAMPLES = 1000
AGGREGATE_SEED = 0

#: The score files' columns, as a param of rule ``score``: a release that adds a score column rescores
#: (readers refuse score files of other columns), and a code change that does not, does not.
SCORE_FORMAT = canonical_sha256(SCORE_COLUMNS)[:16]

#: CPU rules run on the submit host (the whole CPU side of the study takes minutes), or, with
#: ``cluster.cpu_jobs: grouped``, as two group jobs on the cluster (suite, analysis).
CPU_RULES = {
    "generate": "suite",
    "execute": "suite",
    "card": "suite",
    "table4": "suite",
    "collect": "analysis",
    "import_harness": "analysis",
    "score": "analysis",
    "aggregate": "analysis",
    "figures": "analysis",
    "tables": "analysis",
    "report": "analysis",
    "speculative_pilot": "analysis",
    "loops": "analysis",
    "pilot_cost": "analysis",
    "release_suite": "suite",
    "release_generations": "analysis",
}


def canonical(obj: Any) -> str:
    """Repr-stable text for params: sorted keys, no whitespace variation."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def merged_config_text(raw: dict[str, Any]) -> str:
    """The merged (not yet defaulted) config as the commands read it (JSON is YAML)."""
    return json.dumps(raw, sort_keys=True, indent=1) + "\n"


def merged_config_path(raw: dict[str, Any]) -> Path:
    """``results/config/<sha>.json``: the name follows the content, so concurrent runs never share a file."""
    digest = hashlib.sha256(merged_config_text(raw).encode()).hexdigest()[:16]
    return Path("results", "config", f"{digest}.json")


def write_merged_config(raw: dict[str, Any]) -> Path:
    """Write the merged config once per content (atomically); returns its path."""
    text, path = merged_config_text(raw), merged_config_path(raw)
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)
    return path


def missing_environments(basedir: str | Path) -> list[str]:
    """The rules' conda environment files that are not in the checkout (a missing one is an error, never a fallback)."""
    rules = Path(basedir, "rules")
    return [env for env in (ANALYSIS_ENV, INFERENCE_ENV) if not (rules / env).resolve().is_file()]


def ids_of(paths: Sequence[str], suffix: str) -> str:
    """Dataset ids from input file paths (a derived param: not a rerun trigger)."""
    return " ".join(Path(p).name.removesuffix(suffix) for p in paths)


def dir_of(paths: Sequence[str]) -> str:
    return str(Path(paths[0]).parent)


def alternatives(keys: Sequence[str]) -> str:
    """A wildcard constraint matching exactly these keys (and nothing when there are none)."""
    return "|".join(re.escape(k) for k in keys) or "(?!)"


def _plain_mappings(value: Any) -> Any:
    """Snakemake's config with plain dicts for its ``OrderedDict``s (its JSON reader's), so that a refusal
    shows a value as check-config shows it (``{}``, not ``OrderedDict()``)."""
    if isinstance(value, dict):
        return {key: _plain_mappings(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain_mappings(item) for item in value]
    return value


@dataclass
class Study:
    """The validated study and everything the rules derive from it."""

    config: Config
    raw: dict[str, Any]  # the study stage's merged config as the commands read it (``write_merged_config``)
    datasets: list[str]
    lock_generations: dict[str, int] = field(default_factory=dict)
    source: str = "config"  # the config files it was read from, as refusals name them
    #: the merged config before the study stage's rewrite: the full study, which the pilot's cost projects
    full_raw: dict[str, Any] = field(default_factory=dict)
    _projections: dict[tuple[Path, str], Projection] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_config(cls, raw: dict[str, Any], source: str = "config") -> Study:
        """Validate Snakemake's merged config (one ``ProcexecError`` line per problem) and derive the study
        of the stage it names (``procexec.cluster.study_stages``)."""
        full_raw, raw = raw, staged(_plain_mappings(raw), source)
        config = planned(prepare(raw, source), source)
        datasets = [spec.id for spec in expand_suite(config.suite)]
        if not datasets:
            raise ProcexecError("suite: the suite expands to no dataset (suite.datasets, suite.families)")
        check_endpoint_keys(config)  # an endpoint's API key must be there before any job
        lock = Path(config.model_lock)
        generations = {
            key: lock_generation(lock, config.models[key])
            for key in config.run_models
            if config.models[key].source == "hf" and config.models[key].generates_here
        }
        return cls(config, raw, datasets, generations, source, full_raw=full_raw)

    @property
    def config_file(self) -> Path:
        """The merged config the commands read (``--config``), written by ``write_merged_config``."""
        return merged_config_path(self.raw)

    @property
    def stage(self) -> str:
        return stage_of(self.config)

    @property
    def results(self) -> Path:
        """The study stage's outputs (``results`` for the full study); staged models, prompts and the
        generation stores are shared by every study stage and stay in ``results``."""
        return results_dir(self.config)

    @property
    def logs(self) -> Path:
        return logs_dir(self.config)

    def projection(self, model: str, results: Path = Path("results")) -> Projection:
        """``procexec cost``'s projection of one model: measured from what a pilot stored under ``results``
        (its own store segments: bounded, however much the full study has stored since), else the stated
        output model.  Computed once per model (a DAG build asks for it per generation job; a cluster job's
        own DAG for its model alone)."""
        if (results, model) not in self._projections:
            measured = read_measured(results / "generations" / model / "store", pilot_only=True)
            self._projections[results, model] = project_model(self.config, model, len(self.datasets), measured)
        return self._projections[results, model]

    def kernel_refusal(self) -> str | None:
        """Why no generation job may be submitted: vLLM 0.32 has no kernels for a run model on ``cluster.hardware``
        (DS-685's sparse attention on an A100: ``procexec.cluster.layouts``)."""
        return kernel_refusal(self.config, self.config.plans, self.generated_models)

    def budget_refusal(self, results: Path = Path("results")) -> str | None:
        """Why the full stage must not start: its projected GPU-hours (``projection``) exceed
        ``cluster.gpu_hours_budget``.  None: go (the other study stages always go: they are how the projection gets
        measured).
        """
        if self.stage != "full" or not (
            self.cluster.gpu_hours_budget is not None or self.cluster.model_gpu_hours_budgets
        ):
            return None
        rows = [self.projection(model, results) for model in self.generated_models]
        over = [check for check in budget_checks(self.config, rows) if check.over]
        if not over:
            return None
        return (
            f"{'; '.join(c.line for c in over)}: the full stage does not start (`procexec cost --config CONFIG "
            f"--measured {results}`; run the pilot first, raise the budget, or leave the model out)"
        )

    def check_start(self, submit_host: bool = True) -> None:
        """The workflow's refusals beyond the config's own (rules/common.smk; ``check-config`` runs the same, so
        its verdict is ``snakemake -n``'s): on the submit host, a run model without vLLM kernels on the cluster's
        GPU, the full stage over its GPU-hour budget or a generation job asking more host memory than a node has;
        in any process of the full stage, a pilot's measurement that cannot be read (one line, not a frame of an
        input function).  Raises ProcexecError."""
        if submit_host:
            for refusal in (self.kernel_refusal(), self.budget_refusal(), self.host_memory_refusal()):
                if refusal:
                    raise ProcexecError(f"{self.source}: {refusal}")
        if self.stage == "full":
            for model in self.generated_models:
                self.projection(model)

    @classmethod
    def checked(cls, paths: Sequence[str | Path]) -> Study:
        """``check-config``'s verdict on ``config.yaml`` and its overlays: each file read as Snakemake reads it
        (``procexec.config.read_yaml``), merged as it merges them, and the study refused as the workflow refuses
        it on the submit host (``from_config``, ``check_start``)."""
        study = cls.from_config(read_merged(list(paths)), " + ".join(Path(p).name for p in paths))
        study.check_start()
        return study

    # ------------------------------------------------------------------ ids

    @property
    def models(self) -> Mapping[str, ModelBase]:
        return self.config.models

    @property
    def run_models(self) -> list[str]:
        return list(self.config.run_models)

    @property
    def generated_models(self) -> list[str]:
        """The run models this study generates for (``Config.generated_models``)."""
        return self.config.generated_models

    @property
    def in_process_models(self) -> list[str]:
        """Models of rule ``infer``: those whose engine runs inside the job (vLLM in-process, or the job's own
        vLLM server: both GPU jobs)."""
        return [m for m, entry in self.models.items() if entry.runs_in_job]

    @property
    def endpoint_models(self) -> list[str]:
        """Models of rule ``infer_endpoint`` (requests from the submit host)."""
        return [m for m, entry in self.models.items() if not entry.runs_in_job and entry.generates_here]

    @property
    def imported_models(self) -> list[str]:
        """Models of rule ``import_harness``: their records are read from a harness's logs."""
        return [m for m, entry in self.models.items() if not entry.generates_here]

    def harness_logs(self, model: str) -> list[str]:
        """The log files an imported model's ``lm_eval`` or ``inspect`` items match (the import's inputs)."""
        entry = self.models[model]
        assert isinstance(entry, ImportedModel), model
        return [str(path) for pattern in entry.log_patterns for path in harness_log_files(pattern)]

    def harness_run_files(self, model: str) -> list[str]:
        """lm-eval's results file of each of an imported model's samples files, which the prompt check reads for
        the run's max_length (with ``model_dir`` only)."""
        entry = self.models[model]
        assert isinstance(entry, ImportedModel), model
        if entry.model_dir is None or not entry.lm_eval:
            return []
        return sorted({str(lm_eval_results_file(Path(path))) for path in self.harness_logs(model)})

    def import_options(self, model: str) -> str:
        """``import-harness``'s options before the logs: the harness's flag, and the prompt check's folder."""
        entry = self.models[model]
        assert isinstance(entry, ImportedModel), model
        check = f"--model-dir {shlex.quote(entry.model_dir)} " if entry.model_dir else ""
        return f"{check}--{entry.harness}"

    @property
    def prompt_example(self) -> str:
        """The example whose prompt each model renders on the submit host (rule show_prompt)."""
        return f"{self.datasets[0]}:{self.config.suite.lengths[0]}:0"

    def shard_ids(self, model: str) -> list[str]:
        """Shard names "I-of-N", I = 1..N as ``procexec infer --shard`` counts them."""
        n = self.models[model].shards
        return [f"{i}-of-{n}" for i in range(1, n + 1)]

    # ------------------------------------------------------------------ rerun settings (params)

    def suite_settings(self) -> str:
        """What a dataset file depends on: the suite's seed and sizes (its id carries the rest)."""
        suite = self.config.suite
        return canonical(
            {"seed": suite.seed, "lengths": suite.lengths, "examples_per_length": suite.examples_per_length}
        )

    def model_settings(self, model: str) -> str:
        """What decides ONE model's generations (procexec.config.keys, the store key's source).

        Adding another model or changing another model's entry leaves this text,
        and so this model's jobs, untouched.
        """
        settings = output_settings(self.models[model], self.config.inference)
        # which attempts 1 get a rerun is scoring's call, versioned (procexec.scoring.truncation)
        digest = canonical_sha256(
            {**settings, "lock": self.lock_generations.get(model), "truncation_check": TRUNCATION_CHECK_VERSION}
        )
        return f"{model}:sha256={digest}"

    def prompt_settings(self, model: str) -> str:
        """What the rendered prompt of rule show_prompt depends on (a subset of model_settings)."""
        settings = prompt_settings(self.models[model], self.config.inference)
        return canonical({**settings, "lock": self.lock_generations.get(model)})

    def source_settings(self, model: str) -> str:
        """What the prepared model folder/manifest depends on (source, files, lock moves)."""
        return canonical({**source_settings(self.models[model]), "lock": self.lock_generations.get(model)})

    def check_settings(self, model: str) -> str:
        """What check_model's output depends on: the engine fields, max_model_len, max_context, the lock.

        A subset of infer's model_settings, never more: a rerun here makes check.json newer
        than the shards, which reruns infer.  (gpus and checkpoint_gb change only the estimate
        of sequences that fit: no rerun; run check-model by hand.)
        """
        entry = self.models[model]
        names = [
            n
            for n, role in MODEL_FIELD_ROLES.items()
            if role == "engine" and (n not in OPTIONAL_MODEL_FIELDS or getattr(entry, n, None) is not None)
        ] + ["max_model_len", "max_context"]
        # a variant without the field (an endpoint's fields on a vLLM model) states it as null
        return canonical({**{n: getattr(entry, n, None) for n in names}, "lock": self.lock_generations.get(model)})

    def report_settings(self, shown: Sequence[str] = ()) -> str:
        """Model metadata shown by figures/tables/report (run_models only), plus ``shown`` fields, and the suite."""
        keys = ("abbrev", "name", "hf_id", "params", "group", *shown)
        return canonical(
            {
                "run_models": self.run_models,
                "models": {m: {k: getattr(self.models[m], k, None) for k in keys} for m in self.run_models},
                "suite": self.config.suite,
            }
        )

    # ------------------------------------------------------------------ files

    def dataset_files(self) -> list[str]:
        return [f"{self.results}/datasets/{d}.jsonl" for d in self.datasets]

    def reference_files(self) -> list[str]:
        return [f"{self.results}/references/{d}.jsonl" for d in self.datasets]

    def shard_files(self, model: str) -> list[str]:
        return [f"{self.results}/generations/{model}/shards/{s}.jsonl.gz" for s in self.shard_ids(model)]

    @property
    def speculative_models(self) -> list[str]:
        """Models whose pilot slice is generated with drafting too (``pilot_speculative``; rules/speculative.smk)."""
        return speculative_models(self.config)

    def speculative_settings(self, model: str) -> str:
        """What the speculative half's generations depend on: the model's own settings and the drafting."""
        return canonical(
            {"model": self.model_settings(model), "speculative_config": pilot_speculation(self.config, model)}
        )

    def speculative_shard_files(self, model: str) -> list[str]:
        return [f"{self.results}/generations/{model}/speculative/shards/{s}.jsonl.gz" for s in self.shard_ids(model)]

    def speculative_files(self) -> list[str]:
        """The pilot's speculative figures per model (the report's ``--speculative``; none unless asked)."""
        return [f"{self.results}/speculative/{m}.json" for m in self.speculative_models]

    @property
    def full_config_file(self) -> Path:
        """The merged config of the full study (the study stage's before its rewrite), which ``pilot_cost`` projects."""
        return merged_config_path(self.full_raw or self.raw)

    def model_generation_files(self, model: str) -> list[str]:
        return [f"{self.results}/generations/{model}/{d}.jsonl.gz" for d in self.datasets]

    def guard_settings(self, model: str) -> str:
        """What a model's loop figures depend on besides its generations: the guard evaluated for it."""
        return canonical(evaluated_guard(self.models[model], self.config.inference))

    def loop_files(self) -> list[str]:
        """The report's ``--loops``: in the pilot, every generated model's figures (rules/loops.smk); in the full
        stage, the pilot's figures of each model whose reruns the config guards, where the pilot wrote them."""
        if self.stage == "pilot":
            return [f"{self.results}/loops/{m}.json" for m in self.generated_models]
        if self.stage != "full":
            return []
        pilot = results_dir(self.config.model_copy(update={"stage": "pilot"}))
        guarded = [m for m in self.generated_models if configured_guard(self.models[m], self.config.inference)[0]]
        return [str(path) for m in guarded if (path := pilot / "loops" / f"{m}.json").is_file()]

    def pilot_cost_files(self) -> list[str]:
        """The report's ``--cost``: the pilot's projection of the full study (rules/loops.smk; none elsewhere)."""
        return [f"{self.results}/cost.json"] if self.stage == "pilot" else []

    def generation_files(self) -> list[str]:
        return [f"{self.results}/generations/{m}/{d}.jsonl.gz" for m in self.run_models for d in self.datasets]

    def infer_benchmark_files(self) -> list[str]:
        """The per-shard benchmark files of every run model (the report sums exactly these into GPU-hours)."""
        return [
            f"{self.results}/benchmarks/infer/{m}/{s}.tsv" for m in self.generated_models for s in self.shard_ids(m)
        ]

    def prompt_files(self) -> list[str]:
        """Rendered prompts: shared by every stage (they depend on the model, never on the stage); an imported
        model's engine ran elsewhere (its lm-eval prompts are checked by the import, with ``model_dir``)."""
        return [f"results/prompts/{m}.json" for m in self.generated_models]

    def score_files(self) -> list[str]:
        return [f"{self.results}/scores/{m}/{d}.parquet" for m in self.run_models for d in self.datasets]

    # ------------------------------------------------------------------ where jobs run, with what

    @property
    def cluster(self) -> Cluster:
        """Site settings (config ``cluster:``, docs/cluster.md)."""
        return self.config.cluster

    def local_cpu_rules(self) -> list[str]:
        """CPU rules that run on the submit host (all of them unless ``cluster.cpu_jobs: grouped``)."""
        return list(CPU_RULES) if self.cluster.cpu_jobs == "submit-host" else []

    def cpu_group(self, rule: str) -> str | None:
        """The rule's group job under ``cpu_jobs: grouped`` (None: it runs on the submit host)."""
        return None if self.cluster.cpu_jobs == "submit-host" else CPU_RULES[rule]

    @property
    def gpu(self) -> Gpu:
        """The GPU ``cluster.hardware`` selects (``procexec.config.hardware``)."""
        return selected_gpu(self.cluster)

    def gpus(self, model: str) -> int:
        """GPUs of one generation job of ``model``, on all its nodes."""
        return self.models[model].gpus

    def layout(self, model: str) -> NodeLayout:
        """The model's layout on the selected GPU (planned or pinned: ``procexec.cluster.layouts``)."""
        return node_layout(self.models[model], self.gpu)

    def nodes(self, model: str) -> int:
        """Nodes of one generation job: more than one for a layout wider than a node (vLLM's multi-node data
        parallel, ``procexec.engine.multinode``)."""
        return 1 if self.gpus(model) == 0 else self.layout(model).nodes

    def node_gpus(self, model: str) -> int:
        """GPUs the job holds on each of its nodes."""
        return self.gpus(model) // self.nodes(model)

    def job_gpus(self, model: str) -> int:
        """The ``gpu`` resource, ``--gpus=<type>:<n>`` for the whole job: a one-node job's GPUs; 0 for a job over
        several nodes, whose GPUs are asked per node (``gres``)."""
        return self.gpus(model) if self.nodes(model) == 1 else 0

    def gpu_type(self, model: str) -> str:
        """The slurm plugin adds ``--gpus=<type>:<n>`` to any job with a gpu_model: none for CPU models and jobs
        over several nodes, none where the site names no type (``--gpus=<n>``); the type is the hardware's
        GRES type unless ``cluster.gpu_type`` says otherwise."""
        return (gres_type(self.cluster) or "") if self.job_gpus(model) > 0 else ""

    def gres(self, model: str) -> str | None:
        """A job over several nodes asks its GPUs per node (``--gres=gpu:<type>:<n>``: SLURM's ``--gpus`` counts the
        whole job, and a step on one node inherits that count, which no node holds); None: not such a job."""
        if self.nodes(model) == 1:
            return None
        kind = gres_type(self.cluster)
        return f"gpu:{kind}:{self.node_gpus(model)}" if kind else f"gpu:{self.node_gpus(model)}"

    def tasks(self, model: str) -> int | None:
        """One task per node of a job over several nodes (the plugin's ``--ntasks``); None: not such a job."""
        return self.nodes(model) if self.nodes(model) > 1 else None

    def tasks_per_gpu(self, model: str) -> int | None:
        """0 for a job over several nodes: the plugin would otherwise turn ``tasks`` into ``--ntasks-per-gpu``
        (snakemake_executor_plugin_slurm/submit_string.py, ``get_submit_command``)."""
        return 0 if self.nodes(model) > 1 else None

    def mpi(self, model: str) -> str | None:
        """``srun`` for a job over several nodes: the plugin's job step then runs the rule's shell as it is, not
        inside ``srun -n1 --nodes=1`` on the first node (snakemake_executor_plugin_slurm_jobstep, ``run_job``),
        and the shell starts the head's step itself (``head_step``).  None: not such a job."""
        return "srun" if self.nodes(model) > 1 else None

    def head_step(self, model: str) -> str:
        """For a job over several nodes, the job step the shell runs ``procexec infer`` in on the first node: a
        step, so that SLURM's ``--signal=TERM@120`` (steps only, not the batch shell) reaches it, holding that
        node's GPUs and memory (its CPUs: ``--cpus-per-task={threads}`` in the shell).  The job's other nodes
        get their own steps from the job (``procexec.engine.multinode``).  Empty: a one-node job."""
        if self.nodes(model) == 1:
            return ""
        return f"srun --nodes=1 --ntasks=1 --relative=0 --gres=gpu:{self.node_gpus(model)} --mem=0 --kill-on-bad-exit=1"

    def infer_threads(self, model: str) -> int:
        """CPU models run vLLM's CPU engine on 2 cores; GPU jobs get cpus_per_gpu per GPU of a node
        (tokenisation, detokenisation, the store's writer; per node and task for a job over several nodes)."""
        gpus = self.gpus(model)
        return 2 if gpus == 0 else self.cluster.cpus_per_gpu * self.node_gpus(model)

    def infer_mem_mb(self, model: str, manifest: str | Path) -> int:
        """Host memory per node scaled with the checkpoint: the staged files' size, or checkpoint_gb before
        staging; a job over several nodes reads its share of it on each (``--mem`` is per node)."""
        size = (self.models[model].checkpoint_gb or 1) * 1e9
        try:  # the staged size once prepare_model ran (the job itself refuses a bad manifest, in one line)
            staged_files = Manifest.model_validate_json(Path(manifest).read_bytes()).files
            size = sum(f.size for f in staged_files.values()) or size
        except (OSError, ValidationError):
            pass
        gb = max(self.cluster.min_mem_gb, self.cluster.mem_per_checkpoint * size / 1e9 / self.nodes(model))
        return int(gb * 1000)

    def host_memory_refusal(self) -> str | None:
        """Why no generation job may be submitted: one asks more host memory (``infer_mem_mb``, the staged
        manifest's size where there is one) than ``cluster.node_mem_gb`` says a node has.  SLURM would leave
        it pending for ever ("Requested node configuration is not available") or refuse it."""
        node_gb = self.cluster.node_mem_gb
        if node_gb is None:
            return None
        for model in self.run_models:
            if not self.models[model].runs_in_job:
                continue
            asked = self.infer_mem_mb(model, Path("results/models", model, "manifest.json")) / 1000
            if asked > node_gb:
                return (
                    f"models.{model}: a generation job asks {asked:,.0f} GB of host memory (cluster.mem_per_checkpoint "
                    f"{self.cluster.mem_per_checkpoint} x the checkpoint, at least cluster.min_mem_gb), above "
                    f"cluster.node_mem_gb {node_gb:,}: lower cluster.mem_per_checkpoint or run it on larger nodes"
                )
        return None

    def infer_runtime(self, model: str, nshards: int, results: Path = Path("results")) -> int:
        """Minutes for one shard: its share of the expected decode, within the limit.  In the full stage once a
        pilot measured the model, the measured projection's (``projection``); else the stated output
        model's (procexec.cluster.cost)."""
        cap = self.cluster.max_runtime_minutes
        if self.stage == "full":
            row = self.projection(model, results)
            if row.basis == "measured":
                decode = (row.gpu_hours - row.startup_gpu_hours) / max(row.gpus, 1) / nshards * 3600
                return runtime_minutes(decode, row.startup_s, cap)
        suite = self.config.suite
        return shard_runtime_minutes(
            self.models[model],
            self.config.inference,
            suite.lengths,
            suite.examples_per_length,
            len(self.datasets),
            nshards,
            cap,
            catalog=catalog_for(self.config),
        )


def placement_line(rules: Sequence[tuple[str, bool]]) -> str:
    """One line: which rules run on the submit host, which become cluster jobs ((name, local) pairs)."""
    local = sorted(name for name, is_local in rules if is_local)
    cluster = sorted(name for name, is_local in rules if not is_local)
    return f"procexec workflow: submit host: {', '.join(local)}; cluster jobs: {', '.join(cluster)}"

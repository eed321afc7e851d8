"""Load and validate the workflow configuration (config.yaml).

Validation happens once, up front: JSON-schema errors and cross-field errors
(unknown model keys, tensor parallelism wider than the GPUs asked for, a model
folder that does not exist) are reported with the key path, before any job runs.
YAML is read strictly (``read_yaml``): UTF-8 only, a key written twice in one
mapping is an error (plain YAML lets the last one win), and a syntax error
names the file, line and column.  Every message is one line.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from procexec.benchmark.suite import DatasetSpec, InputSetting
from procexec.errors import ProcexecError
from procexec.io.files import read_text
from procexec.io.jsonl import read_json

#: Backend kinds (the schema's ``backend`` enum): vLLM in the job's process, or an OpenAI-compatible endpoint.
IN_PROCESS, ENDPOINT = "vllm", "openai"
#: vLLM's OpenAI-compatible server started inside the GPU job (data/expert parallel), reached like an endpoint.
SERVER = "vllm-server"


def is_endpoint(model: dict[str, Any]) -> bool:
    """A model served elsewhere: no weights here, no GPU of this study, requests over HTTP."""
    return model.get("backend", IN_PROCESS) == ENDPOINT


_MODEL_DEFAULTS: dict[str, Any] = {
    "revision": "main",
    "source": "hf",
    "tokenizer_mode": "auto",
    "trust_remote_code": False,
    "system_role": True,
    "chat_template_kwargs": {},
    "engine_kwargs": {},
    "dtype": "auto",
    "backend": IN_PROCESS,
    "reasoning": True,  # a thinking phase: long outputs (procexec.cluster.cost, the shard runtimes)
    "throughput_tok_s": 5000,  # sustained decode of one engine; measure one shard and set it
}
# backend: openai only (docs/inference.md); base_url has no default.
_ENDPOINT_DEFAULTS: dict[str, Any] = {
    "served_model": None,  # the endpoint's model id; default: hf_id
    "served_model_check": True,  # a reply naming another model is an error (false: a provider renames models)
    "openai_api": "completions",
    "api_key_env": None,
    "max_concurrency": 8,
    "request_timeout_s": 900,  # streamed: the longest wait for the next event, not for the whole reply
    "stream": True,  # false: a provider without streaming (the timeout then bounds the whole reply)
    "max_retries": 8,
    # Sent with every request.  A vLLM server fills any sampling field a request leaves out from the
    # model's generation_config.json (a repetition penalty changes even greedy output): these pin the
    # neutral values.  Set {} for a provider that refuses fields outside the OpenAI API.
    "request_extra": {"repetition_penalty": 1.0, "top_k": 0, "min_p": 0.0},
}
ENDPOINT_FIELDS = ("base_url", *_ENDPOINT_DEFAULTS)
# An endpoint holds no GPU of this study and its parallelism is its server's: both may be left out.
# tensor_parallel_size 1 keeps the store keys of entries that spelled it (an engine field: settings.py).
_ENDPOINT_RESOURCE_DEFAULTS: dict[str, Any] = {"gpus": 0, "tensor_parallel_size": 1}
# backend: vllm-server only (docs/inference.md, "The server backend"): the job's own server.
_SERVER_DEFAULTS: dict[str, Any] = {
    "serve_args": [],  # the server's own flags after the engine settings, e.g. [--data-parallel-size, "8"]
    "server_start_timeout_s": 3600,  # loading a ~0.7 TB checkpoint from a shared filesystem takes a while
    "max_concurrency": 256,  # requests in flight: enough to fill a data-parallel node's batches
    # The server is the job's own and dies with it: the read timeout only catches a hung server, and a
    # continuation of 130k+ tokens at 20-30 tokens/s per sequence takes hours (the partition's 48 h limit).
    "request_timeout_s": 172800,
    "max_retries": 8,
    "request_extra": {"repetition_penalty": 1.0, "top_k": 0, "min_p": 0.0},
}
#: How a vllm-server model's requests reach its server: the endpoint fields it may set too.
SERVER_CONNECTION_FIELDS = ("max_concurrency", "request_timeout_s", "max_retries", "request_extra")
SERVER_FIELDS = ("serve_args", "server_start_timeout_s")
#: Server flags a vllm-server model may not pass in serve_args: the job sets them, or a model field does
#: (so that the store key and the GPU checks see them).
SERVER_FLAGS_SET_BY_JOB = {
    "--host": None, "--port": None, "--uds": None, "--model": None, "--served-model-name": None,
    "--api-key": None, "--tensor-parallel-size": "tensor_parallel_size", "-tp": "tensor_parallel_size",
    "--max-model-len": "max_model_len", "--dtype": "dtype", "--tokenizer-mode": "tokenizer_mode",
    "--trust-remote-code": "trust_remote_code", "--revision": "revision", "--seed": None,
    "--generation-config": None,
}


#: The fields of vLLM 0.32's ``SpeculativeConfig`` a config may set (``vllm/config/speculative.py``; the
#: ``SkipValidation`` fields vLLM fills itself are left out).  tests/test_vllm_server.py holds this list to
#: the installed vLLM's dataclass, so the config check needs no vLLM (the submit host has none).
SPECULATIVE_CONFIG_FIELDS = frozenset({
    "enforce_eager", "num_speculative_tokens", "model", "method", "draft_tensor_parallel_size",
    "tensor_parallel_size", "quantization", "moe_backend", "attention_backend", "kv_cache_dtype", "max_model_len",
    "revision", "code_revision", "index_share_for_mtp_iteration", "disable_padded_drafter_batch",
    "disable_eagle_block_drop", "use_local_argmax_reduction", "use_heterogeneous_vocab", "prompt_lookup_max",
    "prompt_lookup_min", "parallel_drafting", "num_speculative_tokens_per_batch_size",
    "suffix_decoding_max_tree_depth", "suffix_decoding_max_cached_requests", "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob", "draft_load_config", "rejection_sample_method", "synthetic_acceptance_rates",
    "synthetic_acceptance_length", "enable_adaptive_verification", "draft_sample_method", "dspark_draft_topk",
})
#: Settings that accept draft tokens without the target model's verification (vLLM's "synthetic" rejection
#: sampling, for benchmarking): the output would no longer be the model's, so they are refused.
_LOSSY_SPECULATIVE = {"rejection_sample_method": "synthetic", "synthetic_acceptance_rates": None,
                      "synthetic_acceptance_length": None}


def _speculative_problems(where: str, model: dict[str, Any]) -> list[str]:
    """``speculative_config`` (docs/decisions.md): vLLM 0.32's own field names, a method or draft model, lossless."""
    spec = model.get("speculative_config")
    if spec is None:
        return []
    where = f"{where}.speculative_config"
    problems = [f"{where}.{name}: not a field of vLLM 0.32's SpeculativeConfig (vllm/config/speculative.py)"
                for name in sorted(spec) if name not in SPECULATIVE_CONFIG_FIELDS]
    if "method" not in spec and "model" not in spec:
        problems.append(f"{where}: needs a 'method' (e.g. ngram, suffix, mtp) or a draft 'model'")
    for name, lossy in _LOSSY_SPECULATIVE.items():
        if name in spec and (lossy is None or spec[name] == lossy):
            problems.append(f"{where}.{name}: accepts draft tokens without the model's verification; the "
                            "outputs would not be the model's (docs/decisions.md)")
    if "speculative_config" in model.get("engine_kwargs", {}):
        problems.append(f"{where}: also set in engine_kwargs; set it once, here")
    return problems


def endpoint_defaults() -> dict[str, Any]:
    """The endpoint fields' defaults (a vllm-server model's requests go through the endpoint backend)."""
    return copy.deepcopy(_ENDPOINT_DEFAULTS)


def is_server(model: dict[str, Any]) -> bool:
    """A model whose vLLM server the job starts itself (weights staged here, GPUs of this study)."""
    return model.get("backend", IN_PROCESS) == SERVER


def serve_flag_value(serve_args: list[str], *names: str) -> str | None:
    """The value ``serve_args`` gives one of ``names`` (``--name V`` or ``--name=V``; the last wins), else None."""
    value = None
    for i, arg in enumerate(serve_args):
        flag, eq, inline = arg.partition("=")
        if flag in names:
            value = inline if eq else (serve_args[i + 1] if i + 1 < len(serve_args) else "")
    return value


def _server_problems(where: str, model: dict[str, Any]) -> list[str]:
    """A vllm-server model: no endpoint-only fields, no flag the job sets, data x tensor parallel fits its GPUs."""
    problems = [f"{where}.{name}: only for backend 'openai'" for name in ENDPOINT_FIELDS
                if name in model and name not in SERVER_CONNECTION_FIELDS]
    serve_args = [str(a) for a in model.get("serve_args", [])]
    for i, arg in enumerate(serve_args):
        flag = arg.partition("=")[0]
        if flag in SERVER_FLAGS_SET_BY_JOB or flag.startswith("--no-") and "--" + flag[5:] in SERVER_FLAGS_SET_BY_JOB:
            field = SERVER_FLAGS_SET_BY_JOB.get(flag)
            instead = f"set {where}.{field} instead" if field else "the job sets it"
            problems.append(f"{where}.serve_args.{i}: '{flag}' is not a serve_args flag ({instead})")
    dp_text = serve_flag_value(serve_args, "--data-parallel-size", "-dp")
    if dp_text is not None:
        try:
            dp = int(dp_text)
        except ValueError:
            problems.append(f"{where}.serve_args: --data-parallel-size '{dp_text}' is not a whole number")
        else:
            need = dp * model["tensor_parallel_size"]
            if model["gpus"] > 0 and need > model["gpus"]:
                problems.append(f"{where}.serve_args: data parallel {dp} x tensor_parallel_size "
                                f"{model['tensor_parallel_size']} needs {need} GPUs, but gpus is {model['gpus']}")
    return problems
_TOP_DEFAULTS: dict[str, Any] = {
    # Hub models are staged here (a Hugging Face cache; on the shared filesystem) ...
    "models_dir": "results/models/hub",
    # ... at the commits this file pins (docs/inference.md, "Staging").
    "model_lock": "config/models.lock.yaml",
    # Site settings of the SLURM profile (docs/cluster.md); never part of what a model generates.
    "cluster": {},
}
_CLUSTER_DEFAULTS: dict[str, Any] = {
    "cpu_jobs": "submit-host",  # or "grouped": two CPU jobs on the cluster instead of the submit host
    "gpu_type": "h200",  # --gpus=TYPE:N; null for --gpus=N
    "max_runtime_minutes": 2880,  # the GPU partition's time limit
    "cpus_per_gpu": 8,
    "mem_per_checkpoint": 1.25,  # host memory of an inference job per byte of checkpoint ...
    "min_mem_gb": 32,  # ... but at least this
}
_INFERENCE_DEFAULTS: dict[str, Any] = {
    "truncation_rerun": "continue",
    # Chat templates that read the clock (gpt-oss: "Current date") render this day, so prompts never drift.
    "template_date": "2026-01-01",
    # Group commit of the inference store: a kill -9 loses at most this many finished
    # generations, or this many seconds of them (docs/inference.md).
    "store_commit_records": 64,
    "store_commit_seconds": 10,
    # vLLM's repetition detection on truncation reruns (attempt 2) only: null (the paper's rule) or
    # {max_pattern_size, min_pattern_size, min_count}; docs/decisions.md.
    "rerun_repetition_guard": None,
}


def schema() -> dict[str, Any]:
    text = resources.files("procexec").joinpath("schemas/config.schema.json").read_text()
    return json.loads(text)


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "<top level>"


class BadDate(str):
    """An unquoted YAML date that is no calendar date (``2026-02-30``): kept as its text, refused by
    ``value_problems`` with its key (YAML's own constructor raises a bare ValueError)."""

    reason = ""


def value_problems(value: Any, path: str = "") -> list[str]:
    """Values no schema keyword can refuse, anywhere in a parsed YAML/JSON document, as ``key: problem``.

    JSON Schema's ``minimum`` compares false with NaN (so NaN passes every range) and has no type for
    a YAML date; both are refused here, for every key, before the schema runs.
    """
    where = path or "<top level>"
    if isinstance(value, dict):
        return [p for key, item in value.items() for p in value_problems(item, f"{path}.{key}" if path else str(key))]
    if isinstance(value, list):
        return [p for i, item in enumerate(value) for p in value_problems(item, f"{path}.{i}" if path else str(i))]
    if isinstance(value, float) and not math.isfinite(value):
        return [f"{where}: {value} is not a finite number"]
    if isinstance(value, BadDate):
        return [f"{where}: {str(value)!r} is not a calendar date ({value.reason})"]
    if isinstance(value, (dt.date, dt.datetime)):
        return [f"{where}: {value.isoformat()} is an unquoted YAML date; write it as text ('{value.isoformat()}')"]
    return []


def validate(config: dict[str, Any], source: str = "config") -> None:
    """Raise ProcexecError naming every bad key (values, then schema, then cross-field rules)."""
    typed = value_problems(config)
    if typed:
        raise _invalid(source, typed)
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        raise _invalid(source, [f"{_key_path(e)}: {e.message}" for e in errors])
    problems: list[str] = []
    models = config["models"]
    for key in config["run_models"]:
        if key not in models:
            problems.append(f"run_models: unknown model key '{key}' (known: {', '.join(sorted(models))})")
    for key in (config.get("cluster") or {}).get("model_gpu_hours_budgets") or {}:
        if key not in models:
            problems.append(f"cluster.model_gpu_hours_budgets.{key}: unknown model key")
    for key, model in models.items():
        where = f"models.{key}"
        if not is_endpoint(model):  # an endpoint may leave both out; _backend_problems checks its values
            gpus, tp = model["gpus"], model["tensor_parallel_size"]
            if gpus > 0 and tp > gpus:
                problems.append(f"{where}.tensor_parallel_size: {tp} is larger than gpus ({gpus})")
            if gpus == 0 and tp > 1:
                problems.append(f"{where}.tensor_parallel_size: {tp} needs as many GPUs, but gpus is 0 (a CPU model)")
            if gpus > 0 and gpus % tp:
                problems.append(f"{where}.gpus: {gpus} is not a multiple of tensor_parallel_size ({tp})")
        if model.get("source") == "path":
            if "path" not in model:
                problems.append(f"{where}.path: required when source is 'path'")
            elif not Path(model["path"]).is_dir():
                problems.append(f"{where}.path: model directory '{model['path']}' does not exist")
        # The smoke stage caps reruns below the engine's length on purpose (procexec.cluster.stages).
        if model.get("max_context", model["max_model_len"]) < model["max_model_len"] and config.get("stage") != "smoke":
            problems.append(f"{where}.max_context: smaller than max_model_len")
        problems += _backend_problems(where, model)
        problems += _speculative_problems(where, model)
    date = config["inference"].get("template_date")
    if date is not None:
        try:
            dt.date.fromisoformat(date)
        except ValueError:
            problems.append(f"inference.template_date: '{date}' is not a calendar date (YYYY-MM-DD)")
    suite = config["suite"]
    for i, setting in enumerate(suite["inputs"]):
        if setting["low"] >= setting["high"]:
            problems.append(f"suite.inputs.{i}: low ({setting['low']}) must be below high ({setting['high']})")
    if not problems:
        known = {d.id for d in expand_suite(suite, subset=False)}
        for name in suite.get("datasets", []):
            if name not in known:
                problems.append(f"suite.datasets: unknown dataset id '{name}'")
    if problems:
        raise _invalid(source, problems)


def _invalid(source: str, problems: list[str]) -> ProcexecError:
    """One line: ``invalid configuration (SOURCE): key: problem; key: problem`` (the first 10)."""
    more = f"; and {len(problems) - 10} more" if len(problems) > 10 else ""
    return ProcexecError(f"invalid configuration ({source}): " + "; ".join(problems[:10]) + more)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key repeated within one mapping."""


def _mapping_without_duplicates(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            first = seen.get(key)
        except TypeError:  # an unhashable key: construct_mapping reports it
            break
        if first is not None:
            raise yaml.constructor.ConstructorError(
                None, None, f"key {key!r} appears twice in one mapping (first on line {first})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line + 1
    return loader.construct_mapping(node, deep=deep)


def _timestamp(loader: _StrictLoader, node: yaml.ScalarNode) -> Any:
    """YAML's date constructor, except that a date the calendar lacks is kept as ``BadDate`` text."""
    try:
        return loader.construct_yaml_timestamp(node)
    except (ValueError, OverflowError) as exc:
        bad = BadDate(loader.construct_scalar(node))
        bad.reason = f"{exc}, line {node.start_mark.line + 1}"
        return bad


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _mapping_without_duplicates)
_StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", _timestamp)


def read_yaml(path: str | Path) -> Any:
    """Parse one YAML (or JSON) file strictly; every fault is one line naming the file (and line).

    A ``.json`` file is read as JSON (``procexec.io.jsonl.read_json``), not as YAML 1.1, which reads
    JSON's ``1e-05`` as text: the merged config the workflow writes for its jobs is JSON, and a job
    must read every value as the workflow validated it.
    """
    source = Path(path)
    if not source.exists():
        raise ProcexecError(f"{source}: configuration file not found")
    if source.suffix == ".json":
        return read_json(source, what="JSON configuration")
    text = read_text(source)
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 -- a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else str(source)
        what = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise ProcexecError(f"{where}: not valid YAML ({what})") from None
    except yaml.YAMLError as exc:
        raise ProcexecError(f"{source}: not valid YAML ({str(exc).splitlines()[0]})") from None


def _mapping(path: str | Path) -> dict[str, Any]:
    config = read_yaml(path)
    if not isinstance(config, dict):
        raise ProcexecError(f"{path}: expected a mapping at the top level")
    return config


def _backend_problems(where: str, model: dict[str, Any]) -> list[str]:
    """Endpoint fields belong to ``backend: openai`` models, which need a URL and no GPU."""
    if is_server(model):
        return _server_problems(where, model)
    misplaced = [f"{where}.{name}: only for backend 'vllm-server'" for name in SERVER_FIELDS if name in model]
    if misplaced:
        return misplaced
    if is_endpoint(model):
        problems = [] if "base_url" in model else [f"{where}.base_url: required when backend is 'openai'"]
        if model.get("gpus", 0) > 0:
            problems.append(f"{where}.gpus: an endpoint model (backend 'openai') holds no GPU of this study "
                            "(leave gpus out, or 0)")
        if model.get("tensor_parallel_size", 1) > 1:
            problems.append(f"{where}.tensor_parallel_size: an endpoint's parallelism is its server's, a vllm serve "
                            "flag (leave it out, or 1)")
        return problems
    return [f"{where}.{name}: only for backend 'openai'" for name in ENDPOINT_FIELDS if name in model]


def endpoint_key(model: dict[str, Any]) -> str | None:
    """The API key from the environment variable ``api_key_env`` names (None when it names none).

    Read where it is used, never written anywhere; an unset variable is a config error.
    """
    import os

    name = model.get("api_key_env")
    if not name:
        return None
    value = os.environ.get(name, "")
    if not value.strip():
        raise ProcexecError(f"models.{model['key']}.api_key_env: environment variable {name} is not set")
    return value


def check_endpoint_keys(config: dict[str, Any]) -> None:
    """Every run model that names an ``api_key_env`` finds it set (checked before any job)."""
    for key in config["run_models"]:
        endpoint_key({**config["models"][key], "key": key})


def load(path: str | Path) -> dict[str, Any]:
    """Read YAML, validate it, and return it with model defaults filled in."""
    return prepare(_mapping(path), str(path))


def deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``overlay`` on top of ``base`` as Snakemake merges --configfile: mappings key by key, anything else replaced."""
    merged = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def read_merged(paths: list[str | Path]) -> dict[str, Any]:
    """``config.yaml --configfile A B ...`` each read strictly and merged as Snakemake merges them (not validated)."""
    merged: dict[str, Any] = {}
    for path in paths:
        merged = deep_merge(merged, _mapping(path))
    return merged


def load_merged(paths: list[str | Path]) -> dict[str, Any]:
    """The workflow's view of ``config.yaml --configfile A B ...``: each file read strictly, merged, validated."""
    return prepare(read_merged(paths), " + ".join(map(str, paths)))  # one file: as ``load`` names it


def prepare(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Validate an already-parsed config (e.g. Snakemake's merged one) and fill defaults."""
    validate(config, source)
    config = copy.deepcopy(config)
    for field, default in _INFERENCE_DEFAULTS.items():
        config["inference"].setdefault(field, default)
    for field, default in _TOP_DEFAULTS.items():
        config.setdefault(field, copy.deepcopy(default))
    for field, default in _CLUSTER_DEFAULTS.items():
        config["cluster"].setdefault(field, default)
    for key, model in config["models"].items():
        for field, default in _MODEL_DEFAULTS.items():
            model.setdefault(field, copy.deepcopy(default))
        if is_endpoint(model):
            for field, default in (_ENDPOINT_DEFAULTS | _ENDPOINT_RESOURCE_DEFAULTS).items():
                model.setdefault(field, copy.deepcopy(default))
        if is_server(model):
            for field, default in _SERVER_DEFAULTS.items():
                model.setdefault(field, copy.deepcopy(default))
        model.setdefault("max_context", model["max_model_len"])
        model.setdefault("name", model["hf_id"].split("/")[-1])
        model["key"] = key
    if not config["run_models"]:
        config["run_models"] = list(config["models"])
    return config


#: The paper's suite, packaged: the suite-only commands read it outside a checkout (no config.yaml there).
SUITE_FILE = Path(__file__).resolve().parents[1] / "data" / "suite.yaml"


def default_suite() -> dict[str, Any]:
    """config.yaml's ``suite:`` section as the package ships it (tests/test_config.py holds the two equal)."""
    return _mapping(SUITE_FILE)


def expand_suite(suite: dict[str, Any], subset: bool = True) -> list[DatasetSpec]:
    """All dataset specs of the suite in a stable order (families, inputs, operators, k).

    With ``subset`` the optional ``suite.datasets`` list narrows the result.
    """
    settings = [InputSetting(s["type"], s["low"], s["high"]) for s in suite["inputs"]]
    specs = [
        DatasetSpec(operator=op, setting=setting, lookback=k)
        for family in suite["families"].values()
        for setting in settings
        for op in family["operators"]
        for k in family["lookbacks"]
    ]
    wanted = suite.get("datasets") or []
    if subset and wanted:
        specs = [s for s in specs if s.id in set(wanted)]
    return specs


@dataclass(frozen=True)
class SuiteParams:
    seed: int
    lengths: tuple[int, ...]
    examples_per_length: int


def suite_params(suite: dict[str, Any]) -> SuiteParams:
    return SuiteParams(suite["seed"], tuple(suite["lengths"]), suite["examples_per_length"])

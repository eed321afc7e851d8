"""Load and validate the workflow configuration (config.yaml).

Validation happens once, up front: JSON-schema errors and cross-field errors
(unknown model keys, tensor parallelism wider than the GPUs asked for, a model
folder that does not exist) are reported with the key path, before any job runs.
"""

from __future__ import annotations

import copy
import datetime as dt
import json
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from procexec.errors import ProcexecError
from procexec.suite import DatasetSpec, InputSetting

_MODEL_DEFAULTS: dict[str, Any] = {
    "revision": "main",
    "source": "hf",
    "tokenizer_mode": "auto",
    "trust_remote_code": False,
    "system_role": True,
    "chat_template_kwargs": {},
    "engine_kwargs": {},
    "dtype": "auto",
    "backend": "vllm",
}
# backend: openai only (docs/inference.md); base_url has no default.
_ENDPOINT_DEFAULTS: dict[str, Any] = {
    "served_model": None,  # the endpoint's model id; default: hf_id
    "openai_api": "completions",
    "api_key_env": None,
    "max_concurrency": 8,
    "request_timeout_s": 900,
    "max_retries": 8,
    # Sent with every request.  A vLLM server fills any sampling field a request leaves out from the
    # model's generation_config.json (a repetition penalty changes even greedy output): these pin the
    # neutral values.  Set {} for a provider that refuses fields outside the OpenAI API.
    "request_extra": {"repetition_penalty": 1.0, "top_k": 0, "min_p": 0.0},
}
ENDPOINT_FIELDS = ("base_url", *_ENDPOINT_DEFAULTS)
_INFERENCE_DEFAULTS: dict[str, Any] = {
    "truncation_rerun": "continue",
    # Chat templates that read the clock (gpt-oss: "Current date") render this day, so prompts never drift.
    "template_date": "2026-01-01",
    # Group commit of the inference store: a kill -9 loses at most this many finished
    # generations, or this many seconds of them (docs/inference.md).
    "store_commit_records": 64,
    "store_commit_seconds": 10,
}


def schema() -> dict[str, Any]:
    text = resources.files("procexec").joinpath("schemas/config.schema.json").read_text()
    return json.loads(text)


def _key_path(error: jsonschema.ValidationError) -> str:
    parts = [str(p) for p in error.absolute_path]
    return ".".join(parts) if parts else "<top level>"


def validate(config: dict[str, Any], source: str = "config") -> None:
    """Raise ProcexecError naming every bad key (schema first, then cross-field rules)."""
    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        lines = [f"{source}: {_key_path(e)}: {e.message}" for e in errors[:10]]
        raise ProcexecError("invalid configuration\n  " + "\n  ".join(lines))
    problems: list[str] = []
    models = config["models"]
    for key in config["run_models"]:
        if key not in models:
            problems.append(f"run_models: unknown model key '{key}' (known: {', '.join(sorted(models))})")
    for key, model in models.items():
        where = f"models.{key}"
        gpus, tp = model["gpus"], model["tensor_parallel_size"]
        if gpus > 0 and tp > gpus:
            problems.append(f"{where}.tensor_parallel_size: {tp} is larger than gpus ({gpus})")
        if gpus > 0 and gpus % tp:
            problems.append(f"{where}.gpus: {gpus} is not a multiple of tensor_parallel_size ({tp})")
        if model.get("source") == "path":
            if "path" not in model:
                problems.append(f"{where}.path: required when source is 'path'")
            elif not Path(model["path"]).is_dir():
                problems.append(f"{where}.path: model directory '{model['path']}' does not exist")
        if model.get("max_context", model["max_model_len"]) < model["max_model_len"]:
            problems.append(f"{where}.max_context: smaller than max_model_len")
        problems += _backend_problems(where, model)
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
        raise ProcexecError("invalid configuration\n  " + "\n  ".join(f"{source}: {p}" for p in problems))


def _backend_problems(where: str, model: dict[str, Any]) -> list[str]:
    """Endpoint fields belong to ``backend: openai`` models, which need a URL and no GPU."""
    if model.get("backend", "vllm") == "openai":
        problems = [] if "base_url" in model else [f"{where}.base_url: required when backend is 'openai'"]
        if model["gpus"] > 0:
            problems.append(f"{where}.gpus: an endpoint model (backend 'openai') runs on no GPU of this study; set 0")
        return problems
    return [f"{where}.{name}: only for backend 'openai'" for name in ENDPOINT_FIELDS if name in model]


def check_endpoint_keys(config: dict[str, Any]) -> None:
    """Every run model that names an ``api_key_env`` finds it set (checked before any job, never logged)."""
    import os

    missing = [
        f"models.{key}.api_key_env: environment variable {model['api_key_env']} is not set"
        for key, model in config["models"].items()
        if key in config["run_models"] and model.get("api_key_env") and not os.environ.get(model["api_key_env"], "").strip()
    ]
    if missing:
        raise ProcexecError("; ".join(missing))


def load(path: str | Path) -> dict[str, Any]:
    """Read YAML, validate it, and return it with model defaults filled in."""
    source = Path(path)
    if not source.exists():
        raise ProcexecError(f"{source}: configuration file not found")
    try:
        config = yaml.safe_load(source.read_text())
    except yaml.YAMLError as exc:
        raise ProcexecError(f"{source}: not valid YAML ({exc})") from None
    if not isinstance(config, dict):
        raise ProcexecError(f"{source}: expected a mapping at the top level")
    return prepare(config, str(source))


def prepare(config: dict[str, Any], source: str = "config") -> dict[str, Any]:
    """Validate an already-parsed config (e.g. Snakemake's merged one) and fill defaults."""
    validate(config, source)
    config = copy.deepcopy(config)
    for field, default in _INFERENCE_DEFAULTS.items():
        config["inference"].setdefault(field, default)
    for key, model in config["models"].items():
        for field, default in _MODEL_DEFAULTS.items():
            model.setdefault(field, copy.deepcopy(default))
        if model["backend"] == "openai":
            for field, default in _ENDPOINT_DEFAULTS.items():
                model.setdefault(field, copy.deepcopy(default))
        model.setdefault("max_context", model["max_model_len"])
        model.setdefault("name", model["hf_id"].split("/")[-1])
        model["key"] = key
    if not config["run_models"]:
        config["run_models"] = list(config["models"])
    return config


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

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
import glob
import json
import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from procexec.benchmark.suite import expand_suite
from procexec.config.model import (
    BACKENDS,
    Config,
    ImportedModel,
    ModelBase,
    OpenAIModel,
    VllmModel,
    VllmServerModel,
)
from procexec.config.request_extra import request_extra_problems
from procexec.config.serve_args import serve_args_problems
from procexec.config.speculative import relation_problems, speculative_value_problems
from procexec.errors import ProcexecError, validation_problems
from procexec.io.files import read_text

#: The fields of vLLM 0.32's ``SpeculativeConfig`` a config may set (``vllm/config/speculative.py``; the
#: ``SkipValidation`` fields vLLM fills itself are left out).  tests/generation/test_backend_vllm_server.py holds
#: this list to the installed vLLM's dataclass, so the config check needs no vLLM (the submit host has none).
SPECULATIVE_CONFIG_FIELDS = frozenset(
    {
        "enforce_eager",
        "num_speculative_tokens",
        "model",
        "method",
        "draft_tensor_parallel_size",
        "tensor_parallel_size",
        "quantization",
        "moe_backend",
        "attention_backend",
        "kv_cache_dtype",
        "max_model_len",
        "revision",
        "code_revision",
        "index_share_for_mtp_iteration",
        "disable_padded_drafter_batch",
        "disable_eagle_block_drop",
        "use_local_argmax_reduction",
        "use_heterogeneous_vocab",
        "prompt_lookup_max",
        "prompt_lookup_min",
        "parallel_drafting",
        "num_speculative_tokens_per_batch_size",
        "suffix_decoding_max_tree_depth",
        "suffix_decoding_max_cached_requests",
        "suffix_decoding_max_spec_factor",
        "suffix_decoding_min_token_prob",
        "draft_load_config",
        "rejection_sample_method",
        "synthetic_acceptance_rates",
        "synthetic_acceptance_length",
        "enable_adaptive_verification",
        "draft_sample_method",
        "dspark_draft_topk",
    }
)
#: Settings that accept draft tokens without the target model's verification (vLLM's "synthetic" rejection
#: sampling, for benchmarking): the output would no longer be the model's, so they are refused.
_LOSSY_SPECULATIVE = {
    "rejection_sample_method": "synthetic",
    "synthetic_acceptance_rates": None,
    "synthetic_acceptance_length": None,
}


def _speculative_problems(where: str, spec: dict[str, Any]) -> list[str]:
    """A ``speculative_config`` (docs/decisions.md): vLLM 0.32's own field names, a method or draft model, lossless."""
    problems = [
        f"{where}.{name}: not a field of vLLM 0.32's SpeculativeConfig (vllm/config/speculative.py)"
        for name in sorted(spec)
        if name not in SPECULATIVE_CONFIG_FIELDS
    ]
    if "method" not in spec and "model" not in spec:
        problems.append(f"{where}: needs a 'method' (e.g. ngram, suffix, mtp) or a draft 'model'")
    problems += speculative_value_problems(where, spec)
    problems += relation_problems(where, spec)
    for name, lossy in _LOSSY_SPECULATIVE.items():
        if name in spec and (lossy is None or spec[name] == lossy):
            problems.append(
                f"{where}.{name}: accepts draft tokens without the model's verification; the "
                "outputs would not be the model's (docs/decisions.md)"
            )
    return problems


def _server_problems(where: str, model: VllmServerModel) -> list[str]:
    """A vllm-server model's serve_args, parsed as ``vllm serve`` parses them (procexec.config.serve_args)."""
    return serve_args_problems(where, model.serve_args, model.tensor_parallel_size, model.gpus)


def _resource_problems(where: str, model: ModelBase) -> list[str]:
    """An engine of this study fits tensor parallelism into its GPUs; an endpoint holds none and has none (once
    both are known: a layout left out is planned later, ``procexec.cluster.layouts``)."""
    gpus, tp = model.gpus, model.tensor_parallel_size
    if gpus is None or tp is None:
        return []
    if not model.holds_gpus:
        problems = []
        if gpus > 0:
            problems.append(
                f"{where}.gpus: an endpoint model (backend 'openai') holds no GPU of this study (leave gpus out, or 0)"
            )
        if tp > 1:
            problems.append(
                f"{where}.tensor_parallel_size: an endpoint's parallelism is its server's, a vllm serve "
                "flag (leave it out, or 1)"
            )
        return problems
    if gpus > 0 and tp > gpus:
        return [f"{where}.tensor_parallel_size: {tp} is larger than gpus ({gpus})"]
    if gpus == 0 and tp > 1:
        return [f"{where}.tensor_parallel_size: {tp} needs as many GPUs, but gpus is 0 (a CPU model)"]
    if gpus > 0 and gpus % tp:
        return [f"{where}.gpus: {gpus} is not a multiple of tensor_parallel_size ({tp})"]
    return []


def harness_log_files(pattern: str) -> list[Path]:
    """The log files one ``lm_eval``/``inspect`` item names: a path, or a glob (sorted); relative to the working
    directory (Snakemake's ``--directory``)."""
    if glob.has_magic(pattern):
        return sorted(Path(p) for p in glob.glob(pattern, recursive=True) if Path(p).is_file())
    return [Path(pattern)] if Path(pattern).is_file() else []


#: lm-eval's date id in its file names (``datetime.isoformat()`` with ":" as "-"; lm_eval/loggers/
#: evaluation_tracker.py:270, 279, 345): the samples and the results file of one run share it.
_LM_EVAL_DATE_ID = re.compile(r"_(\d{4}-\d{2}-\d{2}T[0-9-]+(?:\.[0-9]+)?)\.jsonl$")


def lm_eval_results_file(samples: Path) -> Path | None:
    """The results file lm-eval 0.4.13 wrote beside a samples file (``results_<date id>.json``), where one is."""
    match = _LM_EVAL_DATE_ID.search(samples.name)
    results = samples.with_name(f"results_{match.group(1)}.json") if match else None
    return results if results is not None and results.is_file() else None


def _imported_problems(where: str, model: ImportedModel) -> list[str]:
    """An imported model names one harness's logs, each item matching a file, and none of an engine's fields."""
    problems = [
        f"{where}.{name}: an imported model runs nothing here (backend 'imported'); leave it out"
        for name in sorted(model.model_fields_set & model.engine_only)
    ]
    if (model.lm_eval is None) == (model.inspect is None):
        return [*problems, f"{where}: backend 'imported' needs the logs of one harness: lm_eval or inspect"]
    field = "inspect" if model.inspect else "lm_eval"
    for i, pattern in enumerate(model.log_patterns):
        if not harness_log_files(pattern):
            problems.append(f"{where}.{field}.{i}: {pattern!r} matches no log file")
    if model.model_dir is not None:
        if model.inspect:
            problems.append(f"{where}.model_dir: only for lm_eval logs (an inspect log names its model folder)")
        elif not Path(model.model_dir).is_dir():
            problems.append(f"{where}.model_dir: model directory '{model.model_dir}' does not exist")
        else:  # the prompt check reads each run's max_length (procexec.harness.logs)
            problems += [
                f"{where}.lm_eval.{i}: {path} has no lm-eval results file beside it (results_<date>.json, with "
                "the run's max_length, which model_dir's prompt check reads)"
                for i, pattern in enumerate(model.log_patterns)
                for path in harness_log_files(pattern)
                if lm_eval_results_file(path) is None
            ][:1]
    return problems


class BadDate(str):
    """An unquoted YAML date that is no calendar date (``2026-02-30``): kept as its text, refused by
    ``value_problems`` with its key (YAML's own constructor raises a bare ValueError)."""

    reason = ""


def value_problems(value: Any, path: str = "") -> list[str]:
    """Values no type can refuse, anywhere in a parsed YAML/JSON document, as ``key: problem``.

    A range check compares false with NaN (so NaN passes every range) and a YAML date is no JSON
    value; both are refused here, for every key, before the types are checked.
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


#: pydantic's type errors in JSON Schema's words (what editors, the generated schema and docs call the types).
_JSON_TYPES = {
    "int_type": "integer",
    "float_type": "number",
    "string_type": "string",
    "bool_type": "boolean",
    "dict_type": "object",
    "model_type": "object",
    "model_attributes_type": "object",
    "list_type": "array",
    "literal_error": None,
}
#: Which variant owns a field another backend's entry may not have (the first that has it).
_FIELD_OWNERS = (OpenAIModel, VllmServerModel, VllmModel, ImportedModel)


def _config_phrase(error: dict[str, Any]) -> tuple[tuple[Any, ...], str]:
    """One config error as (key path, problem), worded as the schema's keywords read."""
    loc, kind, value = list(error["loc"]), error["type"], error.get("input")
    backend = None
    if len(loc) >= 3 and loc[0] == "models" and loc[2] in BACKENDS:  # the discriminated union's tag
        backend = loc.pop(2)
    if (
        len(loc) >= 2
        and loc[-1] in ("int", "float")
        and kind in ("int_type", "float_type", "greater_than", "greater_than_equal", "less_than", "less_than_equal")
    ):
        loc.pop()  # a number is an int or a float: one message, not one per member
        kind = "number_type" if kind in ("int_type", "float_type") else kind
    if kind == "missing" and backend and loc[-1] == "base_url":  # the one field a backend requires of its own
        return tuple(loc), f"required when backend is '{backend}'"
    if kind == "missing":
        return tuple(loc[:-1]), f"'{loc[-1]}' is a required property"
    if kind == "extra_forbidden":
        owner = next((v for v in _FIELD_OWNERS if loc[-1] in v.model_fields), None)
        if backend and owner is not None:
            return tuple(loc), f"only for backend '{owner.backend_kind}'"
        return tuple(loc[:-1]), f"unknown key '{loc[-1]}'"
    if kind == "backend":
        return (*loc, "backend"), f"{error['input'].get('backend')!r} is not one of {list(BACKENDS)}"
    if kind == "number_type":
        return tuple(loc), f"{value!r:.60} is not of type 'number'"
    if _JSON_TYPES.get(kind):
        return tuple(loc), f"{value!r:.60} is not of type '{_JSON_TYPES[kind]}'"
    return tuple(loc), f"{error['msg']} (got {value!r:.60})"


def layout_problems(config: Config) -> list[str]:
    """Each model's stated layout in itself: tensor parallel within its GPUs, a server's data parallel too; a
    layout not yet planned is skipped (``procexec.cluster.layouts.planned`` checks it once planned)."""
    problems: list[str] = []
    for key, model in config.models.items():
        where = f"models.{key}"
        if model.generates_here:  # an imported model's resources are refused with its other engine fields
            problems += _resource_problems(where, model)
        if isinstance(model, VllmServerModel):
            problems += _server_problems(where, model)
    return problems


def cross_field_problems(config: Config) -> list[str]:
    """What no single field's type says: keys that must name models, resources that must fit, paths that must exist."""
    problems: list[str] = layout_problems(config)
    models = config.models
    for key in config.run_models:
        if key not in models:
            problems.append(f"run_models: unknown model key '{key}' (known: {', '.join(sorted(models))})")
    for key in config.cluster.model_gpu_hours_budgets or {}:
        if key not in models:
            problems.append(f"cluster.model_gpu_hours_budgets.{key}: unknown model key")
        elif not models[key].generates_here:
            problems.append(f"cluster.model_gpu_hours_budgets.{key}: an imported model uses no GPU of this study")
    for key, model in models.items():
        where = f"models.{key}"
        if model.source == "path":
            if model.path is None:
                problems.append(f"{where}.path: required when source is 'path'")
            elif not Path(model.path).is_dir():
                problems.append(f"{where}.path: model directory '{model.path}' does not exist")
        # The smoke stage caps reruns below the engine's length on purpose (procexec.cluster.study_stages).
        if model.max_context < model.max_model_len and config.stage != "smoke":
            problems.append(f"{where}.max_context: smaller than max_model_len")
        if isinstance(model, ImportedModel):
            problems += _imported_problems(where, model)
        if model.speculative_config is not None:
            problems += _speculative_problems(f"{where}.speculative_config", model.speculative_config)
            if "speculative_config" in model.engine_kwargs:
                problems.append(f"{where}.speculative_config: also set in engine_kwargs; set it once, here")
        if isinstance(model, (VllmServerModel, OpenAIModel)):  # the models that serve over HTTP
            problems += request_extra_problems(where, model.request_extra)
    if isinstance(config.pilot_speculative, dict):
        problems += _speculative_problems("pilot_speculative", config.pilot_speculative)
    guards = {"inference": config.inference.rerun_repetition_guard}
    guards |= {f"models.{key}": model.rerun_repetition_guard for key, model in config.models.items()}
    for where, guard in guards.items():
        if guard and guard.min_pattern_size > guard.max_pattern_size:
            problems.append(
                f"{where}.rerun_repetition_guard.min_pattern_size: {guard.min_pattern_size} exceeds "
                f"max_pattern_size {guard.max_pattern_size}"
            )
    for i, setting in enumerate(config.suite.inputs):
        if setting.low >= setting.high:
            problems.append(f"suite.inputs.{i}: low ({setting.low}) must be below high ({setting.high})")
    if not problems:
        known = {d.id for d in expand_suite(config.suite, subset=False)}
        for name in config.suite.datasets or []:
            if name not in known:
                problems.append(f"suite.datasets: unknown dataset id '{name}'")
    return problems


def prepare(raw: Any, source: str = "config") -> Config:
    """The typed config of a parsed (merged) one, defaults filled: raise ProcexecError naming every bad key in
    one line.

    Values no type refuses first (NaN, YAML dates), then each field's type and the GPU (``cluster.hardware``),
    then the cross-field rules.  A model entry that leaves its layout out (``gpus``, ``tensor_parallel_size``, a
    server's data-parallel flags) keeps it unset here: the cluster layer plans it for the GPU
    (``procexec.cluster.layouts.planned``), as every command and the workflow read a config.
    """
    from procexec.config.hardware import hardware_problems

    problems = value_problems(raw)
    if problems:
        raise invalid(source, problems)
    try:
        config = Config.model_validate(raw)
    except ValidationError as exc:
        lines = validation_problems(exc, phrase=_config_phrase)
        raise invalid(source, list(dict.fromkeys(lines))) from None
    problems = hardware_problems(config.cluster, _config_phrase) + cross_field_problems(config)
    if problems:
        raise invalid(source, problems)
    return config


def invalid(source: str, problems: list[str]) -> ProcexecError:
    """One line: ``invalid configuration (SOURCE): key: problem; key: problem`` (the first 10)."""
    more = f"; and {len(problems) - 10} more" if len(problems) > 10 else ""
    return ProcexecError(f"invalid configuration ({source}): " + "; ".join(problems[:10]) + more)


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """SafeLoader that refuses a key repeated within one mapping; libyaml's parser where PyYAML has it (config.yaml,
    read by every command, in 2 ms instead of the pure-Python parser's 20)."""


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


class _RepeatedKey(Exception):
    """A key written twice in one JSON object (not a ValueError: that would send the text on to YAML)."""


def _object_without_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [key for key, _ in pairs]
    repeated = next((key for key in keys if keys.count(key) > 1), None)
    if repeated is not None:
        raise _RepeatedKey(repeated)
    return dict(pairs)


def read_yaml(path: str | Path) -> Any:
    """Parse one config file as Snakemake 9.27 reads a config file, strictly; every fault is one line naming the
    file (and line).

    Snakemake reads a config file as JSON first and as YAML only when that fails, whatever its extension
    (snakemake/common/configfile.py:7-31, ``json.load`` then yte's ``yaml.FullLoader``): so does this, or
    ``{"stall_timeout_s": 1e3}`` would be 1000.0 to the workflow and the text '1e3' to check-config (YAML 1.1
    reads JSON's exponents without a dot as text).  Stricter than Snakemake, for both: a key written twice in
    one mapping is an error (Snakemake lets the last one win), and a YAML date the calendar lacks is kept for
    ``value_problems`` to name by its key.
    """
    source = Path(path)
    if not source.exists():
        raise ProcexecError(f"{source}: configuration file not found")
    text = read_text(source)
    try:
        return json.loads(text, object_pairs_hook=_object_without_duplicates)
    except _RepeatedKey as exc:
        raise ProcexecError(f"{source}: not valid JSON (key {str(exc)!r} appears twice in one object)") from None
    except RecursionError:
        raise ProcexecError(f"{source}: JSON nested too deeply") from None
    except json.JSONDecodeError as exc:
        not_json = f"{source}:{exc.lineno}: not valid JSON ({exc.msg})"
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 -- a SafeLoader subclass
    except yaml.MarkedYAMLError as exc:
        if source.suffix == ".json":
            raise ProcexecError(not_json) from None
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


def endpoint_key(model: OpenAIModel) -> str | None:
    """The API key from the environment variable ``api_key_env`` names (None when it names none).

    Read where it is used, never written anywhere; an unset variable is a config error.
    """
    import os

    name = model.api_key_env
    if not name:
        return None
    value = os.environ.get(name, "")
    if not value.strip():
        raise ProcexecError(f"models.{model.key}.api_key_env: environment variable {name} is not set")
    return value


def check_endpoint_keys(config: Config) -> None:
    """Every run model that names an ``api_key_env`` finds it set (checked before any job)."""
    for key in config.run_models:
        model = config.models[key]
        if isinstance(model, OpenAIModel):
            endpoint_key(model)


def load(path: str | Path) -> Config:
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


def read_merged(paths: Sequence[str | Path]) -> dict[str, Any]:
    """``config.yaml --configfile A B ...`` each read strictly and merged as Snakemake merges them (not validated)."""
    merged: dict[str, Any] = {}
    for path in paths:
        merged = deep_merge(merged, _mapping(path))
    return merged


def load_merged(paths: Sequence[str | Path]) -> Config:
    """The workflow's view of ``config.yaml --configfile A B ...``: each file read strictly, merged, validated."""
    return prepare(read_merged(paths), " + ".join(map(str, paths)))  # one file: as ``load`` names it

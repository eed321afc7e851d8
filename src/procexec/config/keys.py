"""Which settings decide a model's generations: listed once, for the store key and the workflow.

Two readers need the same answer and must never drift apart:

* the store (``procexec.generation.job``): a generation is reused only
  when everything that decides its tokens is unchanged;
* the workflow (``rules/common.smk``): an ``infer`` job reruns exactly when one
  of these settings changes (its ``params.settings`` is a hash of them).

Each model field has a role.  ``engine`` fields pick the weights, tokenizer and
numerics and enter every store key directly (``tensor_parallel_size`` among
them: it changes the order of the reductions, so greedy output may differ;
docs/decisions.md).  ``sampling`` fields are sent with every request and enter
the key beside the job's sampling.  ``prompt`` fields act through the rendered
prompt (its sha256 is in the key) and ``budget`` fields through a request's
``max_tokens`` (also in the key), so they are not repeated there.  Every other
field of a model entry is in ``NO_EFFECT_FIELDS`` and never changes a generation
(resources such as ``gpus`` and ``shards`` never rerun anything).  Each field's
role is stated once, beside its type, in ``procexec.config.model``; the lists
here are derived from it, so a new field cannot stay out of the key unnoticed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from procexec.config.model import (
    VARIANTS,
    Inference,
    Section,
    decides_staging,
    keyed_when_set,
    plain,
    role_of,
)


def _model_fields() -> dict[str, Any]:
    """Every model field of every backend variant, once (a shared field has one role in all of them)."""
    return {name: field for variant in VARIANTS for name, field in variant.model_fields.items()}


#: Each deciding model field's role (``procexec.config.model`` states it beside the field's type and default).
MODEL_FIELD_ROLES: dict[str, str] = {
    name: role_of(field) for name, field in _model_fields().items() if role_of(field) != "none"
}
#: Model fields that decide nothing a model generates: labels, resources, connection handling.
NO_EFFECT_FIELDS = frozenset(name for name, field in _model_fields().items() if role_of(field) == "none")
#: Model fields added later that enter keys and rerun params only when set (unset, earlier keys hold).
OPTIONAL_MODEL_FIELDS = frozenset(name for name, field in _model_fields().items() if keyed_when_set(field))
#: What a prepared model folder (results/models/{model}/) depends on: which files, from where.
SOURCE_FIELDS = tuple(name for name, field in _model_fields().items() if decides_staging(field))
#: The ``inference:`` settings that decide generations (sampling, budgets, rerun policy, pinned date).
INFERENCE_FIELDS = tuple(name for name, field in Inference.model_fields.items() if role_of(field) != "none")
#: Of those, the ones that enter the rerun params only when set (added later: unset, earlier hashes hold).
OPTIONAL_INFERENCE_FIELDS = frozenset(name for name, field in Inference.model_fields.items() if keyed_when_set(field))


def _value(section: Section | Mapping[str, Any], name: str) -> Any:
    """A field's value as JSON data, None where the section has no such field (a variant's, or unset)."""
    return plain(getattr(section, name, None) if isinstance(section, Section) else section.get(name))


def _role_fields(model: Section | Mapping[str, Any], roles: tuple[str, ...] | None = None) -> dict[str, Any]:
    """The model's fields of ``roles`` (None: every classified deciding field); optional ones only when set."""
    return {
        name: _value(model, name)
        for name, role in MODEL_FIELD_ROLES.items()
        if (roles is None or role in roles) and (name not in OPTIONAL_MODEL_FIELDS or _value(model, name) is not None)
    }


def engine_identity(model: Section | Mapping[str, Any], manifest: dict[str, Any]) -> dict[str, Any]:
    """The ``engine`` fields of one model entry (defaults filled) and its staged files: in every store key.

    A staged hub model counts by its pinned commit and file hashes, not by the
    revision's name: the same snapshot always reuses its generations, a new one never.
    """
    identity = _role_fields(model, ("engine",))
    if manifest.get("commit"):
        identity["revision"] = manifest["commit"]
    identity["model_files"] = manifest.get("files", {})
    return identity


def sampling_identity(model: Section | Mapping[str, Any]) -> dict[str, Any]:
    """The ``sampling`` fields of one model entry: in every store key, beside the job's sampling."""
    return _role_fields(model, ("sampling",))


def source_settings(model: Section | Mapping[str, Any]) -> dict[str, Any]:
    """What ``prepare-model``'s output depends on (the workflow's prepare_model params)."""
    return {name: _value(model, name) for name in SOURCE_FIELDS}


def prompt_settings(model: Section | Mapping[str, Any], inference: Section | Mapping[str, Any]) -> dict[str, Any]:
    """What decides a model's rendered prompts: its ``engine`` and ``prompt`` fields and the template date."""
    return {
        "model": _role_fields(model, ("engine", "prompt")),
        "template_date": _value(inference, "template_date"),
    }


def output_settings(model: Section | Mapping[str, Any], inference: Section | Mapping[str, Any]) -> dict[str, Any]:
    """Everything that decides one model's generations (what the workflow's infer params hash)."""
    return {
        "model": _role_fields(model),
        "inference": {
            name: _value(inference, name)
            for name in INFERENCE_FIELDS
            if name not in OPTIONAL_INFERENCE_FIELDS or _value(inference, name) is not None
        },
    }


def canonical_sha256(obj: Any) -> str:
    """sha256 of canonical JSON (sorted keys, no whitespace, no NaN): store keys and rerun params."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()

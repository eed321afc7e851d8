"""Which model fields decide generations: every field classified, the store key and the rerun params follow."""

from __future__ import annotations

import json
from importlib import resources

from config_changes import changed_config
from fake_backend import ScriptedBackend
from procexec.config.keys import MODEL_FIELD_ROLES, NO_EFFECT_FIELDS, engine_identity, output_settings
from procexec.generation.job import run_job
from procexec.generation.job_settings import JobSettings


def _model_schema_fields() -> set[str]:
    """The fields of every backend's model entry in the schema (one ``$defs`` entry per variant)."""
    schema = json.loads(resources.files("procexec").joinpath("schemas/config.schema.json").read_text())
    variants = schema["properties"]["models"]["patternProperties"].popitem()[1]["oneOf"]
    return {name for ref in variants for name in schema["$defs"][ref["$ref"].split("/")[-1]]["properties"]}


def test_every_model_field_is_classified_once():
    deciding, inert = set(MODEL_FIELD_ROLES), set(NO_EFFECT_FIELDS)
    assert not deciding & inert, deciding & inert
    unclassified = _model_schema_fields() - deciding - inert
    assert not unclassified, f"classify these model fields in procexec.config.keys: {sorted(unclassified)}"
    assert not (deciding | inert) - _model_schema_fields(), "a classified field the schema does not have"
    assert MODEL_FIELD_ROLES["request_extra"] == "sampling"
    assert MODEL_FIELD_ROLES["tensor_parallel_size"] == "engine"
    assert {"gpus", "shards", "checkpoint_gb"} <= inert


class EngineBackend(ScriptedBackend):
    """The scripted backend with a real backend's identity: the model's engine fields."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def identity(self):
        return engine_identity(self.model, {})


def _run(config, tiny_datasets, tmp_path, out):
    directory, ids = tiny_datasets
    return run_job(
        JobSettings.from_config(config, "tiny"),
        directory,
        ids,
        1,
        1,
        tmp_path / "store",
        tmp_path / out,
        None,
        progress_interval=None,
        backend_factory=lambda settings, *rest: EngineBackend(settings.model),
    )


def test_sampling_and_engine_fields_miss_the_store_and_resources_do_not(tiny_config, tiny_datasets, tmp_path):
    config = changed_config(tiny_config, inference={"max_new_tokens": 400})
    n = len(_run(config, tiny_datasets, tmp_path, "a.jsonl.gz").records)
    changes = {
        "request_extra": ({"repetition_penalty": 1.1}, n),  # sampling: every generation is made again
        "tensor_parallel_size": (2, n),  # engine: another reduction order
        "gpus": (4, 0),
        "shards": (3, 0),
        "checkpoint_gb": (99.0, 0),
        "abbrev": ("T2", 0),  # nothing
    }
    base = output_settings(config.models["tiny"], config.inference)
    for field, (value, regenerated) in changes.items():
        changed = changed_config(config, models={"tiny": {field: value}})
        result = _run(changed, tiny_datasets, tmp_path, f"{field}.jsonl.gz")
        assert result.generated == regenerated, field
        # the workflow's rerun params move exactly when the store key does
        moved = output_settings(changed.models["tiny"], changed.inference) != base
        assert moved == bool(regenerated), field

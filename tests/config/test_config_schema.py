"""The checked-in JSON Schema of config.yaml is what the typed config generates.

Regenerate it with `python -m procexec.config.schema`.
"""

from __future__ import annotations

import json

from procexec.config.keys import MODEL_FIELD_ROLES, NO_EFFECT_FIELDS
from procexec.config.schema import SCHEMA_FILE, schema, schema_text


def test_the_checked_in_schema_is_the_generated_one():
    assert SCHEMA_FILE.read_text() == schema_text(), "run `python -m procexec.config.schema` and commit the file"


def test_every_field_of_the_schema_states_a_store_key_role():
    """Editors and docs see each field's role; a model field's role there is the one the store key uses."""
    generated = schema()
    for name, definition in generated["$defs"].items():
        for field, spec in definition["properties"].items():
            assert spec.get("role") in ("engine", "sampling", "prompt", "budget", "none"), (name, field)
            if name.endswith("Model"):
                assert spec["role"] == MODEL_FIELD_ROLES.get(field, "none"), (name, field)
                assert (field in NO_EFFECT_FIELDS) == (spec["role"] == "none"), (name, field)
    assert json.loads(SCHEMA_FILE.read_text())["$defs"]["VllmModel"]["properties"]["backend"]["default"] == "vllm"

"""The config's JSON Schema, generated from ``procexec.config.model`` and checked in for editors and docs.

Regenerate after changing a field: ``python -m procexec.config.schema`` (tests/config/test_config_schema.py
fails while the checked-in file differs from what the models generate).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from procexec.config.model import Config

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "schemas" / "config.schema.json"
#: pydantic keeps a number's bounds (an int or a float: a union) under its own names; JSON Schema's instead.
_BOUNDS = {"ge": "minimum", "gt": "exclusiveMinimum", "le": "maximum", "lt": "exclusiveMaximum"}


def schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of a config file, with each field's description, default and store-key role."""
    generated = _json_bounds(Config.model_json_schema())
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **generated,
        "title": "procexec workflow configuration",
    }


def _json_bounds(node: Any) -> Any:
    if isinstance(node, list):
        return [_json_bounds(item) for item in node]
    if not isinstance(node, dict):
        return node
    number = "anyOf" in node or "type" in node
    return {
        (_BOUNDS[k] if number and k in _BOUNDS and isinstance(v, (int, float)) else k): _json_bounds(v)
        for k, v in node.items()
    }


def schema_text() -> str:
    return json.dumps(schema(), indent=1, sort_keys=True, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    SCHEMA_FILE.write_text(schema_text())
    print(f"wrote {SCHEMA_FILE}")

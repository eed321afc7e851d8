"""A prepared (typed, frozen) config with some settings changed: how tests build a variant of a fixture's config."""

from __future__ import annotations

from typing import Any

from procexec.config.model import Config


def changed_config(
    config: Config, inference: dict[str, Any] | None = None, models: dict[str, dict[str, Any]] | None = None, **top: Any
) -> Config:
    """``config`` with ``inference`` fields, the named models' fields and top-level sections replaced."""
    entries = {key: entry.model_copy(update=(models or {}).get(key, {})) for key, entry in config.models.items()}
    return config.model_copy(
        update={"inference": config.inference.model_copy(update=inference or {}), "models": entries, **top}
    )

"""The backends that produce tokens, behind ``procexec.generation.backend.Backend``, found by kind.

A lazy registry in the style of inspect_ai's ``providers.py``: the config's
``backend`` names a kind, and only that kind's module is imported (vLLM is never
imported for an endpoint model, nor httpx for an in-process one).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from procexec.config import ENDPOINT, IN_PROCESS, SERVER
from procexec.generation.backend import Backend, BackendSpec
from procexec.generation.job_settings import JobSettings
from procexec.preparation.prepare import model_location

#: backend kind -> (module, class)
REGISTRY: dict[str, tuple[str, str]] = {
    IN_PROCESS: ("procexec.generation.backends.vllm", "VLLMBackend"),
    ENDPOINT: ("procexec.generation.backends.openai", "OpenAIBackend"),
    SERVER: ("procexec.generation.backends.vllm_server", "VLLMServerBackend"),
}


def create_backend(settings: JobSettings, manifest_path: Path | None) -> Backend:
    """The backend a model's config asks for, opened: checked, its tokenizer loaded, no weights loaded."""
    module, name = REGISTRY[settings.model["backend"]]
    backend_class = getattr(importlib.import_module(module), name)
    model_ref, manifest = model_location(settings.model, manifest_path)
    backend = backend_class(BackendSpec(settings.model, model_ref, manifest, settings.template_date))
    backend.open()
    return backend

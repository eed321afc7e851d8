"""The backends that produce tokens, behind ``procexec.generation.backend.Backend``, found by kind.

A lazy registry in the style of inspect_ai's ``providers.py``: the config's ``backend`` names a kind, and
only that kind's factory runs, whose import statement brings in its module (vLLM is never imported for an
endpoint model, nor httpx for an in-process one).  The imports are real statements, so import-linter,
grimp and a reader all see which module each kind is.  docs/backends.md says how to add a kind.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from procexec.config.model import OpenAIModel, VllmModel, VllmServerModel
from procexec.generation.backend import Backend, BackendSpec
from procexec.generation.job_settings import JobSettings
from procexec.preparation.prepare import model_location

#: A registered backend: a ``Backend`` subclass built from a ``BackendSpec``.
BackendClass = Callable[[BackendSpec], Backend]


def _vllm() -> BackendClass:
    from procexec.generation.backends.vllm import VLLMBackend

    return VLLMBackend


def _openai() -> BackendClass:
    from procexec.generation.backends.openai import OpenAIBackend

    return OpenAIBackend


def _vllm_server() -> BackendClass:
    from procexec.generation.backends.vllm_server import VLLMServerBackend

    return VLLMServerBackend


#: backend kind (the config's ``backend``) -> the factory that imports its class
REGISTRY: dict[str, Callable[[], BackendClass]] = {
    VllmModel.backend_kind: _vllm,
    OpenAIModel.backend_kind: _openai,
    VllmServerModel.backend_kind: _vllm_server,
}


def create_backend(settings: JobSettings, manifest_path: Path | None) -> Backend:
    """The backend a model's config asks for, opened: checked, its tokenizer loaded, no weights loaded."""
    backend_class = REGISTRY[settings.model.backend_kind]()
    model_ref, manifest = model_location(settings.model, manifest_path)
    backend = backend_class(
        BackendSpec(
            settings.model,
            model_ref,
            manifest,
            settings.template_date,
            settings.cache_dir,
            settings.server_start_ceiling_s,
            settings.stall_timeout_s,
            settings.admission_context,
        )
    )
    backend.open()
    return backend

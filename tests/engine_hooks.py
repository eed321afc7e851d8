"""A real in-process vLLM backend whose engine's step is wrapped: an interrupt or a hang at a chosen step."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from procexec.generation.backends import create_backend


def stepping_backend(wrap_step: Callable[[Callable[[], Any]], Callable[[], Any]]) -> Callable[..., Any]:
    """A ``backend_factory`` for ``run_job``: the engine, once loaded, steps through ``wrap_step(its step)``."""

    def factory(settings: Any, manifest: Any) -> Any:
        backend = create_backend(settings, manifest)
        start = backend._engine
        wrapped: list[Any] = []

        def engine() -> Any:
            llm = start()
            if not wrapped:  # once: the loaded engine is asked for again (Backend.start, then generate)
                llm.llm_engine.step = wrap_step(llm.llm_engine.step)
                wrapped.append(llm)
            return llm

        backend._engine = engine
        return backend

    return factory

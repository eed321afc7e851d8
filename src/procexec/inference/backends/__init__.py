"""The backends that produce tokens (in-process vLLM, an OpenAI-compatible endpoint), behind procexec.inference.backend."""

"""Stage 3, models: model preparation, staging a model's files, its manifest, and vLLM's own view of it (check-model)."""

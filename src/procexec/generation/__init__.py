"""Stage 4, generation: the inference job, its store, progress and statistics, and the backends that make tokens."""

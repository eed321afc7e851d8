"""Stage 4, generation: the generation job, its store, progress and statistics, and the backends that make tokens."""

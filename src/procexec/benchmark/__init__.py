"""The benchmark itself: the procedure grammar, the reference executor, the suite, the prompt, Table 4 and the dataset card."""

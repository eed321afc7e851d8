"""Running the study: the GPU-hour account and the status of a run in progress."""

#!/usr/bin/env bash
# Snakemake runs this inside the new envs/analysis.yaml environment, from the
# working directory (the repository root): install procexec itself, editable
# (code changes need no environment rebuild), without touching the pinned deps.
set -euo pipefail
python -m pip install --no-deps --editable "${PROCEXEC_SOURCE:-.}"

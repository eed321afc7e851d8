"""The study's GPU-hour account: a thin caller of ``procexec cost`` (procexec.cluster.cost).

Per run model of config.yaml: the parallel layout assumed (tensor, data and expert
parallel, speculative decoding) and its gain over plain tensor parallel, decoded
tokens (attempt 1, reruns) of the full study under the stated output model, GPU-hours
on the config's GPU (cluster.hardware; H200 by default) from the bandwidth model of decode at the in-flight context (interval:
decode efficiency 0.5-0.9) and the wall time with the model's shards at once; the
total against ``cluster.gpu_hours_budget`` when it is set.  With ``--measured
RESULTS`` the projection is fitted to a smoke/pilot's store.

    python benchmarks/gpu_hours.py [--config config.yaml] [--measured RESULTS] [--json]

Nothing is run on a GPU: arithmetic on stated assumptions (docs/cluster.md, "GPU-hours").
"""

from __future__ import annotations

import sys
from pathlib import Path

from procexec.cli import main

ROOT = Path(__file__).resolve().parents[1]

if __name__ == "__main__":
    argv = sys.argv[1:]
    if "--config" not in argv:
        argv = ["--config", str(ROOT / "config.yaml"), *argv]
    sys.exit(main(["cost", *argv]))

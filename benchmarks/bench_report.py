"""Benchmark: figures + tables + report for 15 models x 55 datasets of simulated scores (825k rows).

Setup (untimed): synthetic score rows following the score contract, the real
aggregation (20 bootstrap resamples to keep setup short), references for Table 4,
generations for Appendix I and Snakemake benchmark files.  Timed: the three
commands as the workflow runs them.  Target: < 180 s on 2 cores.

    /work/venv/bin/python benchmarks/bench_report.py [--work DIR] [--per-length 100]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import report_fixtures as rf  # noqa: E402
from procexec import config as config_mod  # noqa: E402
from procexec.cli import main as cli  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", default=None, help="working folder; default: a temporary one")
    parser.add_argument("--per-length", type=int, default=100)
    args = parser.parse_args()
    root = Path(args.work or tempfile.mkdtemp(prefix="bench-report-"))
    config_path = REPO / "config.yaml"
    models = config_mod.load(config_path).run_models
    started = time.perf_counter()
    scores = rf.synthetic_scores(models, rf.dataset_ids(), list(range(5, 100, 10)), args.per_length)
    rf.write_aggregate(scores, root / "aggregate")
    rf.write_references(scores, root / "references")
    # Appendix I reads the generation of every example it picks (a missing one is an error): write those.
    from procexec.analysis.appendix_examples import pick_examples

    rf.write_generations(pick_examples(scores), root / "generations")
    rf.write_benchmarks(models, root / "benchmarks")
    print(f"setup: {len(scores)} score rows, {time.perf_counter() - started:.0f} s (untimed)", flush=True)

    common = ["--config", str(config_path), "--aggregate-dir", str(root / "aggregate")]
    references = ["--references-dir", str(root / "references")]
    steps = {
        "figures": ["figures", *common, "--out-dir", str(root / "figures")],
        "tables": ["tables", *common, *references, "--out-dir", str(root / "tables")],
        "report": [
            "report",
            *common,
            *references,
            "--figures-dir",
            str(root / "figures"),
            "--tables-dir",
            str(root / "tables"),
            "--generations-dir",
            str(root / "generations"),
            "--benchmarks-dir",
            str(root / "benchmarks"),
            "--out",
            str(root / "report" / "index.html"),
        ],
    }
    # Wall time only: the drawing workers are forkserver children, invisible to getrusage.
    wall0 = time.perf_counter()
    for name, argv in steps.items():
        t = time.perf_counter()
        assert cli(argv) == 0, name
        print(f"  {name:8s} wall {time.perf_counter() - t:6.1f} s", flush=True)
    wall = time.perf_counter() - wall0
    print(
        f"full report, {len(models)} models x 55 datasets ({len(scores)} rows): wall {wall:.1f} s on "
        f"{len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.1f} "
        f"(target < 180 s on 2 cores) -> {'OK' if wall < 180 else 'OVER TARGET'}"
    )


if __name__ == "__main__":
    main()

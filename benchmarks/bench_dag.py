#!/usr/bin/env python3
"""Time `snakemake -n` (DAG building + dry run) on the paper's full study.

    python benchmarks/bench_dag.py [--repeat 3] [--config-file EXTRA.yaml ...]

Runs in a scratch working directory (`--directory`), so nothing is written to
the checkout, with config.yaml as is: 55 datasets x 15 models, ~1,000 jobs.
Reports wall time of the plain dry run (which prints every job) and of a
quiet one (`-n -q`, DAG only), best and median of --repeat runs, plus the
job count.  Target: under 10 s on a 2-core laptop.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 10.0


def snakemake_cmd() -> str:
    local = Path(sys.executable).parent / "snakemake"
    return str(local) if local.exists() else (shutil.which("snakemake") or "snakemake")


def time_dry_run(workdir: Path, extra: list[str], configfiles: list[str]) -> tuple[float, str]:
    cmd = [snakemake_cmd(), "-s", str(REPO / "Snakefile"), "--directory", str(workdir), "-n", "--nocolor", *extra]
    if configfiles:
        cmd += ["--configfile", *configfiles]
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"bench_dag: snakemake -n failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return elapsed, proc.stdout


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--config-file", action="append", default=[], help="extra --configfile (repeatable)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-dag-") as tmp:
        workdir = Path(tmp)
        time_dry_run(workdir, ["-q"], args.config_file)  # warm-up: source cache, bytecode
        results = {}
        for label, extra in (("snakemake -n", []), ("snakemake -n -q", ["-q"])):
            times, out = [], ""
            for _ in range(args.repeat):
                elapsed, stdout = time_dry_run(workdir, extra, args.config_file)
                times.append(elapsed)
                out = stdout or out
            results[label] = (times, out)

    times, out = results["snakemake -n"]
    total = re.search(r"^total\s+(\d+)\s*$", out, flags=re.M)
    jobs = int(total.group(1)) if total else -1
    print(
        f"full study (config.yaml{''.join(' + ' + c for c in args.config_file)}): {jobs} jobs, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    for label, (times, _) in results.items():
        print(
            f"  {label:<18} best {min(times):6.2f} s   median {statistics.median(times):6.2f} s   "
            f"(runs: {', '.join(f'{t:.2f}' for t in times)})"
        )
    best = min(results["snakemake -n"][0])
    verdict = "OK" if best < TARGET_S else "SLOW"
    print(f"  target < {TARGET_S:.0f} s: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The demo's generation job under what its CPU engine could be given: preloads, and AVX2 kernels on an AVX-512 host.

Usage::

    python benchmarks/bench_demo_engine.py --demo RUN_DIR [--variants plain preload avx2 avx2-preload] \\
        [--rounds 2] [--max-new-tokens 384] [--datasets D ...] [--iomp libiomp5.so] [--tcmalloc libtcmalloc_minimal.so.4]

``RUN_DIR`` holds a finished ``make demo`` (or ``bench_demo_models.py``) run: its prepared model, datasets and
merged config.  Each variant runs the demo's own ``procexec infer`` command (30 prompts, greedy, one engine) with
a fresh store, the variants alternated over ``--rounds``; per run: wall and CPU seconds (user + system of the
job), decoded tokens, the load average before, and a digest of the records' token ids (``bench_demo_models``),
so a variant that changes what is generated shows it, and two rounds of one variant show whether it is
repeatable.

* ``plain``: the job as the workflow runs it.
* ``preload``: ``LD_PRELOAD`` of tcmalloc and Intel OpenMP, as vLLM's CPU installation page asks
  (docs/demo.md says where each library comes from); the job's engine warns without them.  ``tcmalloc`` and
  ``iomp``: one of them.
* ``avx2``: the engine held to AVX2 on an AVX-512/AMX host, to estimate a 2-core AVX2-only machine: vLLM's
  kernel library chosen by ``torch.cpu._is_avx512_supported()`` (vllm/platforms/cpu.py ``import_kernels``) and
  its attention ISA by ``_is_amx_tile_supported``/``_is_avx512_supported`` (vllm/v1/attention/backends/cpu_attn.py
  ``_get_attn_isa``), both answered "no" by a ``sitecustomize`` on ``PYTHONPATH``; torch's own kernels held by
  ``ATEN_CPU_CAPABILITY=avx2``, oneDNN's (vLLM's linear layers, ``onednn_mm``) by ``ONEDNN_MAX_CPU_ISA=AVX2``,
  MKL's by ``MKL_ENABLE_INSTRUCTIONS=AVX2``.  ``--probe`` prints what each variant's process then uses.
  Clock, caches and memory bandwidth stay this host's: the figure is an estimate, not that machine's.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from bench_demo_models import records_digest

ROOT = Path(__file__).resolve().parents[1]
AVX2_ENV = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"}
SITECUSTOMIZE = '''"""bench_demo_engine's AVX2 hold: vLLM asks torch which x86 extensions the CPU has; answer no AVX-512, no AMX."""
import torch.cpu

for _name in ("_is_avx512_supported", "_is_avx512_bf16_supported", "_is_avx512_vnni_supported",
              "_is_amx_tile_supported", "_is_amx_fp16_supported"):
    if hasattr(torch.cpu, _name):
        setattr(torch.cpu, _name, lambda: False)
'''
PROBE = """
import sys, torch
from vllm.platforms import current_platform
current_platform.import_kernels()
from vllm.v1.attention.backends.cpu_attn import _get_attn_isa
print("torch ATen capability:", torch.backends.cpu.get_cpu_capability())
maps = open("/proc/self/maps").read()
print("vLLM kernels loaded:", [n for n in ("_C.abi3.so", "_C_AVX512.abi3.so", "_C_AVX2.abi3.so") if "/vllm/" + n in maps])
print("attention ISA (float32, block 128, head 64):", _get_attn_isa(torch.float32, 128, 64))
import vllm._custom_ops as ops
ops.onednn_mm(ops.create_onednn_mm(torch.randn(64, 64).t(), 32), torch.randn(8, 64), None)
"""


def variant_env(variant: str, work_dir: Path, iomp: Path | None, tcmalloc: Path | None) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{ROOT / '.venv' / 'bin'}:{os.environ['PATH']}"}
    if "avx2" in variant:
        hold = work_dir / "avx2-hold"
        hold.mkdir(parents=True, exist_ok=True)
        (hold / "sitecustomize.py").write_text(SITECUSTOMIZE)
        env.update(AVX2_ENV, PYTHONPATH=os.pathsep.join(filter(None, [str(hold), env.get("PYTHONPATH")])))
    wanted = {"tcmalloc": tcmalloc, "iomp": iomp}
    if "preload" in variant:
        wanted = {name: lib for name, lib in wanted.items() if lib is not None}
    else:
        wanted = {name: lib for name, lib in wanted.items() if name in variant}
    if any(lib is None for lib in wanted.values()):
        raise SystemExit(f"{variant}: needs --{' and --'.join(n for n, lib in wanted.items() if lib is None)}")
    if wanted:
        env["LD_PRELOAD"] = ":".join(str(lib) for lib in wanted.values())
    return env


def infer_argv(demo: Path, config: Path, out_dir: Path) -> list[str]:
    """The demo's infer command (rule infer) on the run's own files, into ``out_dir``."""
    merged = json.loads(config.read_text())
    model = merged["run_models"][0]
    results = demo / "results"
    return [
        *("procexec", "infer", "--config", str(config), "--model", model),
        *("--datasets-dir", str(results / "datasets"), "--datasets", *merged["suite"]["datasets"]),
        *("--shard", "1", "--num-shards", "1", "--manifest", str(results / "models" / model / "manifest.json")),
        *("--store", str(out_dir / "store"), "--out", str(out_dir / "shards" / "1-of-1.jsonl.gz")),
    ]


def run(argv: list[str], env: dict[str, str], log: Path) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one job."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.monotonic()
    with log.open("w") as handle:
        rc = subprocess.run(argv, env=env, stdout=handle, stderr=subprocess.STDOUT, cwd=ROOT).returncode
    wall = time.monotonic() - start
    if rc != 0:
        raise SystemExit(f"rc {rc}: {log}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo", type=Path, required=True, help="a finished demo run's folder (holds results/)")
    parser.add_argument("--variants", nargs="+", default=["plain", "avx2"])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=0, help="the demo model's budget (0: the run's)")
    parser.add_argument("--datasets", nargs="+", help="a subset of the run's datasets (default: all of them)")
    parser.add_argument("--iomp", type=Path, help="libiomp5.so (the intel-openmp wheel's)")
    parser.add_argument("--tcmalloc", type=Path, help="libtcmalloc_minimal.so.4 (Debian libtcmalloc-minimal4)")
    parser.add_argument("--work-dir", type=Path, default=Path("/tmp/procexec-demo-engine"))
    parser.add_argument("--probe", action="store_true", help="print each variant's torch, vLLM and oneDNN ISA")
    args = parser.parse_args()

    args.work_dir.mkdir(parents=True, exist_ok=True)
    configs = sorted((args.demo / "results" / "config").glob("*.json"), key=lambda p: p.stat().st_mtime)
    merged = json.loads(configs[-1].read_text())
    model = merged["run_models"][0]
    if args.max_new_tokens:
        merged["models"][model]["max_new_tokens"] = args.max_new_tokens
    if args.datasets:
        merged["suite"]["datasets"] = args.datasets
    config = args.work_dir / "config.json"
    config.write_text(json.dumps(merged))
    envs = {v: variant_env(v, args.work_dir, args.iomp, args.tcmalloc) for v in args.variants}
    if args.probe:
        for variant, env in envs.items():
            probe_env = {**env, "ONEDNN_VERBOSE": "1"}
            out = subprocess.run([sys.executable, "-c", PROBE], env=probe_env, capture_output=True, text=True, cwd=ROOT)
            lines = (out.stdout + out.stderr).splitlines()
            shown = [
                line
                for line in lines
                if line.startswith(("torch", "vLLM", "attention")) or ",isa:" in line or ",exec,cpu,matmul," in line
            ]
            print(f"{variant}:", *[f"  {line}" for line in shown[:8]], sep="\n")
    print("| variant | round | wall s | CPU s | tokens | load before | records |")
    print("|---|---|---|---|---|---|---|")
    for round_ in range(args.rounds):
        for variant in args.variants if round_ % 2 == 0 else args.variants[::-1]:
            out_dir = args.work_dir / f"{variant}-{round_ + 1}"
            subprocess.run(["rm", "-rf", str(out_dir)], check=True)
            (out_dir / "shards").mkdir(parents=True)
            load = os.getloadavg()[0]
            wall, cpu = run(infer_argv(args.demo, config, out_dir), envs[variant], out_dir / "infer.log")
            digest = records_digest(out_dir / "shards")
            with gzip.open(out_dir / "shards" / "1-of-1.jsonl.gz", "rt") as handle:
                tokens = sum(len(json.loads(line)["token_ids"]) for line in handle)
            print(
                f"| {variant} | {round_ + 1} | {wall:.0f} | {cpu:.0f} | {tokens:,} | {load:.1f} | `{digest}` |",
                flush=True,
            )


if __name__ == "__main__":
    main()

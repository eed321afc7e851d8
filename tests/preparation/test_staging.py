"""Hub models staged on the submit host, pinned to a commit, loaded offline (issue: staging).

A real Hugging Face cache layout is built at test time from the tiny Llama's
files (``models--ORG--NAME/{blobs,snapshots/<commit>,refs/main}``, LFS files
stored as blobs named by their sha256, as huggingface_hub stores them) and
driven through huggingface_hub's own offline resolution.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cli_runs import procexec_in_process
from procexec.config.model import ModelBase, OpenAIModel, VllmModel
from procexec.errors import ProcexecError
from procexec.io.files import sha256_file
from procexec.preparation.staging import wanted_files

COMMIT_A = "a" * 8 + "1" * 32
COMMIT_B = "b" * 8 + "2" * 32
REPO = "procexec/tiny-hub"


def hub_cache(root: Path, snapshots: dict[str, Path], main: str) -> Path:
    """``root`` as a Hugging Face hub cache holding ``REPO`` at the given commits, refs/main -> ``main``."""
    repo = root / f"models--{REPO.replace('/', '--')}"
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for commit, folder in snapshots.items():
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        for path in sorted(folder.iterdir()):
            data = path.read_bytes()
            if path.suffix == ".safetensors":  # an LFS file: its blob is named by its sha256
                blob = hashlib.sha256(data).hexdigest()
            else:  # a git blob: named by its git sha1
                blob = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
            (repo / "blobs" / blob).write_bytes(data)
            link = snapshot / path.name
            if not link.is_symlink():
                link.symlink_to(f"../../blobs/{blob}")
    point(root, main)
    return root


def point(root: Path, commit: str) -> None:
    refs = root / f"models--{REPO.replace('/', '--')}" / "refs"
    refs.mkdir(parents=True, exist_ok=True)
    (refs / "main").write_text(commit)


@pytest.fixture
def staged(tiny_manifest, tiny_raw_config, tiny_datasets, tmp_path):
    """Two snapshots of the tiny Llama (seed 0 and seed 1 weights), refs/main at the first; a config using it."""
    from procexec.preparation.prepare import build_tiny_llama

    other = build_tiny_llama(tmp_path / "seed-1", seed=1)
    cache = hub_cache(tmp_path / "hub", {COMMIT_A: tiny_manifest.parent / "hf", COMMIT_B: other}, COMMIT_A)
    point(cache, COMMIT_A)
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["hubtiny"] = {
        **{k: v for k, v in raw["models"]["tiny"].items() if k not in ("source", "revision")},
        "hf_id": REPO,
        "revision": "main",
    }
    raw["run_models"] = ["hubtiny"]
    raw.update(models_dir=str(cache), model_lock=str(tmp_path / "models.lock.yaml"))
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    return config_path, cache, tmp_path


def procexec(*args, offline=True, **extra_env):
    env = {**os.environ, **extra_env}
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "procexec.cli", *map(str, args)], capture_output=True, text=True, env=env, timeout=600
    )


def prepare(config_path, tmp_path):
    out = tmp_path / "models" / "hubtiny" / "manifest.json"
    proc = procexec("prepare-model", "--config", config_path, "--model", "hubtiny", "--out", out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(out.read_text()), out


def infer(config_path, tmp_path, manifest_path, tiny_datasets, in_process=False, **env):
    """``procexec infer`` of the staged model, in a process of its own with ``env`` (the hub's settings are read
    when huggingface_hub is imported), or ``in_process`` (in the test's, no second import of vLLM)."""
    directory, ids = tiny_datasets
    argv = (
        "infer",
        "--config",
        config_path,
        "--model",
        "hubtiny",
        "--datasets-dir",
        directory,
        "--datasets",
        *ids,
        "--store",
        tmp_path / "store",
        "--out",
        tmp_path / "shard.jsonl.gz",
        "--manifest",
        manifest_path,
        "--no-progress",
    )
    if in_process:
        assert not env, "a process's environment needs a process of its own"
        return procexec_in_process(*argv)
    return procexec(*argv, offline=False, **env)


def records(tmp_path):
    from procexec.io.jsonl import read_jsonl

    return [obj for _, obj in read_jsonl(tmp_path / "shard.jsonl.gz")]


@pytest.mark.vllm
def test_staging_pins_the_commit_hashes_like_the_hub_and_gpu_jobs_run_offline(staged, tiny_datasets):
    config_path, cache, tmp_path = staged
    manifest, manifest_path = prepare(config_path, tmp_path)
    snapshot = cache / "models--procexec--tiny-hub" / "snapshots" / COMMIT_A
    assert manifest["commit"] == COMMIT_A and Path(manifest["model_dir"]) == snapshot.resolve()
    weights = manifest["files"]["model.safetensors"]
    assert weights["sha256"] == sha256_file(snapshot / "model.safetensors")  # the hub's LFS sha256 (the blob name)
    assert weights["size"] == (snapshot / "model.safetensors").stat().st_size
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(manifest["files"])
    lock = yaml.safe_load((tmp_path / "models.lock.yaml").read_text())
    assert lock["models"]["hubtiny"]["commit"] == COMMIT_A and lock["models"]["hubtiny"]["revision"] == "main"

    # The GPU job loads the snapshot with the hub switched off: an unreachable endpoint is never asked.
    run = infer(config_path, tmp_path, manifest_path, tiny_datasets, HF_ENDPOINT="http://127.0.0.1:9")
    assert run.returncode == 0, run.stderr[-3000:]
    first = records(tmp_path)
    assert {r["provenance"]["commit"] for r in first} == {COMMIT_A}

    # main moves to another snapshot: the locked run still uses the first one, and the store answers.
    point(cache, COMMIT_B)
    again, _ = prepare(config_path, tmp_path)
    assert again == manifest
    rerun = infer(config_path, tmp_path, manifest_path, tiny_datasets, in_process=True)
    assert rerun.returncode == 0 and ", 0 generated" in rerun.stderr, rerun.stderr[-2000:]

    # Moving the lock on purpose stages the new commit and invalidates exactly this model's generations.
    moved = procexec("lock-models", "--config", config_path, "--update", "hubtiny")
    assert moved.returncode == 0 and COMMIT_B in moved.stdout, moved.stderr
    updated, _ = prepare(config_path, tmp_path)
    assert updated["commit"] == COMMIT_B
    assert updated["files"]["model.safetensors"]["sha256"] != weights["sha256"]
    fresh = infer(config_path, tmp_path, manifest_path, tiny_datasets, in_process=True)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    second = records(tmp_path)
    assert len(second) == len(first) and f", {len(first)} generated" in fresh.stderr
    assert {r["provenance"]["commit"] for r in second} == {COMMIT_B}
    assert not {r["provenance"]["cache_key"] for r in second} & {r["provenance"]["cache_key"] for r in first}


def test_an_interrupted_staging_completes_without_fetching_again(staged):
    config_path, cache, tmp_path = staged
    manifest, manifest_path = prepare(config_path, tmp_path)
    blobs = sorted((cache / "models--procexec--tiny-hub" / "blobs").iterdir())
    before = {b.name: (b.stat().st_ino, b.stat().st_mtime_ns) for b in blobs}
    manifest_path.unlink()  # killed after the download, before the manifest was written
    again, _ = prepare(config_path, tmp_path)  # offline: a fetch would fail
    assert again == manifest
    assert {b.name: (b.stat().st_ino, b.stat().st_mtime_ns) for b in blobs} == before


def test_an_incomplete_snapshot_is_one_clear_error_before_the_engine(staged, tiny_datasets):
    config_path, cache, tmp_path = staged
    _, manifest_path = prepare(config_path, tmp_path)
    (cache / "models--procexec--tiny-hub" / "snapshots" / COMMIT_A / "model.safetensors").unlink()
    run = infer(config_path, tmp_path, manifest_path, tiny_datasets)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert len(run.stderr.strip().splitlines()) == 1
    assert "model.safetensors is missing: the staged snapshot is incomplete" in run.stderr


def test_a_changed_revision_must_move_its_lock_on_purpose(staged):
    config_path, cache, tmp_path = staged
    prepare(config_path, tmp_path)
    raw = yaml.safe_load(config_path.read_text())
    raw["models"]["hubtiny"]["revision"] = COMMIT_B
    config_path.write_text(yaml.safe_dump(raw))
    proc = procexec("prepare-model", "--config", config_path, "--model", "hubtiny", "--out", tmp_path / "m.json")
    assert proc.returncode == 2
    assert "models.hubtiny: the lock" in proc.stderr and "procexec lock-models --update hubtiny" in proc.stderr


def test_not_enough_disk_is_one_clear_error_before_anything_is_written(tiny_raw_config, tmp_path, monkeypatch):
    """Online staging (the hub's dry run lists what is missing) against a full disk: nothing is written."""
    import huggingface_hub
    from huggingface_hub.file_download import DryRunFileInfo

    from procexec.config import prepare as prepare_config
    from procexec.preparation import staging
    from procexec.preparation.prepare import prepare_model

    def dry_run(repo_id, revision, cache_dir, dry_run=False, **kwargs):
        assert dry_run, "a download was attempted"
        names = {
            "model-00001-of-00002.safetensors": 400e9,
            "model-00002-of-00002.safetensors": 300e9,
            "config.json": 2e3,
            "tokenizer.json": 9e6,
            "README.md": 1e4,
        }
        return [DryRunFileInfo(revision, int(size), name, "", False, True) for name, size in names.items()]

    monkeypatch.setattr(huggingface_hub, "snapshot_download", dry_run)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["big"] = {**raw["models"]["tiny"], "source": "hf", "hf_id": "org/big", "revision": COMMIT_A}
    config = prepare_config(raw)
    cache, lock = tmp_path / "hub", tmp_path / "models.lock.yaml"
    with pytest.raises(
        ProcexecError,
        match=rf"models_dir {cache}: staging org/big@aaaaaaaa1111 needs 700.0 GB more, "
        r"[0-9.,]+ GB free",
    ):
        prepare_model(config.models["big"], tmp_path / "m" / "manifest.json", models_dir=cache, lock_path=lock)
    assert not lock.exists() and not (tmp_path / "m").exists() and not any(cache.iterdir())
    assert staging.check_free_space(cache, 1, "x") is None


def test_a_hub_answer_without_a_commit_is_refused_and_nothing_is_locked(tmp_path, monkeypatch):
    """huggingface_hub's ModelInfo.sha is optional: an answer without one is one error line, never a null
    commit in the lock (mypy found it: resolve_commit returned the None as the commit)."""
    import huggingface_hub
    from huggingface_hub.hf_api import ModelInfo

    from procexec.preparation.staging import lock_model

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", lambda self, repo_id, **kwargs: ModelInfo(id=repo_id))
    lock = tmp_path / "models.lock.yaml"
    with pytest.raises(ProcexecError, match=r"^org/t@main: the hub's answer names no commit$"):
        lock_model(lock, _entry(revision="main"), tmp_path / "hub")
    assert not lock.exists() or "org/t" not in lock.read_text()


def _entry(**fields: object) -> ModelBase:
    """A typed models entry: the fields staging reads, the rest the smallest valid values."""
    base = {"abbrev": "T", "hf_id": "org/t", "gpus": 1, "shards": 1, "tensor_parallel_size": 1, "max_model_len": 64}
    variant = OpenAIModel if fields.get("backend") == "openai" else VllmModel
    return variant(**{**base, **fields})


def test_only_the_files_vllm_reads_are_staged():
    names = [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "consolidated.safetensors",
        "params.json",
        "tekken.json",
        "tokenizer.model.v3",
        "SYSTEM_PROMPT.txt",
        "original/model--00001-of-00007.safetensors",
        "metal/model.bin",
        "README.md",
        ".gitattributes",
        "modeling_kimi.py",
        "tiktoken.model",
        "LICENSE",
    ]
    hf = wanted_files(names, _entry())
    assert "consolidated.safetensors" not in hf and "model-00001-of-00002.safetensors" in hf
    assert not any(n.startswith(("original/", "metal/")) or n in ("README.md", "LICENSE") for n in hf)
    assert {"modeling_kimi.py", "tiktoken.model", "model.safetensors.index.json"} <= set(hf)
    mistral = wanted_files(names, _entry(engine_kwargs={"load_format": "mistral"}))
    assert [n for n in mistral if n.endswith(".safetensors")] == ["consolidated.safetensors"]
    assert {"params.json", "tekken.json", "tokenizer.model.v3"} <= set(mistral)
    assert "model.safetensors.index.json" not in mistral
    endpoint = wanted_files(names, _entry(backend="openai", base_url="http://host:8000/v1"))
    assert not any(n.endswith(".safetensors") for n in endpoint) and "tokenizer.json" in endpoint


def _snapshot(cache: Path) -> Path:
    return cache / "models--procexec--tiny-hub" / "snapshots" / COMMIT_A


def _refused(proc, *expected: str) -> None:
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and all(e in lines[0] for e in expected), lines


@pytest.mark.parametrize("fault", ["no config.json", "dangling tokenizer link", "dangling config link"])
def test_staging_refuses_a_snapshot_the_engine_cannot_load_before_writing_a_manifest(fault, staged):
    config_path, cache, tmp_path = staged
    snapshot = _snapshot(cache)
    name = {
        "no config.json": "config.json",
        "dangling tokenizer link": "tokenizer.json",
        "dangling config link": "config.json",
    }[fault]
    if fault == "no config.json":
        (snapshot / name).unlink()
    else:  # the link stays, its blob is gone (an interrupted or pruned download)
        (snapshot / name).resolve().unlink()
    out = tmp_path / "models" / "hubtiny" / "manifest.json"
    proc = procexec("prepare-model", "--config", config_path, "--model", "hubtiny", "--out", out)
    expected = f"has no {name}" if fault == "no config.json" else f"{name} is a link to ../../blobs/"
    _refused(proc, f"{REPO}@{COMMIT_A}", expected)
    assert not out.exists() and not out.parent.exists()


def test_a_path_model_folder_with_a_dangling_link_or_without_its_config_is_refused(
    tiny_manifest, tiny_raw_config, tmp_path
):
    import shutil

    folder = tmp_path / "folder"
    shutil.copytree(tiny_manifest.parent / "hf", folder)
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["tiny"].update(source="path", path=str(folder))
    config_path = tmp_path / "config.yaml"
    config_path.write_text(yaml.safe_dump(raw))
    out = tmp_path / "m" / "manifest.json"
    (folder / "tokenizer.json").rename(folder / "tokenizer.moved")
    (folder / "tokenizer.json").symlink_to(folder / "nowhere.json")
    _refused(
        procexec("prepare-model", "--config", config_path, "--model", "tiny", "--out", out),
        "models.tiny.path: ",
        "tokenizer.json is a link to",
    )
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.moved").rename(folder / "tokenizer.json")
    (folder / "config.json").unlink()
    _refused(
        procexec("prepare-model", "--config", config_path, "--model", "tiny", "--out", out),
        "models.tiny.path: ",
        "has no config.json",
    )
    assert not out.exists()


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json"])
def test_a_same_size_corruption_of_a_staged_file_is_caught_before_the_engine(name, staged, tiny_datasets):
    config_path, cache, tmp_path = staged
    manifest, manifest_path = prepare(config_path, tmp_path)
    path = _snapshot(cache) / name
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit: the same size, another file
    target = path.resolve()
    target.chmod(0o644)
    target.write_bytes(bytes(data))
    assert path.stat().st_size == manifest["files"][name]["size"]
    run = infer(config_path, tmp_path, manifest_path, tiny_datasets)
    _refused(run, str(manifest_path), f"{name} is not the file the manifest hashed (sha256 differs at the same size)")
    assert not (tmp_path / "store").exists() and not (tmp_path / "shard.jsonl.gz").exists()

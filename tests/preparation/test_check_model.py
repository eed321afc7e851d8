"""``procexec check-model``: vLLM's own model configuration, built on the submit host (no GPU).

Expected values are computed here from the folder's ``config.json``, not taken from vLLM.
"""

from __future__ import annotations

import copy
import json
import math
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from procexec.cli import main
from procexec.engine.tokenizer import load_tokenizer

# KV dtype bytes under dtype "auto" by the checkpoint's torch_dtype: vLLM 0.32 downcasts a float32
# checkpoint to bfloat16 on every platform this runs on (H200, CPU build, no-GPU submit host:
# vllm/config/model.py, _resolve_auto_dtype takes supported_dtypes[0]); 16-bit ones stay.
DTYPE_BYTES = {"float32": 2, "bfloat16": 2, "float16": 2}
GIB = 2**30


def _write_config(tmp_path: Path, raw: dict) -> Path:
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def _check(capsys, config: Path, model: str, *extra: str) -> tuple[int, str, str]:
    code = main(["check-model", "--config", str(config), "--model", model, *extra])
    out, err = capsys.readouterr()
    return code, out, err


def _kv_bytes_per_token(hf_config: dict) -> int:
    heads = hf_config["num_attention_heads"]
    head_dim = hf_config.get("head_dim") or hf_config["hidden_size"] // heads
    kv_heads = hf_config.get("num_key_value_heads", heads)
    dtype_bytes = DTYPE_BYTES[hf_config.get("torch_dtype") or hf_config.get("dtype")]
    return 2 * hf_config["num_hidden_layers"] * kv_heads * head_dim * dtype_bytes


@pytest.mark.vllm
def test_check_model_prints_what_vllm_derives_for_the_tiny_llama(tiny_raw_config, tiny_manifest, tmp_path, capsys):
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["tiny"].update(gpus=1)  # a GPU model, for the estimate
    config = _write_config(tmp_path, raw)
    out_file = tmp_path / "check.json"
    code, out, err = _check(capsys, config, "tiny", "--manifest", str(tiny_manifest), "--json", "--out", str(out_file))
    assert code == 0, err
    check = json.loads(out)
    assert json.loads(out_file.read_text()) == check
    manifest = json.loads(tiny_manifest.read_text())
    hf_config = json.loads((tiny_manifest.parent / manifest["model_dir"] / "config.json").read_text())
    assert check["checked"] and check["architecture"] == "LlamaForCausalLM"
    assert check["architectures"] == ["LlamaForCausalLM"]
    assert check["max_model_len"] == 768 and check["max_context"] == 768
    assert check["derived_max_model_len"] == hf_config["max_position_embeddings"] == 4096
    assert check["derived_max_model_len_key"] == "max_position_embeddings"
    assert check["dtype"] == "bfloat16" and check["quantization"] is None
    assert check["tokenizer_mode"] == "auto" and not check["remote_code_config"] and not check["mla"]
    # the ids infer holds stored tokens to (the in-process backend's len(tokenizer)), for status --verify
    tokenizer = load_tokenizer(str(tiny_manifest.parent / manifest["model_dir"]), "auto", False)
    assert check["vocabulary"] == len(tokenizer) == 512
    expected = _kv_bytes_per_token(hf_config)
    assert expected == 2 * 2 * 2 * 32 * 2 == check["kv_bytes_per_token"] == check["kv_bytes_per_token_per_gpu"]
    # sequences of max_context on one H200: (141 GB, architecture.yaml's, x vLLM 0.32's default utilization 0.92
    # - checkpoint) / KV
    checkpoint = sum(f["size"] for f in manifest["files"].values())
    assert check["checkpoint_bytes"] == checkpoint and check["checkpoint_source"] == "staged files"
    assert check["gpu_memory_utilization"] == 0.92 and check["gpu_memory_bytes"] == 141e9
    assert check["runtime_overhead_bytes"] == 4 * 2**30  # architecture.yaml's haircut, as procexec cost deducts
    assert check["sequences_fit"] == math.floor((141e9 * 0.92 - checkpoint - 4 * 2**30) / (expected * 768))
    assert check["sequences_per_node"] == check["sequences_fit"] and check["data_parallel_size"] == 1

    code, text, err = _check(capsys, config, "tiny", "--manifest", str(tiny_manifest))
    assert code == 0, err
    assert "architecture: LlamaForCausalLM" in text and "max_model_len: 768" in text
    assert f"KV cache: {expected:,} bytes/token" in text and f"{check['sequences_fit']} sequences" in text
    assert "gpu_memory x gpu_memory_utilization - weights_per_gpu" in text  # the formula is named
    assert "not checked off the node" in text
    code, out, err = _check(
        capsys, config, "tiny", "--manifest", str(tiny_manifest), "--json", "--gpu-memory-gib", "139"
    )
    assert json.loads(out)["gpu_memory_bytes"] == 139 * GIB


# The frontier models' config.json as vLLM reads them: DeepSeek-V3's architecture (the V3 config copy cited in
# docs/models.md, "Architecture numbers") with V3.2's indexer fields; Kimi-K2.5 wraps the same text model (384
# experts, 64 heads, one dense layer) with a vision tower, whose processor settings vLLM's loader reads.
DEEPSEEK_V3 = dict(
    hidden_size=7168,
    num_hidden_layers=61,
    num_attention_heads=128,
    num_key_value_heads=128,
    kv_lora_rank=512,
    q_lora_rank=1536,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    n_routed_experts=256,
    n_shared_experts=1,
    num_experts_per_tok=8,
    moe_intermediate_size=2048,
    intermediate_size=18432,
    first_k_dense_replace=3,
    moe_layer_freq=1,
    vocab_size=129280,
    max_position_embeddings=163840,
    rope_theta=10000,
    torch_dtype="bfloat16",
    n_group=8,
    topk_group=4,
    routed_scaling_factor=2.5,
    scoring_func="sigmoid",
    topk_method="noaux_tc",
    norm_topk_prob=True,
    rope_scaling={
        "type": "yarn",
        "factor": 40,
        "original_max_position_embeddings": 4096,
        "beta_fast": 32,
        "beta_slow": 1,
        "mscale": 1.0,
        "mscale_all_dim": 1.0,
    },
)
FRONTIER = {
    "ds-685": {
        "architectures": ["DeepseekV32ForCausalLM"],
        "model_type": "deepseek_v32",
        **DEEPSEEK_V3,
        "index_head_dim": 128,
        "index_n_heads": 64,
        "index_topk": 2048,
        "quantization_config": {
            "quant_method": "fp8",
            "activation_scheme": "dynamic",
            "fmt": "e4m3",
            "weight_block_size": [128, 128],
        },
    },
    "kk-1t": {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {
            **DEEPSEEK_V3,
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "num_attention_heads": 64,
            "num_key_value_heads": 64,
            "n_routed_experts": 384,
            "first_k_dense_replace": 1,
            "max_position_embeddings": 262144,
            "vocab_size": 163840,
            "rope_scaling": {**DEEPSEEK_V3["rope_scaling"], "factor": 64.0},
        },
        "vision_config": {"merge_kernel_size": [2, 2], "patch_size": 14},
    },
}
KIMI_PROCESSOR = {
    "media_proc_cfg": {
        "merge_kernel_size": [2, 2],
        "temporal_merge_kernel_size": 4,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
}


@pytest.fixture
def numba_left_behind():
    """Kimi-K2.5's processor imports numba (vllm/transformers_utils/processors/kimi_k25_vision_fused.py) into this
    test's process, where check-model runs in-process; vLLM's CPU worker, started later by another test of the same
    worker, scans every module for its kernel overrides and fails on llvmlite's ``ffi.lib``, whose ``__dict__`` is a
    wrapped C function.  A check-model command runs in a process of its own: the test leaves the modules behind."""
    before = set(sys.modules)
    yield
    for name in set(sys.modules) - before:
        if name.split(".")[0] in ("numba", "llvmlite"):
            del sys.modules[name]


@pytest.mark.vllm
@pytest.mark.usefixtures("numba_left_behind")
def test_check_model_counts_the_frontier_models_sequences_as_cost_does(tiny_manifest, tmp_path, capsys, request):
    """DS-685 (TP2 x DP4 + EP) and KK-1T (DP8 + EP) as config.yaml serves them: per-rank weights (experts over all
    eight GPUs), the MLA latent (and DS-685's indexer keys, from config.json's index_head_dim) whole on each rank,
    the runtime's overhead out of the pool; check-model's sequences per engine are cost's."""
    from procexec.cluster.cost.catalog import load_architecture
    from procexec.preparation.prepare import MANIFEST_VERSION

    raw = yaml.safe_load((request.config.rootpath / "config.yaml").read_text())
    catalog = load_architecture()
    manifests = {}
    for key, hf_config in FRONTIER.items():
        folder = tmp_path / key
        shutil.copytree(tiny_manifest.parent / "hf", folder)  # the tiny tokenizer: vLLM's config is what counts
        (folder / "config.json").write_text(json.dumps(hf_config))
        if key == "kk-1t":
            (folder / "preprocessor_config.json").write_text(json.dumps(KIMI_PROCESSOR))
        raw["models"][key].update(source="path", path=str(folder))
        # staged files of the documented checkpoint's size (architecture.yaml's weight_gb)
        size = int(catalog.models[raw["models"][key]["abbrev"]].weight_bytes)
        os.truncate(folder / "model.safetensors", size)  # sparse: no disk taken
        manifests[key] = tmp_path / f"{key}.json"
        manifests[key].write_text(
            json.dumps(
                {
                    "manifest_version": MANIFEST_VERSION,
                    "model": key,
                    "source": "path",
                    "hf_id": raw["models"][key]["hf_id"],
                    "revision": "main",
                    "commit": None,
                    "model_dir": str(folder),
                    "procexec_version": "0",
                    "transformers_version": "0",
                    "files": {"model.safetensors": {"size": size, "sha256": "0" * 64}},
                }
            )
        )
    config = _write_config(tmp_path, raw)
    assert main(["cost", "--config", str(config), "--json"]) == 0
    projected = {row["model"]: row for row in json.loads(capsys.readouterr().out)["models"]}
    expected = {"ds-685": ("TP2 x DP4 + EP", 4), "kk-1t": ("TP1 x DP8 + EP", 8)}
    for key, (layout, engines) in expected.items():
        code, out, err = _check(capsys, config, key, "--json", "--manifest", str(manifests[key]))
        assert code == 0, err
        check = json.loads(out)
        assert check["kv_bytes_per_token_per_gpu"] == 70272 and check["mla"]  # 61 x (512 + 64) x 2 bytes, whole
        # DeepSeek-V3.2's indexer: 61 x (128 fp8 bytes + a 4-byte scale); Kimi-K2.5 has none
        assert check["indexer_bytes_per_token"] == (61 * 132 if key == "ds-685" else 0)
        assert check["runtime_overhead_bytes"] == 10 * 2**30 and check["sliding_layers"] == 0
        per_engine = projected[key]["sequences_per_engine"]
        assert per_engine >= 1 and check["sequences_fit"] == per_engine
        assert check["sequences_per_node"] == engines * per_engine and check["note"] is None
        code, text, err = _check(capsys, config, key, "--manifest", str(manifests[key]))
        assert f"{layout} on 8 GPU(s): {per_engine} sequences of max_context" in text
        assert f"{engines * per_engine} per node" in text and "not checked off the node" in text


@pytest.mark.vllm
def test_sliding_window_layers_hold_at_most_their_window(tiny_raw_config, tiny_manifest, tmp_path, capsys):
    """A config.json whose layer_types make one of the tiny Llama's two layers slide over 64 tokens (vLLM's Llama
    gives that layer per_layer_sliding_window): a sequence of max_context 768 holds 768 tokens in one layer and 64
    in the other, so more sequences fit than at full length (as procexec cost counts OL-7 and OA-120)."""
    manifest = json.loads(tiny_manifest.read_text())
    sliding = tmp_path / "tiny-sliding"
    shutil.copytree(tiny_manifest.parent / manifest["model_dir"], sliding)
    hf_config = json.loads((sliding / "config.json").read_text())
    hf_config.update(sliding_window=64, layer_types=["sliding_attention", "full_attention"])
    (sliding / "config.json").write_text(json.dumps(hf_config))
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["tiny-sliding"] = {**raw["models"]["tiny"], "source": "path", "path": str(sliding), "gpus": 1}
    code, out, err = _check(capsys, _write_config(tmp_path, raw), "tiny-sliding", "--json")
    assert code == 0, err
    check = json.loads(out)
    assert (check["sliding_window"], check["sliding_layers"], check["attention_layers"]) == (64, 1, 2)
    per_layer = check["kv_bytes_per_token_per_gpu"] / 2
    pool = 141e9 * 0.92 - check["checkpoint_bytes"] - 4 * 2**30
    assert check["sequences_fit"] == math.floor(pool / (per_layer * 768 + per_layer * 64))
    assert check["sequences_fit"] > math.floor(pool / (2 * per_layer * 768))


@pytest.mark.vllm
def test_a_max_model_len_above_config_json_is_one_line_exit_2(tiny_raw_config, tiny_manifest, tmp_path, capsys):
    manifest = json.loads(tiny_manifest.read_text())
    capped = tmp_path / "tiny-capped"
    shutil.copytree(tiny_manifest.parent / manifest["model_dir"], capped)
    hf_config = json.loads((capped / "config.json").read_text())
    hf_config["max_position_embeddings"] = 512  # below the configured max_model_len of 768
    (capped / "config.json").write_text(json.dumps(hf_config))
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["tiny-capped"] = {**raw["models"]["tiny"], "source": "path", "path": str(capped)}
    code, out, err = _check(capsys, _write_config(tmp_path, raw), "tiny-capped")
    assert code == 2 and out == ""
    assert err.count("\n") == 1, err
    assert err.startswith(
        "procexec check-model: error: models.tiny-capped.max_model_len: 768 is above the 512 "
        "that vLLM derives from config.json (max_position_embeddings)"
    ), err


@pytest.mark.parametrize(
    "spec, named",
    [
        ({"method": "ngram-fast", "num_speculative_tokens": 3}, "models.tiny.speculative_config.method: 'ngram-fast'"),
        ({"method": "ngram", "num_speculative_tokens": 0}, "models.tiny.speculative_config.num_speculative_tokens: 0"),
        (  # SpeculativeConfig's own relation (vllm/config/speculative.py:1217), checked without vLLM (issue 38.5)
            {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "models.tiny.speculative_config.prompt_lookup_min: 4 exceeds prompt_lookup_max 2",
        ),
    ],
)
def test_a_speculative_config_vllm_refuses_leaves_the_previous_check(
    tiny_raw_config, tiny_manifest, tmp_path, capsys, spec, named
):
    """Refused in one line before vLLM is loaded (issue 30 item 5); the last check file stays byte for byte."""
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["tiny"]["speculative_config"] = spec
    previous = tmp_path / "check.json"
    previous.write_text('{"checked": true}\n')
    code, out, err = _check(
        capsys, _write_config(tmp_path, raw), "tiny", "--manifest", str(tiny_manifest), "--out", str(previous)
    )
    assert code == 2 and out == "" and err.count("\n") == 1 and named in err, err
    assert previous.read_text() == '{"checked": true}\n' and sorted(tmp_path.iterdir()) == [
        previous,
        tmp_path / "config.yaml",
    ]


SERVER_REFUSALS = {
    "data parallel rank outside the size": (
        {"serve_args": ["--data-parallel-size", "2", "--data-parallel-rank", "2"]},
        "models.srv.serve_args: vLLM refuses the parallel configuration: data_parallel_rank (2) must be in the range "
        "[0, 2)",
    ),
}


@pytest.mark.vllm
@pytest.mark.parametrize("name", [*SERVER_REFUSALS, "accepted"])
def test_vllm_s_own_parallel_and_speculative_configs_refuse_in_one_line(
    tiny_raw_config, tiny_manifest, tmp_path, capsys, name
):
    """check-config passes these (each value is in range alone); vLLM's ParallelConfig, built by check-model from
    the tiny Llama's folder and the server's parsed serve_args, refuses them (issue 30 item 5; a speculative_config
    vLLM refuses without the model is check-config's since issue 38);
    the last check file stays byte for byte.  Without the offending value the same server model passes."""
    change, named = SERVER_REFUSALS.get(name, ({"serve_args": ["--data-parallel-size", "2"]}, None))
    manifest = json.loads(tiny_manifest.read_text())
    raw = copy.deepcopy(tiny_raw_config)
    folder = str(tiny_manifest.parent / manifest["model_dir"])
    server = {"source": "path", "path": folder, "backend": "vllm-server", "max_concurrency": 4, "gpus": 2}
    raw["models"]["srv"] = {**raw["models"]["tiny"], **server, **change}
    config = _write_config(tmp_path, raw)
    assert main(["check-config", str(config)]) == 0 and "valid" in capsys.readouterr().out
    previous = tmp_path / "check.json"
    previous.write_text('{"checked": true}\n')
    code, out, err = _check(capsys, config, "srv", "--out", str(previous))
    if named is None:
        assert code == 0 and "data_parallel_size" not in err, err
        return
    assert code == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"procexec check-model: error: {named}"), err
    assert previous.read_text() == '{"checked": true}\n'


def test_an_endpoint_model_has_nothing_to_check_locally(tiny_raw_config, tmp_path, capsys):
    raw = copy.deepcopy(tiny_raw_config)
    raw["models"]["remote"] = {
        **raw["models"]["tiny"],
        "source": "hf",
        "backend": "openai",
        "base_url": "http://127.0.0.1:9/v1",
    }
    code, out, err = _check(capsys, _write_config(tmp_path, raw), "remote", "--json")
    assert code == 0, err
    check = json.loads(out)
    assert check["checked"] is False and check["backend"] == "openai" and "nothing to check locally" in check["note"]


@pytest.mark.vllm
@pytest.mark.smollm2
def test_check_model_on_smollm2(smollm2_manifest, request, capsys):
    config = request.config.rootpath / "config.yaml"
    code, out, err = _check(capsys, config, "smollm2-135m-instruct", "--manifest", str(smollm2_manifest), "--json")
    assert code == 0, err
    check = json.loads(out)
    manifest = json.loads(smollm2_manifest.read_text())
    hf_config = json.loads((smollm2_manifest.parent / manifest["model_dir"] / "config.json").read_text())
    assert check["architecture"] == "LlamaForCausalLM"
    assert check["max_model_len"] == 8192 == check["derived_max_model_len"] == hf_config["max_position_embeddings"]
    assert check["dtype"] == "bfloat16"
    assert check["kv_bytes_per_token"] == _kv_bytes_per_token(hf_config) == 2 * 30 * 3 * 64 * 2
    assert check["sequences_fit"] is None and "gpus: 0" in check["note"]  # the CPU demo model


@pytest.mark.vllm
@pytest.mark.workflow
def test_a_refused_max_model_len_stops_the_workflow_before_inference(tiny_manifest, tmp_path):
    from workflow_runs import LOCAL_RUN, TINY, snakemake, write_yaml

    # the session's tiny Llama as a model folder (source path): staged, not built again
    too_long = {"max_model_len": 8192, "max_context": 8192, "source": "path", "path": str(tiny_manifest.parent / "hf")}
    overlay = write_yaml(tmp_path / "too-long.yaml", {"models": {"tiny-llama": too_long}})
    workdir = tmp_path / "work"
    workdir.mkdir()
    shard = "results/generations/tiny-llama/shards/1-of-1.jsonl.gz"
    proc = snakemake(workdir, *LOCAL_RUN, shard, configfiles=[TINY, overlay])
    assert proc.returncode != 0
    log = (workdir / "logs" / "check_model" / "tiny-llama.log").read_text()
    assert (
        "models.tiny-llama.max_model_len: 8192 is above the 4096 that vLLM derives from config.json "
        "(max_position_embeddings)"
    ) in log
    assert not (workdir / "results" / "generations").exists()  # no infer job ran: no shard, no store
    assert not (workdir / "logs" / "infer").exists()

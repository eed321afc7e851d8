"""``speculative_config`` values checked as vLLM 0.32's ``SpeculativeConfig`` checks them, without vLLM.

The submit host has no vLLM, and a method vLLM does not know would otherwise pass ``check-config`` and fail
only once the GPU job builds its engine.  The names and bounds are vLLM's (``vllm/config/speculative.py``:
the ``SpeculativeMethod`` literal; ``Field(gt=0)`` on ``num_speculative_tokens``, ``ge=1`` on the others);
tests/config/test_serve_args.py holds them to the installed vLLM's.  An integer must be an integer (a float such as
``2.0`` or a string is refused, not coerced): the value keys the store.  ``relation_problems`` adds what the
class's validators refuse of the values together without looking at a model (``__post_init__``,
``_validate_suffix_decoding``, ``_verify_args``; the line numbers are the CPU build's, whose file is the CUDA
wheel's byte for byte): ``prompt_lookup_min: 6, prompt_lookup_max: 2`` passed check-config and failed the job.
"""

from __future__ import annotations

from typing import Any

#: ``pilot_speculative: true``: prompt-lookup drafting as ``benchmarks/bench_speculative.py`` measured it by default
#: (docs/decisions.md): no draft model to stage, and this benchmark's traces repeat their own prompt.
PILOT_NGRAM: dict[str, Any] = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 4,
}

#: vLLM 0.32's ``SpeculativeMethod`` (vllm/config/speculative.py), its nested literals flattened.
SPECULATIVE_METHODS = frozenset(
    {
        "ngram",
        "ngram_gpu",
        "medusa",
        "mlp_speculator",
        "draft_model",
        "suffix",
        "custom_class",
        "eagle",
        "eagle3",
        "extract_hidden_states",
        "dflash",
        "dspark",
        "mtp",
        "deepseek_mtp",
        "dots3_note_mtp",
        "mimo_mtp",
        "mimo_v2_mtp",
        "glm4_moe_mtp",
        "glm4_moe_lite_mtp",
        "glm_ocr_mtp",
        "ernie_mtp",
        "nemotron_h_mtp",
        "exaone_moe_mtp",
        "exaone4_5_mtp",
        "qwen3_next_mtp",
        "qwen4_exp_mtp",
        "qwen3_5_mtp",
        "longcat_flash_mtp",
        "bailing_hybrid_v3_mtp",
        "minimax_m3_mtp",
        "bailing_hybrid_mtp",
        "kimi_k3_mtp",
        "pangu_ultra_moe_mtp",
        "step3p5_mtp",
        "hy_v3_mtp",
        "hy_v4_mtp",
        "gemma4_mtp",
        "inkling_mtp",
        "glm5_next_mtp",
    }
)
#: Integer fields of ``SpeculativeConfig`` and their lower bound (its pydantic ``Field``s).
SPECULATIVE_INT_MINIMUM = {
    "num_speculative_tokens": 1,
    "draft_tensor_parallel_size": 1,
    "max_model_len": 1,
    "prompt_lookup_max": 1,
    "prompt_lookup_min": 1,
    "dspark_draft_topk": 1,
}


def speculative_value_problems(where: str, spec: dict[str, Any]) -> list[str]:
    """``spec``'s method and integer values where vLLM's ``SpeculativeConfig`` would refuse them, each alone
    (``relation_problems``: together)."""
    problems = []
    method = spec.get("method")
    if method is not None and method not in SPECULATIVE_METHODS:
        problems.append(
            f"{where}.method: '{method}' is not a speculative method of vLLM 0.32 "
            "(vllm/config/speculative.py: e.g. ngram, suffix, mtp, eagle3, draft_model)"
        )
    for name, minimum in SPECULATIVE_INT_MINIMUM.items():
        value = spec.get(name)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool):
            problems.append(f"{where}.{name}: {value!r} is not a whole number")
        elif value < minimum:
            problems.append(f"{where}.{name}: {value} must be at least {minimum}")
    return problems


def _whole(spec: dict[str, Any], name: str) -> int | None:
    value = spec.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def relation_problems(where: str, spec: dict[str, Any]) -> list[str]:
    """What ``SpeculativeConfig``'s validators refuse of ``spec``'s values together, the model aside."""
    vllm = "(vLLM's SpeculativeConfig: vllm/config/speculative.py"
    problems = []
    method = spec.get("method") or ("ngram" if spec.get("model") in ("ngram", "[ngram]") else "draft_model")
    if spec.get("tensor_parallel_size") is not None:  # _verify_args, :1813-1817
        problems.append(f"{where}.tensor_parallel_size: set draft_tensor_parallel_size instead {vllm}:1813)")
    if method in ("ngram", "ngram_gpu"):  # __post_init__, :1195-1221 (either bound stands for both when alone)
        low, high = _whole(spec, "prompt_lookup_min"), _whole(spec, "prompt_lookup_max")
        low, high = (high if low is None else low), (low if high is None else high)
        if low is not None and high is not None and low > high:
            problems.append(f"{where}.prompt_lookup_min: {low} exceeds prompt_lookup_max {high} {vllm}:1217)")
        if spec.get("num_speculative_tokens") is None:  # no draft model whose n_predict would say it: :1819-1824
            problems.append(f"{where}.num_speculative_tokens: required with method {method} {vllm}:1819)")
    if method == "suffix":  # _validate_suffix_decoding, :1611-1629
        for name, low, high in (
            ("suffix_decoding_max_tree_depth", 1, None),
            ("suffix_decoding_max_cached_requests", 0, None),
            ("suffix_decoding_max_spec_factor", 0, None),
            ("suffix_decoding_min_token_prob", 0, 1),
        ):
            value = spec.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if value < low or (high is not None and value > high):
                    bound = f"at least {low}" if high is None else f"in [{low}, {high}]"
                    problems.append(f"{where}.{name}: {value} must be {bound} {vllm}:1611)")
    only = {"index_share_for_mtp_iteration": "mtp", "dspark_draft_topk": "dspark"}  # :1575-1578, :1509-1510
    problems += [
        f"{where}.{name}: only for method {owner} {vllm})"
        for name, owner in only.items()
        if spec.get(name) is not None and method != owner
    ]
    if method != "dspark" and spec.get("enable_adaptive_verification") and spec.get("use_local_argmax_reduction"):
        problems.append(  # :1582-1592
            f"{where}.use_local_argmax_reduction: not with enable_adaptive_verification {vllm}:1589)"
        )
    if spec.get("use_heterogeneous_vocab"):  # _verify_args, :1853-1864
        if method != "draft_model":
            problems.append(f"{where}.use_heterogeneous_vocab: only for method draft_model {vllm}:1856)")
        elif spec.get("draft_sample_method", "greedy") != "greedy":
            problems.append(f"{where}.use_heterogeneous_vocab: only with draft_sample_method greedy {vllm}:1861)")
    return problems

"""``speculative_config`` values checked as vLLM 0.32's ``SpeculativeConfig`` checks them, without vLLM.

The submit host has no vLLM, and a method vLLM does not know would otherwise pass ``check-config`` and fail
only once the GPU job builds its engine.  The names and bounds are vLLM's (``vllm/config/speculative.py``:
the ``SpeculativeMethod`` literal; ``Field(gt=0)`` on ``num_speculative_tokens``, ``ge=1`` on the others);
tests/test_serve_args.py holds them to the installed vLLM's.  An integer must be an integer (a float such as
``2.0`` or a string is refused, not coerced): the value keys the store.
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
    """``spec``'s method and integer values where vLLM's ``SpeculativeConfig`` would refuse them."""
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

"""``request_extra``: extra request fields an OpenAI-compatible model is sent, never those the job owns.

The job decides the prompt, the budgets, the sampling it keys (temperature, top_p, seed), the stopping, the
rendering of chat turns and the reply's shape it reads (stream, token ids, logprobs); the repetition guard
is its own field.  A ``request_extra`` value for one of them would override the job's (it is sent last)
while the store key and the record's own fields say otherwise.  Names from vLLM 0.32's completions and chat
request models (``vllm/entrypoints/openai/{completion,chat_completion}/protocol.py``).
"""

from __future__ import annotations

from typing import Any

#: Request fields the job sets or reads: what to say instead.
OWNED_REQUEST_FIELDS = {
    **dict.fromkeys(("model", "prompt", "messages", "prompt_embeds"), "the job sends the rendered prompt"),
    **dict.fromkeys(
        ("max_tokens", "max_completion_tokens", "min_tokens", "ignore_eos"),
        "the job's token budget decides (budget settings)",
    ),
    **dict.fromkeys(("temperature", "top_p", "seed"), "set the top-level sampling setting instead"),
    **dict.fromkeys(("n", "use_beam_search"), "the job asks one sample per request"),
    **dict.fromkeys(("stop", "stop_token_ids", "include_stop_str_in_output"), "the job stops at the model's end"),
    **dict.fromkeys(
        (
            "stream",
            "stream_options",
            "stream_interval",
            "logprobs",
            "top_logprobs",
            "echo",
            "return_token_ids",
            "return_tokens_as_token_ids",
        ),
        "the job reads the reply in this shape",
    ),
    **dict.fromkeys(
        (
            "chat_template",
            "chat_template_kwargs",
            "add_generation_prompt",
            "continue_final_message",
            "add_special_tokens",
            "truncate_prompt_tokens",
            "truncation_side",
        ),
        "the job renders the prompt",
    ),
    "repetition_detection": "set the repetition guard's own setting instead",
}


def request_extra_problems(where: str, request_extra: dict[str, Any]) -> list[str]:
    """A ``request_extra`` field the job owns, named with what decides it instead."""
    return [
        f"{where}.request_extra.{name}: the job owns this request field ({OWNED_REQUEST_FIELDS[name]})"
        for name in sorted(request_extra)
        if name in OWNED_REQUEST_FIELDS
    ]

"""Prompt ids and output text inside a harness's environment, with procexec's own renderer and detokenizer.

The harness environment has no vLLM (``.venv-harness``), so the model's tokenizer is transformers' (vLLM's
``hf`` tokenizer mode: the same class and template); the prompt comes from ``procexec.engine.prompting.
PromptRenderer`` and the text and token offsets from ``procexec.engine.tokenizer.token_offsets``, so a harness sends what
``procexec show-prompt`` shows and scores the text procexec's own runner records.
"""

from __future__ import annotations

import datetime as dt
import functools
from typing import Any

from procexec.benchmark.prompts import chat_messages
from procexec.config.model import TEMPLATE_DATE
from procexec.engine.prompting import PromptRenderer
from procexec.engine.tokenizer import RenderedPrompt, token_offsets
from procexec.errors import ProcexecError
from procexec.records import Example

#: vLLM's logprob tokens under ``return_tokens_as_token_ids``: "token_id:<id>".
TOKEN_ID_PREFIX = "token_id:"


@functools.cache
def hf_tokenizer(model_dir: str) -> Any:
    """The model folder's tokenizer (a fast tokenizer: procexec's detokenizer needs its ``tokenizers`` core)."""
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(model_dir)
    except (OSError, ValueError) as exc:
        raise ProcexecError(
            f"model_dir {model_dir}: cannot load its tokenizer ({str(exc).splitlines()[0][:200]})"
        ) from None
    if not getattr(tokenizer, "is_fast", False):
        raise ProcexecError(
            f"model_dir {model_dir}: no fast tokenizer (tokenizer.json); procexec's harness tasks need one"
        )
    return tokenizer


def render(
    model_dir: str,
    example: Example,
    system_role: bool = True,
    chat_template_kwargs: dict[str, Any] | None = None,
    template_date: dt.date = TEMPLATE_DATE,
    server_renders: bool = False,
) -> RenderedPrompt:
    """The prompt of one example as procexec's runner renders it for this model (``PromptRenderer``): token ids,
    or with ``server_renders`` (a chat route) the turns and their digest, as procexec's own chat route keys it."""
    tokenizer = None if server_renders else hf_tokenizer(model_dir)
    renderer = PromptRenderer(system_role, chat_template_kwargs or {}, tokenizer, template_date)
    return renderer.render(lambda role: chat_messages(example, role))


def ids_of_logprob_tokens(tokens: list[str]) -> list[int] | None:
    """The output token ids vLLM spelled as logprob tokens (``return_tokens_as_token_ids``); None otherwise."""
    ids = [t.removeprefix(TOKEN_ID_PREFIX) for t in tokens if t.startswith(TOKEN_ID_PREFIX)]
    if not tokens or len(ids) != len(tokens) or not all(i.isascii() and i.isdigit() for i in ids):
        return None
    return [int(i) for i in ids]


def spell(model_dir: str, prompt_ids: list[int], output_ids: list[int]) -> tuple[str, list[int]]:
    """(raw text, token offsets) of output ids: vLLM's incremental detokenizer, special tokens skipped."""
    offsets, text = token_offsets(hf_tokenizer(model_dir), prompt_ids, output_ids)
    return text, offsets

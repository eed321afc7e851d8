"""The model's tokenizer as vLLM loads it: prompts rendered as the engine receives them, offsets of output tokens.

Why it looks like this:

* The tokenizer comes from ``vllm.tokenizers.get_tokenizer`` with the model's
  ``tokenizer_mode``, so Mistral, DeepSeek-V3.2 and remote-code tokenizers are
  the very classes the engine uses.
* Prompts are rendered the way vLLM 0.32's chat renderers do
  (``vllm/renderers/{hf,mistral,deepseek_v32}.py``): ``apply_chat_template(...,
  tokenize=True)`` straight to ids.  A Mistral tokenizer never encodes control
  tokens from text, so rendering text and re-encoding it would spell ``<s>[INST]``
  as plain text; asking every tokenizer for ids avoids that class of bug, and the
  prompt's sha256 is taken over exactly the ids the engine receives.
* Chat templates may read the clock (transformers gives them ``strftime_now``;
  gpt-oss prints "Current date").  Rendering runs under a clock pinned to the
  config's ``inference.template_date``, so a prompt, and so its store key, never
  depends on the day a job runs.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import jinja2

from procexec.config.model import ModelBase
from procexec.errors import ProcexecError

Messages = list[dict[str, str]]


def load_tokenizer(model_ref: str, tokenizer_mode: str, trust_remote_code: bool, revision: str | None = None) -> Any:
    """vLLM's tokenizer for the model, loaded without starting an engine."""
    from vllm.tokenizers import get_tokenizer

    try:
        return get_tokenizer(
            model_ref, tokenizer_mode=tokenizer_mode, trust_remote_code=trust_remote_code, revision=revision
        )
    except Exception as exc:  # noqa: BLE001 -- the boundary to transformers/tokenizers: a bad file raises anything
        raise ProcexecError(
            f"cannot load the tokenizer of '{model_ref}' (tokenizer_mode {tokenizer_mode}): {_first_line(exc)}"
        ) from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


def model_tokenizer(model: ModelBase, model_ref: str) -> Any:
    """The tokenizer of a configured model at ``model_ref`` (a folder, or a hub id pinned to its revision)."""
    revision = None if Path(model_ref).is_dir() else model.revision
    return load_tokenizer(model_ref, model.tokenizer_mode, model.trust_remote_code, revision)


def renders_text(tokenizer: Any) -> bool:
    """False for tokenizers whose chat rendering exists only as ids (Mistral's ``mistral_common``)."""
    from vllm.tokenizers.mistral import MistralTokenizer

    return not isinstance(tokenizer, MistralTokenizer)


@contextlib.contextmanager
def pinned_clock(day: dt.date) -> Iterator[None]:
    """Make transformers' ``strftime_now`` template global read ``day`` (noon, local time).

    ``strftime_now`` calls ``datetime.now()`` through the module global of
    ``transformers.utils.chat_template_utils``; compiled templates are cached,
    so that global, not the template, is what can be pinned.
    """
    from transformers.utils import chat_template_utils

    real = chat_template_utils.datetime

    class PinnedDatetime(dt.datetime):
        @classmethod
        def now(cls, tz: dt.tzinfo | None = None) -> Self:
            return cls.combine(day, dt.time(12, 0), tzinfo=tz)

    chat_template_utils.datetime = PinnedDatetime
    try:
        yield
    finally:
        chat_template_utils.datetime = real


@dataclass(frozen=True)
class RenderedPrompt:
    """A prompt as the engine receives it (token ids), or as chat messages for an endpoint's chat route."""

    token_ids: list[int] | None
    sha256: str  # of the token ids (or of the canonical messages + template kwargs on the chat route)
    system_folded: bool
    text: str | None = None  # the template's text when asked for (None when it renders ids only)
    messages: Messages | None = None  # chat route only
    template_kwargs: dict[str, Any] = field(default_factory=dict)

    @property
    def num_tokens(self) -> int | None:
        return None if self.token_ids is None else len(self.token_ids)


def ids_sha256(ids: Sequence[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode("ascii")).hexdigest()


def _template_rejects_system(exc: Exception) -> bool:
    text = str(exc).lower()
    return isinstance(exc, (jinja2.TemplateError, ValueError)) and "system" in text


def choose_messages(
    apply: Callable[[Messages], Any], messages_for: Callable[[bool], Messages], system_role: bool
) -> tuple[Any, Messages, bool]:
    """``apply`` the template to the system + user turns; fold the system text into the user turn if refused.

    Returns (rendered, messages used, folded).  ``system_role: false`` folds without trying.
    """
    if system_role:
        messages = messages_for(True)
        try:
            return apply(messages), messages, False
        except Exception as exc:
            if not _template_rejects_system(exc):
                raise
    messages = messages_for(False)
    return apply(messages), messages, True


def render_prompt(
    tokenizer: Any,
    messages_for: Callable[[bool], Messages],
    system_role: bool,
    chat_template_kwargs: dict[str, Any],
    template_date: dt.date,
    keep_text: bool = False,
) -> RenderedPrompt:
    """Render the chat turns to the token ids the engine receives (``keep_text`` also renders the text)."""
    kwargs = dict(chat_template_kwargs)

    def to_ids(messages: Messages) -> list[int]:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False, **kwargs
        )
        return [int(i) for i in ids]

    try:
        with pinned_clock(template_date):
            ids, messages, folded = choose_messages(to_ids, messages_for, system_role)
            text = None
            if keep_text and renders_text(tokenizer):
                text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)
    except (ValueError, TypeError, KeyError, jinja2.TemplateError) as exc:  # no template, or one that fails
        where = getattr(tokenizer, "name_or_path", None) or "the model"
        raise ProcexecError(f"the chat template of '{where}' cannot render the prompt: {_first_line(exc)}") from None
    return RenderedPrompt(ids, ids_sha256(ids), folded, text=text, template_kwargs=kwargs)


def token_offsets(tokenizer: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> tuple[list[int], str]:
    """Character offset at which each generated token starts, plus the text they spell.

    Mirrors vLLM's own incremental detokenizer (a ``DecodeStream`` primed with
    the prompt, special tokens skipped), so the text matches the engine's.
    A token that completes no character (a partial UTF-8 byte, a skipped
    special token) starts where the next character will.
    """
    from tokenizers import Tokenizer
    from tokenizers.decoders import DecodeStream

    offsets: list[int] = []
    pieces: list[str] = []
    length = 0
    backend = getattr(tokenizer, "_tokenizer", None)
    if isinstance(backend, Tokenizer):  # HF fast tokenizers: what vLLM's detokenizer uses
        stream = DecodeStream(ids=list(prompt_ids), skip_special_tokens=True)
        for token in output_ids:
            offsets.append(length)
            piece = stream.step(backend, token) or ""
            pieces.append(piece)
            length += len(piece)
        return offsets, "".join(pieces)
    from vllm.tokenizers.detokenizer_utils import detokenize_incrementally

    all_ids = list(prompt_ids)
    prev, prefix_offset, read_offset = None, 0, 0
    for token in output_ids:
        all_ids.append(token)
        new_tokens, piece, prefix_offset, read_offset = detokenize_incrementally(
            tokenizer, all_ids, prev, prefix_offset, read_offset, skip_special_tokens=True
        )
        prev = new_tokens if prev is None else prev + new_tokens
        offsets.append(length)
        pieces.append(piece)
        length += len(piece)
    return offsets, "".join(pieces)


def spell_new_tokens(
    tokenizer: Any, prompt_ids: Sequence[int], prefix_ids: Sequence[int], new_ids: Sequence[int]
) -> tuple[str, list[int]]:
    """Text and offsets of ``new_ids`` as one stream from the prompt, after ``prefix_ids``.

    A continuation's engine primes its detokenizer with prompt + prefix, which
    can spell the boundary differently from an uninterrupted generation (vLLM
    even re-emits prompt text after a tail of broken UTF-8).  Detokenising the
    whole output from the prompt gives the text a regeneration would have.
    """
    offsets, spelled = token_offsets(tokenizer, prompt_ids, [*prefix_ids, *new_ids])
    base = offsets[len(prefix_ids)] if new_ids else len(spelled)
    return spelled[base:], [o - base for o in offsets[len(prefix_ids) :]]

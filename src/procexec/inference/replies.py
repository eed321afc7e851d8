"""What an OpenAI-compatible endpoint may answer: one typed model per reply, checked before anything is used.

A reply is read only through these models (pydantic, strict: no number is
taken for a string, no string for a number, ``true`` is not ``1``).  Fields the
benchmark does not use are allowed (providers add their own); fields it uses
must have their type, and token ids and byte values their range.  A reply that
fails its model is a ``MalformedReply``: the backend retries it like a 5xx and
then stops with one line naming the URL and the first bad field -- it never
becomes a record (docs/inference.md, "Endpoint replies").
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from procexec.errors import ProcexecError

M = TypeVar("M", bound="Reply")

Count = Annotated[int, Field(ge=0)]
TokenId = Annotated[int, Field(ge=0, lt=1 << 32)]  # the store keeps token ids as uint32
Byte = Annotated[int, Field(ge=0, le=255)]


class MalformedReply(ProcexecError):
    """A 200 reply whose JSON does not have the shape its route promises."""


class Reply(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class Usage(Reply):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None


class CompletionChoice(Reply):
    text: str | None = None
    token_ids: list[TokenId] | None = None
    finish_reason: str | None = None


class CompletionReply(Reply):
    """``POST /v1/completions``."""

    model: str | None = None
    system_fingerprint: str | None = None
    usage: Usage | None = None
    choices: Annotated[list[CompletionChoice], Field(min_length=1)]


class LogprobToken(Reply):
    token: str | None = None
    bytes: list[Byte] | None = None


class ChatLogprobs(Reply):
    content: list[LogprobToken] | None = None


class ChatMessage(Reply):
    content: str | None = None
    reasoning: Any = None
    reasoning_content: Any = None


class ChatChoice(Reply):
    message: ChatMessage
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatReply(Reply):
    """``POST /v1/chat/completions``."""

    model: str | None = None
    system_fingerprint: str | None = None
    usage: Usage | None = None
    choices: Annotated[list[ChatChoice], Field(min_length=1)]


class ModelCard(Reply):
    id: str
    max_model_len: Annotated[int, Field(ge=1)] | None = None


class ModelList(Reply):
    """``GET /v1/models``."""

    data: list[ModelCard]


def first_problem(exc: ValidationError) -> str:
    """The first field error as one line: ``choices.0.text: Input should be a valid string (got 5)``."""
    error = exc.errors(include_url=False)[0]
    where = ".".join(str(part) for part in error["loc"]) or "the reply"
    return f"{where}: {error['msg']} (got {error.get('input')!r:.60})"


def parse(model: type[M], obj: Any, where: str) -> M:
    """``obj`` as ``model``, or one ``MalformedReply`` line naming ``where`` and the first bad field."""
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise MalformedReply(f"{where}: a malformed reply ({first_problem(exc)})") from None

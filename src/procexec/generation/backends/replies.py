"""What an OpenAI-compatible endpoint may answer: one typed model per reply, checked before anything is used.

A reply is read only through these models (pydantic, strict: no number is
taken for a string, no string for a number, ``true`` is not ``1``).  Fields the
benchmark does not use are allowed (providers add their own); fields it uses
must have their type, and token ids and byte values their range.  A reply that
fails its model is a ``MalformedReply``: the backend retries it like a 5xx and
then stops with one line naming the URL and the first bad field -- it never
becomes a record (docs/generation.md, "Endpoint replies").

A streamed reply (``stream: true``, the default) is read event by event, each
event typed by its chunk model, and put back together by ``Stream`` into the
reply a non-streamed request gets, which is then read by the same model as
ever: one set of checks for both.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from procexec.errors import ProcexecError, first_problem

M = TypeVar("M", bound="Reply")

Count = Annotated[int, Field(ge=0)]
TokenId = Annotated[int, Field(ge=0, lt=1 << 32)]  # the store keeps token ids as uint32
Byte = Annotated[int, Field(ge=0, le=255)]


class MalformedReply(ProcexecError):
    """A 200 reply whose JSON does not have the shape its route promises."""


class Reply(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", frozen=True)


class PromptTokensDetails(Reply):
    """How the prompt was served: ``cached_tokens`` came from the prefix cache (vLLM's ``num_cached_tokens``, sent
    when the server runs with ``--enable-prompt-tokens-details``, as the job's server does)."""

    cached_tokens: Count | None = None


class Usage(Reply):
    prompt_tokens: Count | None = None
    completion_tokens: Count | None = None
    prompt_tokens_details: PromptTokensDetails | None = None


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


class StreamFailed(MalformedReply):
    """A 200 stream that reports an error event or ends before ``data: [DONE]``: retried like a 5xx."""


class Chunk(Reply):
    """One event of a stream; the last one carries ``usage`` (``stream_options.include_usage``)."""

    model: str | None = None
    system_fingerprint: str | None = None
    usage: Usage | None = None
    error: Any = None  # vLLM reports a failure mid-stream as an event {"error": {...}}


class CompletionChunk(Chunk):
    choices: list[CompletionChoice] = []  # each event's new text and token ids


class ChatDelta(ChatMessage):
    """A stream event's piece of the message: the message's own fields, each event's new part."""


class ChatChunkChoice(Reply):
    delta: ChatDelta
    finish_reason: str | None = None
    logprobs: ChatLogprobs | None = None


class ChatChunk(Chunk):
    choices: list[ChatChunkChoice] = []


class Stream:
    """A streamed reply as it arrives: its token ids so far, and at ``data: [DONE]`` the whole reply."""

    def __init__(self, chat: bool, where: str):
        self.chat, self.where = chat, where
        self.head: dict[str, Any] = {}  # model (the first event's), system_fingerprint and usage (the last's)
        self.pieces: list[str] = []
        self.reasoning: list[Any] = []
        self.logprobs: list[dict[str, Any]] | None = None
        self.token_ids: list[int] | None = None
        self.finish_reason: str | None = None
        self.choices = 0  # events that carried a choice
        self.before_finish = 0  # token ids that came before the event that finished the generation
        self.done = False

    def feed(self, line: str) -> None:
        """One line of the event stream; only ``data:`` lines count (blank lines and comments do not)."""
        if not line.startswith("data:"):
            return
        data = line.removeprefix("data:").strip()
        if data == "[DONE]":
            self.done = True
            return
        try:
            obj = json.loads(data)
        except ValueError:
            raise MalformedReply(
                f"{self.where}: a malformed reply (a stream event that is not JSON: {data!r:.60})"
            ) from None
        kind: type[ChatChunk] | type[CompletionChunk] = ChatChunk if self.chat else CompletionChunk
        chunk = parse(kind, obj, self.where)
        if chunk.error is not None:
            raise StreamFailed(f"{self.where}: the stream reported an error ({json.dumps(chunk.error):.200})")
        for name in ("model", "system_fingerprint", "usage"):  # the model as the first event names it
            if getattr(chunk, name) is not None and not (name == "model" and name in self.head):
                self.head[name] = obj[name]
        for choice in chunk.choices:
            self.choices += 1
            if isinstance(choice, ChatChunkChoice):
                self.pieces.append(choice.delta.content or "")
                self.reasoning += [r for r in (choice.delta.reasoning, choice.delta.reasoning_content) if r]
                if choice.logprobs is not None and choice.logprobs.content is not None:
                    if self.logprobs is None:
                        self.logprobs = []
                    self.logprobs.extend(t.model_dump() for t in choice.logprobs.content)  # in place: linear
            else:
                self.pieces.append(choice.text or "")
                if choice.token_ids is not None:
                    if self.token_ids is None:
                        self.token_ids = []
                    self.token_ids.extend(choice.token_ids)  # in place: a copy per event was quadratic
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
            elif self.token_ids is not None:
                self.before_finish = len(self.token_ids)

    def tokens_so_far(self) -> list[int]:
        """Token ids an uninterrupted generation has too: those before the finishing event (its last token
        may be the end-of-sequence one, which a continuation must not take as its prefix)."""
        return list((self.token_ids or [])[: self.before_finish])

    def reply(self) -> dict[str, Any]:
        """The reply a non-streamed request gets (read by ``CompletionReply`` or ``ChatReply``)."""
        if not self.done:
            raise StreamFailed(f"{self.where}: the stream ended before data: [DONE]")
        text = "".join(self.pieces)
        if self.chat:
            choice: dict[str, Any] = {
                "message": {"content": text, "reasoning": self.reasoning or None},
                "logprobs": None if self.logprobs is None else {"content": self.logprobs},
            }
        else:
            choice = {"text": text, "token_ids": self.token_ids}
        choice["finish_reason"] = self.finish_reason
        return {**self.head, "choices": [choice] if self.choices else []}


class ModelCard(Reply):
    id: str
    max_model_len: Annotated[int, Field(ge=1)] | None = None


class ModelList(Reply):
    """``GET /v1/models``."""

    data: list[ModelCard]


def parse(model: type[M], obj: Any, where: str) -> M:
    """``obj`` as ``model``, or one ``MalformedReply`` line naming ``where`` and the first bad field."""
    try:
        return model.model_validate(obj)
    except ValidationError as exc:
        raise MalformedReply(f"{where}: a malformed reply ({first_problem(exc, whole='the reply')})") from None

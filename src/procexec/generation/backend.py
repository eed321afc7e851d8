"""The one interface between an inference job and whatever produces tokens.

A job (``procexec.generation.job``) plans generations, keys them, keeps the
store and applies the truncation rule; a backend only renders prompts and runs
requests.  The implementations live in ``procexec.generation.backends`` behind a
lazy registry (the in-process vLLM engine, an OpenAI-compatible endpoint).
Tests drive the job with a small in-test backend, without vLLM.

Building a backend is cheap and touches nothing; ``open`` does the I/O (the
device and its preflight, the engine settings, the tokenizer, an endpoint's
model list), so the job's own checks all run before it.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from procexec.engine.tokenizer import Messages, RenderedPrompt


@dataclass(frozen=True)
class Sampling:
    """Decoding settings shared by every request of a job (spec section 4: greedy)."""

    temperature: float
    top_p: float
    seed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}


@dataclass(frozen=True)
class BackendSpec:
    """What a backend is built from: the model's prepared config entry, where its files are, the prompts' date."""

    model: dict[str, Any]
    model_ref: str  # the staged folder, or the hub id (pinned by the entry's revision)
    manifest: dict[str, Any]  # prepare-model's manifest ({} without one)
    template_date: dt.date


@dataclass
class Request:
    """One generation to run; ``tag`` comes back with its completion.

    ``prompt`` is what the engine receives.  ``prefix_ids`` are output tokens
    the model already produced for this prompt (a continuation): they follow the
    prompt, and the completion holds only what comes after them.
    ``resumed_ids`` are this same generation's tokens saved when an interrupt cut
    it short (a partial record): they follow the prefix, ``max_tokens`` is what is
    left of the budget, and the completion holds them and what follows (text,
    ids, offsets and count), as if the generation had never been interrupted.
    """

    tag: Any
    prompt: RenderedPrompt
    max_tokens: int
    prefix_ids: list[int] = field(default_factory=list)
    # vLLM's SamplingParams.repetition_detection fields (max_pattern_size, min_pattern_size, min_count):
    # the request finishes with reason "repetition" once its tail repeats (inference.rerun_repetition_guard).
    repetition_detection: dict[str, int] | None = None
    resumed_ids: list[int] = field(default_factory=list)


@dataclass
class Completion:
    """What a backend returns for one request."""

    tag: Any
    text: str
    token_ids: list[int] | None  # None when the backend cannot say (an endpoint without token ids)
    token_offsets: list[int] | None  # character offset of each token in ``text``; None: positions in characters
    finish_reason: str  # "stop" | "length" | "abort" | "repetition" (vLLM repetition detection)
    num_generated_tokens: int
    wall_time_s: float
    details: dict[str, Any] = field(default_factory=dict)  # per-request facts for provenance (cached tokens, usage...)
    # Work the backend keeps out of its engine loop (computing token offsets): the job runs it in the
    # store's writer thread, before the record is built.
    finalize: Callable[[Completion], None] | None = None


class Backend(Protocol):
    """What a job needs from an inference engine."""

    #: True when a request may carry ``prefix_ids`` (continuing a truncated generation).
    supports_continuation: bool

    def open(self) -> None:
        """Check the device and engine settings and load the tokenizer (or reach the endpoint): no weights yet."""

    def identity(self) -> dict[str, Any]:
        """What decides the output besides prompt and sampling (model, weights, engine): in every store key."""

    def max_model_len(self) -> int:
        """Prompt + generated tokens the engine holds at most (the budget is clamped to it)."""

    def render(self, messages_for: Callable[[bool], Messages]) -> RenderedPrompt:
        """The prompt for one example (``messages_for(system_role)`` builds its chat turns)."""

    def generate(self, requests: Sequence[Request], sampling: Sampling,
                 on_finished: Callable[[Completion], None]) -> None:
        """Run ``requests``, handing each completion to ``on_finished`` as soon as it is done."""

    def unfinished(self) -> list[tuple[Any, list[int]]]:
        """After ``generate`` was interrupted (a ``KeyboardInterrupt``, SIGTERM included): ``(tag, token ids so
        far)`` of each request it had started and not finished, resumed ids included, every id one that an
        uninterrupted run produces too.  Optional: a backend without it keeps nothing across an interrupt."""

    def provenance(self) -> dict[str, Any]:
        """Versions, engine settings, host: recorded with every record, never part of a key."""

    def close(self) -> None:
        """Release the engine or connections (idempotent)."""


"""The one interface between a generation job and whatever produces tokens.

A job (``procexec.generation.job``) plans generations, keys them, keeps the
store and applies the truncation rule; a backend only renders prompts and runs
requests.  ``Backend`` is the whole interface, as an abstract base class: what
every backend must say is abstract, what a backend may have nothing to say
about has a default (``open``, ``finish``, ``unfinished``, ``engine_stats``,
``close``).  The implementations live in ``procexec.generation.backends``
behind a lazy registry (the in-process vLLM engine, an OpenAI-compatible
endpoint, the job's own vLLM server); tests drive the job with subclasses that
need no vLLM (``tests/fake_backend.py``).  docs/backends.md says how to add one.

Building a backend is cheap and touches nothing; ``open`` does the I/O (the
device and its preflight, the engine settings, the tokenizer, an endpoint's
model list), so the job's own checks all run before it.
"""

from __future__ import annotations

import abc
import datetime as dt
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from procexec.config.model import ModelBase
from procexec.engine.tokenizer import Messages, RenderedPrompt
from procexec.generation.engine_stats import EngineStats


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

    model: ModelBase
    model_ref: str  # the staged folder, or the hub id (pinned by the entry's revision)
    manifest: dict[str, Any]  # prepare-model's manifest ({} without one)
    template_date: dt.date
    cache_dir: str | None = None  # cluster.cache_dir: where a job engine's compile caches are shared
    # A job server's limits (JobSettings): its start's ceiling, the job's stall limit (vLLM's step timeout follows
    # it), the context its admission is sized for (None: max_concurrency alone)
    start_ceiling_s: float | None = None
    stall_timeout_s: float | None = None
    admission_context: float | None = None


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

    @property
    def prompt_ids(self) -> list[int]:
        """The rendered prompt's token ids (a route that sends token ids rendered the prompt here)."""
        assert self.prompt.token_ids is not None, "a prompt the server renders has no token ids"
        return self.prompt.token_ids

    def engine_ids(self) -> list[int]:
        """What the engine is sent: the prompt's ids, then the prefix (a continuation), then the resumed ids."""
        return [*self.prompt_ids, *self.prefix_ids, *self.resumed_ids]


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


#: What a backend hands each completion to: the job's callback, which returns the requests that follow from it.
OnFinished = Callable[[Completion], Sequence[Request]]


class Backend(abc.ABC):
    """What a job needs from whatever makes its tokens (an engine in the job, a server, an endpoint).

    ``create_backend`` calls ``open``; the job then calls, in order: ``identity`` and ``max_model_len``
    (store keys and budgets), ``render`` for every example, ``generate`` for each submission (``finish``
    for each completion it hands over), ``unfinished`` after an interrupt, then ``engine_stats`` and
    ``close`` at the end; ``provenance`` goes into every record.
    """

    #: True when a request may carry ``prefix_ids`` (continuing a truncated generation); without it the
    #: job regenerates a truncated generation instead.
    supports_continuation: bool = False
    #: True when ``finish`` does work worth keeping off the engine loop: the job then runs it, and the
    #: record's checks, on the store's writer thread; otherwise at once, in ``on_finished``.
    finish_off_loop: bool = False

    def open(self) -> None:
        """Check the device and engine settings and load the tokenizer (or reach the endpoint): no weights yet."""

    @abc.abstractmethod
    def identity(self) -> dict[str, Any]:
        """What decides the output besides prompt and sampling (model, weights, engine): in every store key.

        Any change of a value here changes every key, so every generation is made again: put in what
        changes the tokens, nothing that does not (versions and hosts go in ``provenance``)."""

    @abc.abstractmethod
    def max_model_len(self) -> int:
        """Prompt + generated tokens the engine holds at most (the budget is clamped to it)."""

    @abc.abstractmethod
    def render(self, messages_for: Callable[[bool], Messages]) -> RenderedPrompt:
        """The prompt for one example (``messages_for(system_role)`` builds its chat turns)."""

    @abc.abstractmethod
    def generate(self, requests: Sequence[Request], sampling: Sampling, on_finished: OnFinished) -> None:
        """Run ``requests``, handing each completion to ``on_finished`` as soon as it is done.

        ``on_finished`` returns the requests that follow from that completion (the continuation of a
        truncated attempt 1): they run in this same call, sent before any request not yet sent, so a
        continuation starts while its prompt and attempt-1 blocks are still in the engine's prefix cache
        instead of after the whole shard's attempt 1 (docs/generation.md, "Budgets and the truncation rule").
        """

    def request_sampling(self, request: Request, sampling: Sampling) -> dict[str, Any]:
        """The sampling parameters ``request`` is sent with: the backend builds its request from them and the
        job the record's ``sampling``, so a record states what went out, not what the config meant."""
        params = {**sampling.to_json(), "max_tokens": request.max_tokens}
        if request.repetition_detection is not None:
            params["repetition_detection"] = dict(request.repetition_detection)
        return params

    def vocabulary(self) -> int | None:
        """How many token ids the model's tokenizer has (0 .. n-1): a stored id outside them is refused before
        it is sent (vLLM would fail the request).  Default: not known, nothing is checked."""
        return None

    def start(self) -> None:
        """Load the engine or start the server the job's requests need, before they are timed (a shard's
        decode rate counts generating only).  Default: nothing to start (a remote endpoint)."""

    def finish(self, request: Request, completion: Completion) -> None:
        """Complete what ``generate`` left out of ``completion`` for ``request`` to keep its loop fast (the
        in-process engine's token offsets, which need detokenising); the job calls it before it builds the
        record, on the store's writer thread when ``finish_off_loop``."""

    def unfinished(self) -> list[tuple[Any, list[int]]]:
        """After ``generate`` was interrupted (a ``KeyboardInterrupt``, SIGTERM included): ``(tag, token ids so
        far)`` of each request it had started and not finished, resumed ids included, every id one that an
        uninterrupted run produces too.  Default: none (nothing is kept across an interrupt)."""
        return []

    def progress(self) -> Hashable | None:
        """A value that moves while the engine works on this job's requests (the job's watchdog,
        ``procexec.generation.watchdog``, stops a job whose engine's value stays put for
        ``inference.stall_timeout_s``); None when nothing is to be watched now.  Default: None (not watched)."""
        return None

    def engine_stats(self) -> EngineStats:
        """This run's engine figures besides the decode rate (added to the shard's statistics at the end): how it
        started, its speculative decoding and preemption counters, its KV pool.  Default: none (no engine of
        the job's own, or no way to read them)."""
        return EngineStats()

    @abc.abstractmethod
    def provenance(self) -> dict[str, Any]:
        """Versions, engine settings, host: recorded with every record, never part of a key."""

    def close(self) -> None:
        """Release the engine or connections (idempotent)."""
